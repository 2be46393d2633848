"""The GPU path of the Python package, as far as it runs without a GPU:

  * the ctypes mirror of the C ABI v4 (ckptd_cuda_source, the appended
    ckptd_save_options.cuda_sources, and the other structs) against the C
    header, compiled with gcc;
  * the decisions: the daemon without cuda_ipc, CKPTD_CUDA_IPC=0, a C API
    version 3 library, a GPU the daemon does not list -> host path with the
    reason logged once; device_snapshot's memory check and fallback;
  * the allocation arithmetic and the per-save handle cache, with a fake
    driver (fake pointers), and SavePlan.describe with fake CUDA tensors;
  * the save wiring (_items_for with CUDA sources, the SaveOptions array,
    the v3 options size) and, through a real daemon without a GPU, the
    fallbacks end to end;
  * the restore bounce-buffer loop (pinned double buffering) run on CPU
    tensors against a real checkpoint: splitting, packing, oversized rows,
    non-contiguous destinations, dtype conversion, the fencing order.

What needs a GPU is in tests/gpu (run by scripts/gpu_check.sh)."""
import contextlib
import ctypes
import logging
import os
import subprocess

import pytest

import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
import ckptd  # noqa: E402
from ckptd import _cuda, _native  # noqa: E402
from ckptd import _bounce, _load, _save, _tensors  # noqa: E402

HEADER_DIR = pyclient_util.REPO / "client"
MiB = 1 << 20


# -- the C ABI layout ------------------------------------------------------------

C_PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "ckptd_c.h"
#define F(T, f) printf("%s.%s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T*)0)->f));
#define S(T) printf("%s.sizeof %zu %zu\n", #T, sizeof(T), sizeof(T));
int main(void) {
  printf("version %d 0\n", CKPTD_C_API_VERSION);
  S(ckptd_cuda_source)
  F(ckptd_cuda_source, ipc_handle) F(ckptd_cuda_source, device)
  F(ckptd_cuda_source, offset) F(ckptd_cuda_source, allocation_size)
  S(ckptd_save_options)
  F(ckptd_save_options, overwrite) F(ckptd_save_options, dedup_save_to_lowest_rank)
  F(ckptd_save_options, keep_last_n) F(ckptd_save_options, coordinator)
  F(ckptd_save_options, local_ranks) F(ckptd_save_options, num_local_ranks)
  F(ckptd_save_options, num_nodes) F(ckptd_save_options, cuda_sources)
  F(ckptd_save_options, external_metadata) F(ckptd_save_options, metadata_timeout_ms)
  F(ckptd_save_options, keep_every) F(ckptd_save_options, compression)
  S(ckptd_item)
  F(ckptd_item, fqn) F(ckptd_item, is_bytes) F(ckptd_item, ndim) F(ckptd_item, dtype)
  F(ckptd_item, global_shape) F(ckptd_item, chunk_offsets) F(ckptd_item, chunk_sizes)
  F(ckptd_item, strides) F(ckptd_item, data) F(ckptd_item, nbytes) F(ckptd_item, path_json)
  S(ckptd_save_stats)
  F(ckptd_save_stats, copy_seconds) F(ckptd_save_stats, total_seconds)
  F(ckptd_save_stats, bytes) F(ckptd_save_stats, batches)
  S(ckptd_read_request)
  F(ckptd_read_request, fqn) F(ckptd_read_request, dtype) F(ckptd_read_request, ndim)
  F(ckptd_read_request, offsets) F(ckptd_read_request, sizes) F(ckptd_read_request, strides)
  F(ckptd_read_request, data)
  S(ckptd_restore_options)
  F(ckptd_restore_options, group) F(ckptd_restore_options, local_rank)
  F(ckptd_restore_options, local_world_size) F(ckptd_restore_options, flags)
  F(ckptd_restore_options, identity) F(ckptd_restore_options, batch_bytes)
  S(ckptd_restore_bytes)
  F(ckptd_restore_bytes, fqn) F(ckptd_restore_bytes, nbytes) F(ckptd_restore_bytes, data)
  F(ckptd_restore_bytes, length)
  S(ckptd_restore_stats)
  F(ckptd_restore_stats, storage_bytes) F(ckptd_restore_stats, copied_bytes)
  F(ckptd_restore_stats, bytes) F(ckptd_restore_stats, batches)
  F(ckptd_restore_stats, group_ranks) F(ckptd_restore_stats, seconds)
  return 0;
}
"""


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    d = tmp_path_factory.mktemp("abi")
    (d / "layout.c").write_text(C_PROGRAM)
    proc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(HEADER_DIR),
                           str(d / "layout.c"), "-o", str(d / "layout")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(d / "layout")], capture_output=True, text=True, check=True).stdout
    layout = {}
    for line in out.splitlines():
        key, a, b = line.split()
        layout[key] = (int(a), int(b))
    return layout


STRUCTS = {
    "ckptd_cuda_source": _native.CudaSource,
    "ckptd_save_options": _native.SaveOptions,
    "ckptd_item": _native.Item,
    "ckptd_save_stats": _native.SaveStats,
    "ckptd_read_request": _native.ReadRequest,
    "ckptd_restore_options": _native.RestoreOptions,
    "ckptd_restore_bytes": _native.RestoreBytes,
    "ckptd_restore_stats": _native.RestoreStats,
}


@pytest.mark.parametrize("cname", sorted(STRUCTS))
def test_ctypes_structs_match_the_c_header(c_layout, cname):
    cls = STRUCTS[cname]
    assert ctypes.sizeof(cls) == c_layout[f"{cname}.sizeof"][0], cname
    c_fields = {k.split(".", 1)[1]: v for k, v in c_layout.items()
                if k.startswith(cname + ".") and k != f"{cname}.sizeof"}
    py_fields = {name: (getattr(cls, name).offset, getattr(cls, name).size)
                 for name, _ in cls._fields_}
    assert py_fields == c_fields, cname


def test_api_versions_and_v3_options_size(c_layout):
    assert c_layout["version"][0] == _native.API_VERSION == 6
    assert _native.MIN_API_VERSION == 3
    assert ctypes.sizeof(_native.CudaSource) == 112
    # A v3 library is told the v3 struct: everything before cuda_sources.
    assert _native.options_size(3) == c_layout["ckptd_save_options.cuda_sources"][0] == 40
    # A v4/v5 library: everything before external_metadata.
    assert _native.options_size(4) == _native.options_size(5) == 48
    assert _native.options_size(4) == c_layout["ckptd_save_options.external_metadata"][0]
    assert _native.options_size(6) == ctypes.sizeof(_native.SaveOptions) == 72


def test_cuda_sources_array_points_at_the_sources():
    a, b = _native.CudaSource(offset=7, allocation_size=100), _native.CudaSource(offset=9)
    arr = _native.cuda_sources_array([a, None, b])
    opts = _native.save_options()
    assert not opts.cuda_sources
    opts.cuda_sources = arr
    assert opts.cuda_sources[0].contents.offset == 7
    assert opts.cuda_sources[0].contents.allocation_size == 100
    assert not opts.cuda_sources[1]
    assert opts.cuda_sources[2].contents.offset == 9
    assert ctypes.addressof(opts.cuda_sources[2].contents) == ctypes.addressof(b)


def test_v3_library_never_gets_cuda_sources(monkeypatch):
    monkeypatch.setattr(_native, "library_api_version", lambda: 3)
    opts = _native.save_options()
    opts.cuda_sources = _native.cuda_sources_array([_native.CudaSource()])
    c = _native.Client.__new__(_native.Client)   # never connected: must fail before C
    c._h = ctypes.c_void_p()
    with pytest.raises(ValueError, match="C API version 3"):
        c.save("x", "", 0, 1, [], opts)


# -- info and decisions -------------------------------------------------------------

def test_parse_info_gpu_fields():
    v3 = _native.parse_info({"version": "0.1", "cuda_ipc": True}, 3)
    assert v3["cuda_ipc"] is False and "C API version 3" in v3["cuda_unavailable"]
    old = _native.parse_info({"version": "0.1"}, 4)
    assert old["cuda_ipc"] is False and "older daemon" in old["cuda_unavailable"]
    assert old["cuda_devices"] == [] and old["pinned_staging_bytes"] == 0
    new = _native.parse_info({"cuda_ipc": True, "cuda_unavailable": "",
                              "pinned_staging_bytes": 1 << 30,
                              "cuda_devices": ["0000:3B:00.0"]}, 4)
    assert new["cuda_ipc"] is True and new["pinned_staging_bytes"] == 1 << 30
    assert new["cuda_devices"] == ["0000:3B:00.0"] and new["cuda_unavailable"] == ""
    off = _native.parse_info({"cuda_ipc": False, "cuda_unavailable": "no GPU"}, 4)
    assert off["cuda_ipc"] is False and off["cuda_unavailable"] == "no GPU"


GOOD_INFO = {"cuda_ipc": True, "cuda_unavailable": "", "cuda_devices": ["0000:3b:00.0"]}


@pytest.mark.parametrize("env,version,info,expect", [
    ({}, 4, GOOD_INFO, None),
    ({"CKPTD_CUDA_IPC": "1"}, 4, GOOD_INFO, None),
    ({"CKPTD_CUDA_IPC": "0"}, 4, GOOD_INFO, "CKPTD_CUDA_IPC=0"),
    ({"CKPTD_CUDA_IPC": "off"}, 4, GOOD_INFO, "CKPTD_CUDA_IPC=off"),
    ({}, 3, GOOD_INFO, "C API version 3"),
    ({}, 4, {"cuda_ipc": False, "cuda_unavailable": "cuInit failed: no device"},
     "the daemon has no CUDA IPC path: cuInit failed: no device"),
    ({}, 4, {"cuda_ipc": False}, "no reason given"),
])
def test_ipc_unavailable_reason(env, version, info, expect):
    got = _cuda.ipc_unavailable_reason(version, info, env)
    if expect is None:
        assert got is None
    else:
        assert got is not None and expect in got


def test_pci_ids_and_device_reason():
    assert _cuda.normalize_pci("0000:3B:00.0") == "0000:3b:00.0"
    assert _cuda.normalize_pci("00000000:3b:00.0") == "0000:3b:00.0"
    assert _cuda.normalize_pci("3b:00.0") == "0000:3b:00.0"
    assert _cuda.normalize_pci("garbage") == "garbage"
    assert _cuda.device_reason("00000000:3B:00.0", GOOD_INFO) is None
    why = _cuda.device_reason("0000:5e:00.0", GOOD_INFO)
    assert why and "0000:5e:00.0" in why and "0000:3b:00.0" in why
    assert "no GPU" in _cuda.device_reason("0000:3b:00.0", {"cuda_devices": []})


def test_chunk_offset_arithmetic():
    base, size = 0x7F0000000000, 2 * MiB
    assert _cuda.chunk_offset(base, base, size, size) == 0
    assert _cuda.chunk_offset(base + 4096, base, size, 1024) == 4096
    assert _cuda.chunk_offset(base + size - 8, base, size, 8) == size - 8
    assert _cuda.chunk_offset(base + size, base, size, 0) == size
    for ptr, n in [(base - 1, 1), (base + size - 8, 9), (base + size, 1)]:
        with pytest.raises(ValueError, match="outside its allocation"):
            _cuda.chunk_offset(ptr, base, size, n)


def test_snapshot_fits_margin():
    G = 1 << 30
    assert _cuda.snapshot_fits(11 * G, 10 * G) == (True, None)       # 10 G + 5% margin
    ok, why = _cuda.snapshot_fits(10 * G + 100 * MiB, 10 * G)         # margin 512 MiB
    assert not ok and "margin" in why and str(10 * G) in why
    assert _cuda.snapshot_fits(600 * MiB, 80 * MiB)[0]                 # 80 M + 512 M
    assert not _cuda.snapshot_fits(590 * MiB, 80 * MiB)[0]


# -- the handle cache with a fake driver ----------------------------------------------

class FakeDriver:
    """Allocations: {device: [(base, size, capable)]}; counts the calls."""

    def __init__(self, allocations, fail=None):
        self.allocations = allocations
        self.fail = fail or {}
        self.calls = []

    def _find(self, ptr):
        for dev, allocs in self.allocations.items():
            for base, size, capable in allocs:
                if base <= ptr < base + size:
                    return base, size, capable
        raise _cuda.CudaError(f"cuMemGetAddressRange failed: CUresult 1 ({ptr:#x})")

    def _maybe_fail(self, name):
        self.calls.append(name)
        if name in self.fail:
            raise _cuda.CudaError(self.fail[name])

    def is_ipc_capable(self, ptr):
        self._maybe_fail("is_ipc_capable")
        return self._find(ptr)[2]

    def address_range(self, ptr):
        self._maybe_fail("address_range")
        base, size, _ = self._find(ptr)
        return base, size

    def ipc_handle(self, ptr):
        self._maybe_fail("ipc_handle")
        return ptr.to_bytes(8, "little") * 8

    def pci_bus_id(self, ordinal):
        self._maybe_fail("pci_bus_id")
        return f"0000:{0x3b + ordinal:02x}:00.0"

    def context(self, ordinal):
        return contextlib.nullcontext()


A0, A1, B0 = 0x7000_0000_0000, 0x7000_1000_0000, 0x7100_0000_0000


def fake_allocs():
    return {0: [(A0, 20 * MiB, True), (A1, 2 * MiB, False)], 1: [(B0, 4 * MiB, True)]}


def test_handle_cache_shares_one_handle_per_allocation():
    drv = FakeDriver(fake_allocs())
    cache = _cuda.HandleCache(drv)
    a, off = cache.lookup(0, A0 + 512, 1024)
    assert (a.base, a.size, off, a.pci) == (A0, 20 * MiB, 512, "0000:3b:00.0")
    assert a.handle == A0.to_bytes(8, "little") * 8   # the handle of the base
    b, off2 = cache.lookup(0, A0 + 4 * MiB, 4 * MiB)   # same allocation: cached
    assert b is a and off2 == 4 * MiB
    assert drv.calls.count("ipc_handle") == 1 and drv.calls.count("address_range") == 1
    c, off3 = cache.lookup(1, B0, 4 * MiB)             # another GPU, another handle
    assert c is not a and off3 == 0 and c.pci == "0000:3c:00.0"
    assert drv.calls.count("ipc_handle") == 2
    assert len(cache.allocations()) == 2
    with pytest.raises(ValueError, match="outside"):    # runs past the allocation
        cache.lookup(0, A0 + 20 * MiB - 4, 8)


def test_handle_cache_not_shareable_and_driver_errors():
    cache = _cuda.HandleCache(FakeDriver(fake_allocs()))
    with pytest.raises(_cuda.NotShareable, match="expandable_segments"):
        cache.lookup(0, A1 + 16, 16)
    cache = _cuda.HandleCache(FakeDriver(fake_allocs(), fail={"ipc_handle": "boom"}))
    with pytest.raises(_cuda.CudaError, match="boom"):
        cache.lookup(0, A0, 16)
    assert not cache.allocations()


def test_make_source_fills_the_c_struct():
    alloc = _cuda.Allocation(A0, 20 * MiB, bytes(range(64)), "0000:3b:00.0")
    src = _cuda.make_source(_native, alloc, 4096)
    assert bytes(src.ipc_handle) == bytes(range(64))
    assert src.device == b"0000:3b:00.0" and src.offset == 4096
    assert src.allocation_size == 20 * MiB


class FakeCudaTensor:
    """What SavePlan.describe uses of a CUDA tensor."""

    class _Dev:
        type = "cuda"

        def __init__(self, index):
            self.index = index

    def __init__(self, ptr, numel, elsize=4, device=0, contiguous=True, conj=False, neg=False,
                 copy_ptr=None):
        self.ptr, self._numel, self.elsize = ptr, numel, elsize
        self.device = self._Dev(device)
        self._contig, self._conj, self._neg = contiguous, conj, neg
        self.copy_ptr = copy_ptr
        self.contiguous_calls = 0

    def numel(self):
        return self._numel

    def element_size(self):
        return self.elsize

    def data_ptr(self):
        return self.ptr

    def is_conj(self):
        return self._conj

    def is_neg(self):
        return self._neg

    def resolve_conj(self):
        return FakeCudaTensor(self.copy_ptr, self._numel, self.elsize, self.device.index)

    def resolve_neg(self):
        return FakeCudaTensor(self.copy_ptr, self._numel, self.elsize, self.device.index)

    def is_contiguous(self):
        return self._contig

    def contiguous(self):
        self.contiguous_calls += 1
        return FakeCudaTensor(self.copy_ptr, self._numel, self.elsize, self.device.index)


def plan_with(info=GOOD_INFO, version=4, env=None, driver=None):
    drv = driver or FakeDriver(fake_allocs())
    return _cuda.SavePlan(_native, version, info, env or {}, driver_factory=lambda: drv), drv


@pytest.fixture
def fresh_log_once(monkeypatch):
    monkeypatch.setattr(_cuda, "_logged", set())


def test_plan_describes_shared_storage_with_one_handle(fresh_log_once):
    plan, drv = plan_with()
    t1 = FakeCudaTensor(A0, 256)
    t2 = FakeCudaTensor(A0 + 1024, 100)           # a view of the same buffer
    view = FakeCudaTensor(A0 + 8, 10, contiguous=False, copy_ptr=A0 + 8 * MiB)
    d1, d2, d3 = (plan.describe(t, "x") for t in (t1, t2, view))
    assert d1[0] is t1 and d1[1].offset == 0 and d2[1].offset == 1024
    # the non-contiguous view: made contiguous on the device, kept alive
    assert view.contiguous_calls == 1 and d3[0] is not view and d3[1].offset == 8 * MiB
    assert plan.keep == [d3[0]]
    assert bytes(d1[1].ipc_handle) == bytes(d3[1].ipc_handle)
    assert drv.calls.count("ipc_handle") == 1 and plan.allocations == 1
    assert (plan.ipc_items, plan.ipc_bytes, plan.host_items) == (3, 1024 + 400 + 40, 0)
    assert plan.devices == {0}
    conj = FakeCudaTensor(A0, 4, elsize=8, conj=True, copy_ptr=A0 + 12 * MiB)
    assert plan.describe(conj, "c")[1].offset == 12 * MiB
    assert plan.describe(FakeCudaTensor(A0, 0), "empty") is None   # nothing to send
    assert plan.host_items == 0


def test_plan_fallbacks_are_logged_once(fresh_log_once, caplog):
    caplog.set_level(logging.WARNING, logger="ckptd")
    plan, _ = plan_with(info={"cuda_ipc": False, "cuda_unavailable": "cuInit: no device"})
    assert not plan.usable
    assert plan.describe(FakeCudaTensor(A0, 4), "a") is None
    assert plan.describe(FakeCudaTensor(A0, 4), "b") is None
    # An empty CUDA tensor sends no bytes on either path: not a host item
    # (found on the GPU machine: host_items was one more than the chunks).
    assert plan.describe(FakeCudaTensor(A0, 0), "empty") is None
    msgs = [r.getMessage() for r in caplog.records if "cuInit: no device" in r.getMessage()]
    assert len(msgs) == 1 and "copied to host memory" in msgs[0]
    assert plan.host_items == 2 and plan.ipc_items == 0

    caplog.clear()
    plan, _ = plan_with()
    assert plan.describe(FakeCudaTensor(A1, 4), "a") is None        # expandable segment
    assert plan.describe(FakeCudaTensor(A1 + 64, 4), "b") is None
    assert plan.describe(FakeCudaTensor(A0, 4), "c") is not None     # a normal one still
    hints = [r for r in caplog.records if "expandable_segments" in r.getMessage()]
    assert len(hints) == 1 and "PYTORCH_CUDA_ALLOC_CONF" in hints[0].getMessage()
    assert plan.host_items == 2 and plan.ipc_items == 1
    assert any("expandable_segments" in r for r in plan.fallback_reasons)


def test_plan_gpu_not_listed_and_driver_failure(fresh_log_once, caplog):
    caplog.set_level(logging.WARNING, logger="ckptd")
    plan, _ = plan_with()
    assert plan.describe(FakeCudaTensor(B0, 4, device=1), "other_gpu") is None
    assert "0000:3c:00.0" in plan.fallback_reasons[0]
    plan, _ = plan_with(driver=FakeDriver(fake_allocs(), fail={"address_range": "CUresult 201"}))
    assert plan.describe(FakeCudaTensor(A0, 4), "w") is None
    assert "w: CUresult 201" in plan.fallback_reasons[0]
    plan, _ = plan_with(driver=FakeDriver(fake_allocs(), fail={"pci_bus_id": "no pci"}))
    assert plan.describe(FakeCudaTensor(A0, 4), "w") is None and plan.fallback_reasons == ["no pci"]
    plan, _ = plan_with(env={"CKPTD_CUDA_IPC": "0"})
    assert plan.describe(FakeCudaTensor(A0, 4), "w") is None
    assert "CKPTD_CUDA_IPC=0" in plan.fallback_reasons[0]
    plan, _ = plan_with(version=3)
    assert plan.describe(FakeCudaTensor(A0, 4), "w") is None
    assert "C API version 3" in plan.fallback_reasons[0]


def test_snapshot_decision():
    plan, _ = plan_with()
    G = 1 << 30
    assert _save.snapshot_decision(plan, {0: G}, {0: 2 * G}) == (True, None)
    take, why = _save.snapshot_decision(plan, {0: G}, {0: G})
    assert not take and "GPU 0" in why and "margin" in why
    take, why = _save.snapshot_decision(plan, {1: G}, {1: 4 * G})    # GPU not listed
    assert not take and "0000:3c:00.0" in why
    bad, _ = plan_with(info={"cuda_ipc": False, "cuda_unavailable": "no driver"})
    take, why = _save.snapshot_decision(bad, {0: G}, {0: 4 * G})
    assert not take and "no driver" in why
    assert _save.snapshot_decision(None, {}, {})[1].startswith("device_snapshot needs CUDA")
    assert "no CUDA tensors" in _save.snapshot_decision(plan, {}, {})[1]


# -- the save wiring ----------------------------------------------------------------

class StubPlan:
    """describe() hands back CudaSources, except for tensors whose data
    pointer is in `refuse` (the host-path fallback)."""

    def __init__(self, refuse=()):
        self.described = []
        self.refuse = set(refuse)

    def describe(self, t, fqn):
        if t.data_ptr() in self.refuse:
            return None
        c = t.contiguous()
        self.described.append(fqn)
        return c, _native.CudaSource(offset=len(self.described) * 256, allocation_size=1 << 20)


def test_items_for_marks_cuda_items(monkeypatch):
    monkeypatch.setattr(_save, "is_cuda", lambda t: getattr(t, "_as_cuda", False))
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a._as_cuda = True
    b = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t()   # non-contiguous
    b._as_cuda = True
    c = torch.ones(5)
    c._as_cuda = True                                             # falls back
    host = torch.zeros(2, dtype=torch.int64)
    leaves = ckptd.flatten({"a": a, "b": b, "c": c, "host": host, "step": 3})
    plan = StubPlan(refuse=[c.data_ptr()])
    items, keep, sources = _save._items_for(leaves, plan)
    assert [i.fqn for i in items] == [b"a", b"b", b"c", b"host", b"step"]
    assert plan.described == ["a", "b"]
    assert [s is not None for s in sources] == [True, True, False, False, False]
    for i in (0, 1):   # CUDA items: no host pointer, no strides, checked nbytes
        assert items[i].data is None and not items[i].strides
        assert items[i].nbytes == [48, 12][i]
        assert list(items[i].chunk_sizes[:2]) == [[3, 4], [3, 2]][i]
    assert items[1].dtype == b"bfloat16"
    assert items[2].data == c.data_ptr() and items[2].strides[0] == 1   # host path
    assert items[4].is_bytes == 1
    opts = _native.save_options()
    opts.cuda_sources = _native.cuda_sources_array(sources)
    assert opts.cuda_sources[1].contents.offset == 512 and not opts.cuda_sources[2]


def test_device_snapshot_transform_clones_contiguously():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    c = _save._snapshot_copy(t)
    assert c.is_contiguous() and torch.equal(c, t) and c.data_ptr() != t.data_ptr()
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()
    cz = _save._snapshot_copy(z)
    assert not cz.is_conj() and torch.equal(cz, z)


# -- through a real daemon (no GPU here) -----------------------------------------

@pytest.fixture
def daemon(make_daemon):
    if pyclient_util.asan_build():
        pytest.skip(pyclient_util.ASAN_SKIP_REASON)
    d = make_daemon()
    yield d
    ckptd.close_clients()


def test_daemon_info_reports_the_gpu_fields(daemon):
    info = ckptd.client(str(daemon.socket)).info()
    version = _native.library_api_version()
    assert info["cuda_ipc"] is False            # no GPU on this machine
    assert info["cuda_unavailable"], info       # ...and says why
    assert isinstance(info["cuda_devices"], list) and not info["cuda_devices"]
    if version < 4:
        assert "C API version" in info["cuda_unavailable"]
    plan = _cuda.SavePlan(_native, version, info, {})
    assert not plan.usable
    assert ("the daemon has no CUDA IPC path" in plan.reason) or ("C API version" in plan.reason)


def test_cuda_sources_rejected_by_a_daemon_without_gpu(daemon, tmp_path):
    """The ABI plumbing end to end: a v4 library forwards the CUDA item to a
    daemon without cuda_ipc, which refuses it (FAILED_PRECONDITION, as
    ckptd_c.h specifies); a v3 library never gets it."""
    cl = ckptd.client(str(daemon.socket))
    shape = _native.int64_array([4])
    item = _native.Item(fqn=b"w", ndim=1, dtype=b"float32", global_shape=shape,
                        chunk_sizes=shape, nbytes=16)
    opts = _native.save_options()
    opts.cuda_sources = _native.cuda_sources_array([_native.CudaSource(
        device=b"0000:3b:00.0", allocation_size=1 << 20)])
    if _native.library_api_version() < 4:
        with pytest.raises(ValueError, match="C API version"):
            cl.save("gpu/rejected", None, 0, 1, [item], opts)
        return
    with pytest.raises(ckptd.CkptdError) as e:
        cl.save("gpu/rejected", None, 0, 1, [item], opts)
    assert e.value.code == 9, e.value     # FAILED_PRECONDITION


def test_device_snapshot_without_cuda_falls_back_and_saves(daemon, caplog):
    caplog.set_level(logging.WARNING, logger="ckptd")
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 5}
    h = ckptd.async_save(state, "snap/step_5", socket=str(daemon.socket), device_snapshot=True)
    st = h.result(60)
    assert st.state == "COMMITTED"
    assert h.stats.device_snapshot is False and "needs CUDA" in h.stats.cuda_fallback
    assert h.stats.ipc_items == 0
    assert any("device_snapshot falls back" in r.getMessage() for r in caplog.records)
    out = {"w": torch.zeros(1000), "step": 0}
    ckptd.load(out, st.checkpoint_id)
    assert torch.equal(out["w"], state["w"]) and out["step"] == 5


def test_manager_passes_device_snapshot(daemon, monkeypatch):
    seen = {}
    real = _save.async_save

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)

    monkeypatch.setattr(_save, "async_save", spy)
    mgr = ckptd.CheckpointManager(daemon.root / "mgr", 1, socket=str(daemon.socket),
                                  cluster=None, device_snapshot=True)
    assert mgr.save_async(1, {"w": torch.ones(3)})
    mgr.join()
    assert seen["device_snapshot"] is True and mgr.latest_step() == 1


# -- restore through bounce buffers, on CPU ----------------------------------------

def test_split_rows_and_pack_batches():
    assert _bounce.split_rows((10, 4), 4, 64) == [(0, 4), (4, 8), (8, 10)]
    assert _bounce.split_rows((3, 100), 4, 64) == [(0, 1), (1, 2), (2, 3)]  # rows > limit
    assert _bounce.split_rows((), 8, 64) == [(0, 0)]
    assert _bounce.split_rows((0, 5), 4, 64) == [(0, 0)]
    assert _bounce.split_rows((5, 0), 4, 64) == [(0, 5)]
    # 256-byte alignment; a piece larger than the buffer gets a batch alone
    assert _bounce.pack_batches([100, 100, 600, 300, 1000], 512) == [
        [(0, 0), (1, 256)], [(2, 0)], [(3, 0)], [(4, 0)]]
    assert _bounce.pack_batches([10, 10, 10], 512) == [[(0, 0), (1, 256)], [(2, 0)]]
    assert _bounce.pack_batches([], 512) == []


class CpuBounce:
    """The bounce backend on CPU tensors, recording the fencing."""

    def __init__(self):
        self.log = []
        self.buffers = []
        self.n = 0

    def alloc(self, nbytes):
        b = torch.full((int(nbytes),), 0xAB, dtype=torch.uint8)
        self.buffers.append(b)
        self.log.append(("alloc", nbytes))
        return b

    def copy(self, dest, src):
        self.log.append(("copy", src.data_ptr()))
        dest.copy_(src)

    def fence(self):
        self.n += 1
        self.log.append(("fence", self.n))
        return self.n

    def wait(self, fence):
        self.log.append(("wait", fence))

    def finish(self):
        self.log.append(("finish",))


@pytest.fixture
def saved(daemon):
    g = torch.Generator().manual_seed(3)
    values = {
        "big": torch.randn(37, 11, generator=g),
        "bf": torch.randn(9, 5, generator=g).to(torch.bfloat16),
        "wide": torch.randn(2, 300, generator=g),          # a row larger than a buffer
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "ints": torch.arange(50, dtype=torch.int64),
    }
    st = ckptd.save(values, "bounce/ck", socket=str(daemon.socket))
    return values, st.checkpoint_id


def test_restore_through_bounce_on_cpu(saved):
    values, directory = saved
    dests = {
        "big": torch.zeros(11, 37).t(),                    # non-contiguous destination
        "bf": torch.zeros(9, 5, dtype=torch.float32),      # converted by the copy
        "wide": torch.zeros(2, 300),
        "scalar": torch.zeros((), dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "ints": torch.zeros(50, dtype=torch.int64),
    }
    half = 512
    pieces = []
    with _native.Reader(directory) as reader:
        md = {e["fqn"]: e for e in reader.metadata()["entries"]}
        for k, d in dests.items():
            pieces += _bounce.bounce_pieces(k, d, (0,) * d.dim(),
                                            _tensors.dtype_from_name(md[k]["dtype"]), half)
        backend = CpuBounce()
        nread = _bounce.restore_through_bounce(reader, pieces, backend, half)
    assert nread > 0
    for k, v in values.items():
        assert torch.equal(dests[k], v.to(dests[k].dtype)), k
    # "wide": one row is 1200 bytes > 512: its own buffers (2 pieces)
    assert sum(1 for e in backend.log if e == ("alloc", 1200)) == 2
    # a reused buffer is refilled only after the fence of its previous batch
    fills = [i for i, e in enumerate(backend.log) if e[0] == "fence"]
    assert len(fills) == len(_bounce.pack_batches([p.nbytes for p in pieces], half))
    for i, e in enumerate(backend.log):
        if e[0] == "fence" and e[1] > 2:
            prior_wait = [x for x in backend.log[:i] if x == ("wait", e[1] - 2)]
            assert prior_wait, backend.log
    assert backend.log[-1] == ("finish",)


def test_load_uses_the_bounce_path_for_device_destinations(saved, monkeypatch):
    values, directory = saved
    backend = CpuBounce()
    monkeypatch.setattr(_bounce, "use_bounce", lambda: True)
    monkeypatch.setattr(_load, "is_cuda", lambda t: getattr(t, "_as_cuda", False))
    monkeypatch.setattr(_bounce, "CudaBounce", lambda: backend)
    monkeypatch.setenv(_bounce.BOUNCE_ENV, "2048")
    dest = {k: torch.zeros_like(v) for k, v in values.items()}
    for k in ("big", "bf", "wide"):
        dest[k]._as_cuda = True
    ckptd.load(dest, directory)
    for k, v in values.items():
        assert torch.equal(dest[k], v), k
    assert any(e[0] == "copy" for e in backend.log) and backend.log[-1] == ("finish",)
    assert ("alloc", 1024) in backend.log      # CKPTD_LOAD_BOUNCE_BYTES / 2
