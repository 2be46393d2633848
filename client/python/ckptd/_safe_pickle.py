"""The restricted unpickler ckptd.load decodes bytes items with.

A DCP bytes item (optimizer param_groups, LR scheduler state, data-loader
state, any non-tensor value) is `torch.save(obj)` into a BytesIO. Unpickling
it with the full pickle machinery (torch.load(weights_only=False), what stock
DCP does) imports and calls whatever globals the pickle names: a checkpoint
from elsewhere can run code on load. ckptd.load(weights_only=True), the
default, unpickles through RestrictedUnpickler instead: every GLOBAL /
STACK_GLOBAL / INST / EXT reference goes through find_class, which refuses
(before importing anything) every global that is not in the allowlist below,
raising ckptd.UnsafeCheckpointError naming it. REDUCE / NEWOBJ / BUILD can
then only call or build allowlisted objects.

The allowlist (README "Security model"; the C++ twin, for ckptctl verify, is
IsAllowedPickleGlobal in format/checkpoint/verify.cc):
  * torch 1.13's weights_only allowlist (torch._weights_only_unpickler):
    collections.OrderedDict, torch.nn.parameter.Parameter,
    torch.serialization._get_layout, torch.Size, torch.Tensor, the legacy
    tensor and storage classes (torch.FloatTensor, torch.FloatStorage, ...),
    torch._utils._rebuild_parameter / _rebuild_tensor / _rebuild_tensor_v2 /
    _rebuild_sparse_tensor / _rebuild_meta_tensor_no_storage /
    _rebuild_sparse_csr_tensor;
  * what torch 2.x writes for tensors: torch._utils._rebuild_tensor_v3,
    _rebuild_parameter_with_state, _rebuild_wrapper_subclass,
    _rebuild_device_tensor_from_numpy, _rebuild_qtensor,
    _rebuild_nested_tensor, torch._tensor._rebuild_from_type(_v2),
    torch.storage.UntypedStorage / TypedStorage, torch.device;
  * every torch dtype, layout, memory format and qscheme constant
    (torch.float32, torch.bool, torch.strided, torch.contiguous_format, ...:
    values, not callables; torch 1.13's list lacks bool, uint8, bfloat16);
  * plain values that optimizer, scheduler and data-loader state hold:
    builtins set, frozenset, complex, slice, range, bytes, bytearray, list,
    dict, tuple, int, float, str, bool; _codecs.encode (how protocol 2
    pickles bytes); collections.defaultdict, collections.Counter;
  * numpy arrays, scalars and RNG state (data-loader state often holds
    np.random.get_state() or a Generator): numpy(.core|._core).multiarray.
    _reconstruct and .scalar, numpy.ndarray, numpy.dtype, the
    numpy.dtypes.*DType classes, numpy.random._pickle.__randomstate_ctor /
    __generator_ctor / __bit_generator_ctor.
Nothing in it imports a module of the pickle's choosing, evaluates text, or
reaches attributes by name (no getattr, no copyreg._reconstructor, no
functools.partial): a pickle can only build values. It does not bound
memory (a pickle can still ask for a huge bytearray).
"""
import _compat_pickle
import io
import pickle

from .errors import UnsafeCheckpointError

_BUILTINS = ("set", "frozenset", "complex", "slice", "range", "bytes", "bytearray", "list",
             "dict", "tuple", "int", "float", "str", "bool")

SAFE_GLOBALS = frozenset(
    # torch 1.13 weights_only
    ["collections.OrderedDict", "torch.nn.parameter.Parameter", "torch.serialization._get_layout",
     "torch.Size", "torch.Tensor"]
    + [f"torch._utils.{f}" for f in (
        "_rebuild_parameter", "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_sparse_tensor",
        "_rebuild_meta_tensor_no_storage", "_rebuild_sparse_csr_tensor",
        # torch 2.x
        "_rebuild_tensor_v3", "_rebuild_parameter_with_state", "_rebuild_wrapper_subclass",
        "_rebuild_device_tensor_from_numpy", "_rebuild_qtensor", "_rebuild_nested_tensor")]
    + ["torch._tensor._rebuild_from_type", "torch._tensor._rebuild_from_type_v2",
       "torch.storage.UntypedStorage", "torch.storage.TypedStorage", "torch.UntypedStorage",
       "torch.TypedStorage", "torch.device"]
    # plain values
    + [f"builtins.{b}" for b in _BUILTINS]
    + ["_codecs.encode", "collections.defaultdict", "collections.Counter"]
    # numpy
    + [f"{m}.{n}" for m in ("numpy.core.multiarray", "numpy._core.multiarray")
       for n in ("_reconstruct", "scalar")]
    + ["numpy.ndarray", "numpy.dtype"]
    + [f"numpy.random._pickle.{n}" for n in (
        "__randomstate_ctor", "__generator_ctor", "__bit_generator_ctor")])

# Globals of module torch that are allowed by what they are: the dtype,
# layout, memory-format and qscheme constants, and the legacy tensor and
# storage classes.
_TORCH_CONSTANT_TYPES = ("dtype", "layout", "memory_format", "qscheme")


def _torch_global_allowed(name):
    import torch
    if not name.isidentifier() or name.startswith("_"):
        return False
    value = torch.__dict__.get(name)  # no import side effects
    if value is None:
        return False
    if any(isinstance(value, getattr(torch, t)) for t in _TORCH_CONSTANT_TYPES
           if hasattr(torch, t)):
        return True
    classes = set(getattr(torch, "_tensor_classes", ())) | set(getattr(torch, "_storage_classes",
                                                                        ()))
    return value in classes


def _numpy_dtype_class_allowed(module, name):
    # numpy >= 1.25 pickles dtypes through their classes (numpy.dtypes.Float32DType).
    if module != "numpy.dtypes" or not name.endswith("DType") or not name.isidentifier():
        return False
    try:
        import numpy
        cls = getattr(numpy.dtypes, name, None)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, numpy.dtype)


def is_allowed(module, name):
    """True if the global module.name may be loaded by the restricted
    unpickler. Imports nothing that is not allowed."""
    if not isinstance(module, str) or not isinstance(name, str):
        return False
    if f"{module}.{name}" in SAFE_GLOBALS:
        return True
    if module == "torch":
        return _torch_global_allowed(name)
    return _numpy_dtype_class_allowed(module, name)


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class admits only the allowlist.
    `fqn` names the item in errors."""

    fqn = None

    def find_class(self, module, name):
        # Python 2 names (__builtin__.set, copy_reg) mapped as the base class
        # maps them for protocols < 3, then checked and passed on mapped.
        if isinstance(module, str) and isinstance(name, str):
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        if not is_allowed(module, name):
            where = f" in bytes item '{self.fqn}'" if self.fqn else ""
            raise UnsafeCheckpointError(
                f"refusing to load the global {module}.{name}{where}: it is not in ckptd's "
                "allowlist of globals a checkpoint may reference (tensors, containers, "
                "numbers, strings, numpy values), so unpickling it could run code. Pass "
                "weights_only=False to ckptd.load only if you trust this checkpoint.",
                global_name=f"{module}.{name}", fqn=self.fqn)
        return super().find_class(module, name)


# torch.load(pickle_module=...) takes a module-like object with Unpickler and
# load; torch subclasses Unpickler (its find_class maps storage names first,
# then calls ours) and sets persistent_load.
class _PickleModule:
    __name__ = "ckptd._safe_pickle"

    def __init__(self, fqn):
        outer_fqn = fqn

        class Unpickler(RestrictedUnpickler):
            fqn = outer_fqn

        self.Unpickler = Unpickler

    def load(self, file, **kwargs):
        return self.Unpickler(file, **kwargs).load()

    def loads(self, data, **kwargs):
        return self.load(io.BytesIO(data), **kwargs)


def torch_load_restricted(raw, fqn=None):
    """torch.load of `raw` (a bytes item) through the restricted unpickler,
    onto the CPU. Calls torch.serialization's archive loader directly:
    torch.load itself ignores pickle_module when weights_only is False in
    torch 1.13, and dispatches TorchScript archives to torch.jit.load."""
    import torch.serialization as ts
    module = _PickleModule(fqn)
    f = io.BytesIO(raw)
    if ts._is_zipfile(f):
        with ts._open_zipfile_reader(f) as zf:
            return ts._load(zf, "cpu", module, encoding="utf-8")
    f.seek(0)
    return ts._legacy_load(f, "cpu", module, encoding="utf-8")
