"""The GPU path of a save: CUDA tensors handed to the daemon through legacy
CUDA IPC handles instead of being copied to host memory by the trainer.

For every CUDA tensor chunk the client finds the allocation that holds it
(cuMemGetAddressRange: for PyTorch's caching allocator the cudaMalloc'ed
segment) and its legacy IPC handle (cuIpcGetMemHandle), and sends
{handle, PCI bus id of the GPU, offset of the chunk in the allocation,
allocation size} (ckptd_cuda_source). The daemon opens the handle, copies
the bytes into its pinned staging pool on its own CUDA streams, closes the
handle and only then replies "staged".

Why the driver API through ctypes and not torch's Storage._share_cuda_():
_share_cuda_ registers producer-side reference counting (a ref-counter file
and an event the consumer is expected to release through torch's own IPC
machinery); a daemon that is not a torch process never releases them, so
the block would stay in limbo in the caching allocator. The driver calls
below have no such side effect: the handle only names the allocation.

What cannot go this way (and takes the client's D2H path instead, the
reason logged once): allocations that legacy IPC cannot share —
expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True),
cudaMallocAsync pools (backend:cudaMallocAsync), cuMemCreate/VMM memory —
which cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) reports as 0; any
driver error; a daemon without a CUDA IPC path (its info's cuda_ipc false,
cuda_unavailable saying why), or one that does not list the tensor's GPU
in cuda_devices (another node, or a GPU hidden from it); a client library
older than C API version 4; CKPTD_CUDA_IPC=0 in the environment.

The pure parts (decisions, offset arithmetic, the per-save handle cache)
take the driver as an argument so that tests run them without a GPU.
"""
import ctypes
import logging
import os
import threading

log = logging.getLogger("ckptd")

CUDA_SUCCESS = 0
CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
IPC_HANDLE_SIZE = 64
PCI_BUS_ID_LEN = 32

ENV_SWITCH = "CKPTD_CUDA_IPC"
ALLOCATOR_HINT = ("the allocation is not shareable through legacy CUDA IPC (PyTorch's "
                  "expandable segments — PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True —, "
                  "the cudaMallocAsync backend or cuMemCreate/VMM memory): CUDA tensors are "
                  "copied to host memory by the client instead; unset expandable_segments "
                  "for the daemon's GPU path")


class CudaError(Exception):
    """A failed driver call (turned into the host-path fallback)."""


# -- decisions (pure) ---------------------------------------------------------

def env_allows_ipc(environ=None):
    """False when CKPTD_CUDA_IPC is set to 0/false/off/no (forces the
    client's host path); anything else (unset, 1, auto) allows IPC."""
    v = (environ if environ is not None else os.environ).get(ENV_SWITCH, "")
    return v.strip().lower() not in ("0", "false", "off", "no")


def ipc_unavailable_reason(lib_version, info, environ=None, min_version=4):
    """Why this save cannot use CUDA IPC at all, or None if it can (subject
    to the per-GPU and per-allocation checks). `info`: the daemon's info
    dict (_native.parse_info)."""
    if not env_allows_ipc(environ):
        return f"{ENV_SWITCH}={(environ or os.environ).get(ENV_SWITCH)} forces the host path"
    if lib_version < min_version:
        return (f"libckptd_client.so has C API version {lib_version}; CUDA IPC needs "
                f"{min_version} (rebuild the library)")
    if not info.get("cuda_ipc"):
        why = info.get("cuda_unavailable") or "no reason given"
        return f"the daemon has no CUDA IPC path: {why}"
    return None


def normalize_pci(bus_id):
    """A canonical form of a PCI bus id ("0000:3B:00.0", "00000000:3b:00.0"
    -> "0000:3b:00.0") for comparisons; the input lower-cased if it does
    not parse."""
    s = str(bus_id).strip().lower()
    try:
        head, fn = s.rsplit(".", 1)
        parts = head.split(":")
        if len(parts) == 2:
            parts = ["0"] + parts
        dom, bus, dev = (int(p, 16) for p in parts)
        return f"{dom:04x}:{bus:02x}:{dev:02x}.{int(fn, 16):x}"
    except ValueError:
        return s


def device_reason(pci, info):
    """None if the daemon can open handles of the GPU at `pci`, else why."""
    listed = [normalize_pci(d) for d in info.get("cuda_devices") or []]
    if normalize_pci(pci) in listed:
        return None
    return (f"the daemon cannot open handles of GPU {pci} (it lists "
            f"{info.get('cuda_devices') or 'no GPU'}): another node, or a GPU hidden from it")


def chunk_offset(ptr, base, size, nbytes):
    """Offset of a chunk of `nbytes` at device address `ptr` in the
    allocation [base, base + size); ValueError if it does not lie inside."""
    if ptr < base or nbytes < 0 or ptr + nbytes > base + size:
        raise ValueError(f"chunk [{ptr:#x}, +{nbytes}) is outside its allocation "
                         f"[{base:#x}, +{size})")
    return ptr - base


# margin kept free when device_snapshot clones tensors on the GPU
SNAPSHOT_MIN_MARGIN = 512 << 20
SNAPSHOT_MARGIN_FRACTION = 0.05


def snapshot_fits(free_bytes, need_bytes, min_margin=SNAPSHOT_MIN_MARGIN,
                  fraction=SNAPSHOT_MARGIN_FRACTION):
    """(fits, reason): whether clones of `need_bytes` fit in `free_bytes` of
    GPU memory with a margin of max(min_margin, fraction * need_bytes)."""
    margin = max(int(min_margin), int(need_bytes * fraction))
    if need_bytes + margin <= free_bytes:
        return True, None
    return False, (f"device_snapshot needs {need_bytes} bytes plus a {margin}-byte margin "
                   f"but the GPU has {free_bytes} bytes free")


# -- the handle cache (pure given a driver) ----------------------------------

class Allocation:
    """One shared allocation of a save: its handle and where it lies."""
    __slots__ = ("base", "size", "handle", "pci")

    def __init__(self, base, size, handle, pci):
        self.base, self.size, self.handle, self.pci = base, size, handle, pci


class HandleCache:
    """Per-save cache of IPC descriptions, keyed by (device, allocation
    base): tensors sharing storage, or living in one caching-allocator
    segment, share one handle (one cuIpcGetMemHandle, one open in the
    daemon). `driver` has is_ipc_capable(ptr), address_range(ptr) ->
    (base, size), ipc_handle(ptr) -> 64 bytes, pci_bus_id(ordinal) -> str;
    each raises CudaError."""

    def __init__(self, driver):
        self.driver = driver
        self._by_device = {}   # device ordinal -> [Allocation]
        self._pci = {}         # device ordinal -> PCI bus id

    def allocations(self):
        return [a for allocs in self._by_device.values() for a in allocs]

    def pci(self, device):
        if device not in self._pci:
            self._pci[device] = self.driver.pci_bus_id(device)
        return self._pci[device]

    def lookup(self, device, ptr, nbytes):
        """(Allocation, offset) of the chunk [ptr, ptr + nbytes) on GPU
        `device`. Raises CudaError (driver failure) or NotShareable."""
        for a in self._by_device.get(device, ()):
            if a.base <= ptr < a.base + a.size:
                return a, chunk_offset(ptr, a.base, a.size, nbytes)
        if not self.driver.is_ipc_capable(ptr):
            raise NotShareable(ALLOCATOR_HINT)
        base, size = self.driver.address_range(ptr)
        off = chunk_offset(ptr, base, size, nbytes)
        a = Allocation(base, size, self.driver.ipc_handle(base), self.pci(device))
        self._by_device.setdefault(device, []).append(a)
        return a, off


class NotShareable(Exception):
    """The allocation cannot be shared through legacy IPC."""


def make_source(native, alloc, offset):
    """A _native.CudaSource for a chunk at `offset` of `alloc`."""
    src = native.CudaSource()
    ctypes.memmove(src.ipc_handle, bytes(alloc.handle), IPC_HANDLE_SIZE)
    src.device = alloc.pci.encode()[:PCI_BUS_ID_LEN - 1]
    src.offset = offset
    src.allocation_size = alloc.size
    return src


# -- the driver (ctypes on libcuda.so.1) --------------------------------------

class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


class Driver:
    """The few driver entry points the GPU path needs, on libcuda.so.1 (the
    library torch itself has loaded). Calls need a current context: use
    within `context(device)`."""

    def __init__(self, libname="libcuda.so.1"):
        self.lib = ctypes.CDLL(libname)
        L, u64, vp = self.lib, ctypes.c_uint64, ctypes.c_void_p
        P = ctypes.POINTER
        sig = {
            "cuGetErrorString": [ctypes.c_int, P(ctypes.c_char_p)],
            "cuPointerGetAttribute": [vp, ctypes.c_int, u64],
            "cuMemGetAddressRange_v2": [P(u64), P(ctypes.c_size_t), u64],
            "cuIpcGetMemHandle": [P(_IpcHandle), u64],
            "cuDeviceGet": [P(ctypes.c_int), ctypes.c_int],
            "cuDeviceGetPCIBusId": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
            "cuCtxGetCurrent": [P(vp)],
            "cuDevicePrimaryCtxRetain": [P(vp), ctypes.c_int],
            "cuDevicePrimaryCtxRelease_v2": [ctypes.c_int],
            "cuCtxPushCurrent_v2": [vp],
            "cuCtxPopCurrent_v2": [P(vp)],
        }
        for name, args in sig.items():
            fn = getattr(L, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int

    def _check(self, rc, what):
        if rc != CUDA_SUCCESS:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise CudaError(f"{what} failed: CUresult {rc} "
                            f"({msg.value.decode() if msg.value else 'unknown'})")

    def is_ipc_capable(self, ptr):
        v = ctypes.c_int(0)  # the driver writes a bool (1 byte): zero-initialised
        self._check(self.lib.cuPointerGetAttribute(
            ctypes.byref(v), CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr),
            "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)")
        return (v.value & 0xFF) != 0

    def address_range(self, ptr):
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        self._check(self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                     ptr), "cuMemGetAddressRange")
        return base.value, size.value

    def ipc_handle(self, ptr):
        h = _IpcHandle()
        self._check(self.lib.cuIpcGetMemHandle(ctypes.byref(h), ptr), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), IPC_HANDLE_SIZE)

    def pci_bus_id(self, ordinal):
        dev = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), int(ordinal)), "cuDeviceGet")
        buf = ctypes.create_string_buffer(PCI_BUS_ID_LEN)
        self._check(self.lib.cuDeviceGetPCIBusId(buf, PCI_BUS_ID_LEN, dev),
                    "cuDeviceGetPCIBusId")
        return buf.value.decode()

    def context(self, ordinal):
        """A context manager making GPU `ordinal`'s primary context current
        (torch's: it uses the primary context) for the driver calls."""
        return _PrimaryContext(self, ordinal)


class _PrimaryContext:
    def __init__(self, driver, ordinal):
        self.d, self.ordinal, self.pushed = driver, int(ordinal), None

    def __enter__(self):
        import torch
        # torch's device guard makes the primary context of `ordinal`
        # current on this thread (cudaSetDevice); the explicit retain/push
        # below covers a thread where that did not happen yet.
        self._guard = torch.cuda.device(self.ordinal)
        self._guard.__enter__()
        self.dev = None
        try:
            lib = self.d.lib
            dev = ctypes.c_int(0)
            self.d._check(lib.cuDeviceGet(ctypes.byref(dev), self.ordinal), "cuDeviceGet")
            ctx = ctypes.c_void_p()
            self.d._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                          "cuDevicePrimaryCtxRetain")
            self.dev = dev
            cur = ctypes.c_void_p()
            self.d._check(lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
            if cur.value != ctx.value:
                self.d._check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
                self.pushed = ctx
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        lib = self.d.lib
        try:
            if self.pushed is not None:
                popped = ctypes.c_void_p()
                lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
                self.pushed = None
            if self.dev is not None:
                lib.cuDevicePrimaryCtxRelease_v2(self.dev)
                self.dev = None
        finally:
            self._guard.__exit__(None, None, None)
        return False


_driver = None
_driver_error = None
_driver_lock = threading.Lock()


def driver():
    """The process's Driver, or raises CudaError with why it cannot load."""
    global _driver, _driver_error
    with _driver_lock:
        if _driver is None and _driver_error is None:
            try:
                _driver = Driver()
            except (OSError, AttributeError) as e:
                _driver_error = f"cannot use libcuda.so.1 through ctypes: {e}"
        if _driver is None:
            raise CudaError(_driver_error)
        return _driver


# -- logging once ---------------------------------------------------------------

_logged = set()
_logged_lock = threading.Lock()


def log_fallback_once(reason):
    """Logs (warning) why CUDA tensors took the host path, once per reason."""
    with _logged_lock:
        if reason in _logged:
            return False
        _logged.add(reason)
    log.warning("ckptd: CUDA tensors are copied to host memory by the client (no CUDA IPC "
                "handoff to the daemon): %s", reason)
    return True


# -- one save's IPC description --------------------------------------------------

class SavePlan:
    """The CUDA side of one save: decides per CUDA chunk whether it goes
    through IPC, describes it, and remembers what must stay alive until the
    rank is staged (contiguous copies on the device) and which devices'
    streams to synchronize before the save call.

    usable: whether IPC is possible at all for this save (see reason).
    Per chunk: describe(t, fqn) -> (tensor to describe, CudaSource) or
    None (take the host path; the reason is logged once)."""

    def __init__(self, native, lib_version, info, environ=None, driver_factory=None):
        self.native = native
        self.info = info
        self.reason = ipc_unavailable_reason(lib_version, info, environ,
                                             native.CUDA_API_VERSION)
        self._driver_factory = driver_factory or driver
        self._cache = None
        self._device_ok = {}    # ordinal -> None or reason
        self.devices = set()    # ordinals with IPC items (streams to synchronize)
        self.keep = []          # device tensors that must outlive the save call
        self.ipc_items = 0
        self.ipc_bytes = 0
        self.host_items = 0     # non-empty CUDA chunks that took the host path
        self.fallback_reasons = []

    @property
    def usable(self):
        return self.reason is None

    def _fallback(self, reason):
        self.host_items += 1
        if reason not in self.fallback_reasons:
            self.fallback_reasons.append(reason)
        log_fallback_once(reason)
        return None

    def cache(self):
        if self._cache is None:
            self._cache = HandleCache(self._driver_factory())
        return self._cache

    def device_ok(self, ordinal):
        if ordinal not in self._device_ok:
            try:
                with self.cache().driver.context(ordinal):
                    pci = self.cache().pci(ordinal)
                self._device_ok[ordinal] = device_reason(pci, self.info)
            except CudaError as e:
                self._device_ok[ordinal] = str(e)
        return self._device_ok[ordinal]

    def describe(self, t, fqn):
        """t: a detached CUDA tensor (strided). Returns (device tensor whose
        bytes the daemon copies, CudaSource), or None for the host path."""
        if t.numel() == 0:
            return None  # nothing to copy: the host path sends no bytes
        if not self.usable:
            return self._fallback(self.reason)
        ordinal = t.device.index if t.device.index is not None else _current_device()
        try:
            why = self.device_ok(ordinal)
        except CudaError as e:
            why = str(e)
        if why is not None:
            return self._fallback(why)
        # Conj/neg bits and non-contiguous layouts are resolved on the
        # device (a D2D copy kept alive until staged): the daemon copies
        # C-contiguous bytes.
        dt = t
        if dt.is_conj():
            dt = dt.resolve_conj()
        if dt.is_neg():
            dt = dt.resolve_neg()
        if not dt.is_contiguous():
            dt = dt.contiguous()
        nbytes = dt.numel() * dt.element_size()
        try:
            with self.cache().driver.context(ordinal):
                alloc, off = self.cache().lookup(ordinal, dt.data_ptr(), nbytes)
        except NotShareable as e:
            return self._fallback(str(e))
        except (CudaError, ValueError) as e:
            return self._fallback(f"{fqn}: {e}")
        if dt is not t:
            self.keep.append(dt)
        self.devices.add(ordinal)
        self.ipc_items += 1
        self.ipc_bytes += nbytes
        return dt, make_source(self.native, alloc, off)

    def synchronize(self):
        """Waits for the current stream of every GPU with IPC items (the
        caller's writes and the contiguous copies above), so that the daemon
        reads final values. Tensors written on other streams must have been
        synchronized by the caller."""
        import torch
        for ordinal in sorted(self.devices):
            torch.cuda.current_stream(ordinal).synchronize()

    @property
    def allocations(self):
        return len(self._cache.allocations()) if self._cache else 0


def _current_device():
    import torch
    return torch.cuda.current_device()
