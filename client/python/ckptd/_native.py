"""ctypes binding of libckptd_client.so's C ABI (client/ckptd_c.h).

This is the only module that touches the native library: one protocol
implementation (the C++ client), no second one in Python. ctypes releases the
GIL around every call, so copies into shared memory, waits and checkpoint
reads run while other Python threads go on.

The library is looked for, in order:
  1. $CKPTD_CLIENT_LIB (a path to the .so);
  2. next to this package (ckptd/libckptd_client.so, bundled by pip install);
  3. a source checkout's build: <repo>/build/client/libckptd_client.so;
  4. the system library path (ctypes.util.find_library("ckptd_client")).
"""
import ctypes
import ctypes.util
import json
import os
import pathlib
import threading

from .errors import InvalidArgument, error_for

# The C API version this module speaks (client/ckptd_c.h): 4 adds CUDA IPC
# items (CudaSource, SaveOptions.cuda_sources) and the GPU fields of the
# daemon's info. A library of MIN_API_VERSION (3: ckptd_save_ex2 and the
# cluster fields) still loads; it gets the v3 SaveOptions size and never a
# CUDA source (CUDA tensors then take the client's host path).
# 5 adds restoring through the daemon (ckptd_restore_index, ckptd_restore):
# an older library loads, and ckptd.load then reads checkpoints directly.
# 6 adds DCP's StorageWriter (SaveOptions.external_metadata,
# ckptd_layout_json, ckptd_commit_metadata): ckptd.StorageWriter needs it.
API_VERSION = 6
MIN_API_VERSION = 3
CUDA_API_VERSION = 4  # the first version with ckptd_save_options.cuda_sources
RESTORE_API_VERSION = 5  # the first version with ckptd_restore
WRITER_API_VERSION = 6  # the first version with external_metadata
_LIBNAME = "libckptd_client.so"

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_int32_p = ctypes.POINTER(ctypes.c_int32)


class Item(ctypes.Structure):
    _fields_ = [
        ("fqn", ctypes.c_char_p),
        ("is_bytes", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_char_p),
        ("global_shape", c_int64_p),
        ("chunk_offsets", c_int64_p),
        ("chunk_sizes", c_int64_p),
        ("strides", c_int64_p),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("path_json", ctypes.c_char_p),
    ]


class CudaSource(ctypes.Structure):
    """ckptd_cuda_source: a C-contiguous tensor chunk in CUDA memory, named
    by the legacy IPC handle of its allocation and its offset there."""
    _fields_ = [
        ("ipc_handle", ctypes.c_uint8 * 64),   # CUipcMemHandle of the allocation
        ("device", ctypes.c_char * 32),        # PCI bus id, NUL-terminated
        ("offset", ctypes.c_uint64),           # chunk's first byte - allocation base
        ("allocation_size", ctypes.c_uint64),  # bytes of the allocation
    ]


class SaveOptions(ctypes.Structure):
    _fields_ = [
        ("overwrite", ctypes.c_int32),
        ("dedup_save_to_lowest_rank", ctypes.c_int32),
        ("keep_last_n", ctypes.c_int32),
        # C API version 3: multi-node checkpoints (all zero: single node).
        ("coordinator", ctypes.c_char_p),
        ("local_ranks", c_int32_p),
        ("num_local_ranks", ctypes.c_int32),
        ("num_nodes", ctypes.c_int32),
        # C API version 4: NULL, or n pointers parallel to the items (NULL
        # entry: a host item). Only passed to a library of version >= 4.
        ("cuda_sources", ctypes.POINTER(ctypes.POINTER(CudaSource))),
        # C API version 6: DCP's StorageWriter. Only passed to a library of
        # version >= 6.
        ("external_metadata", ctypes.c_int32),
        ("metadata_timeout_ms", ctypes.c_uint32),
        ("keep_every", ctypes.c_int32),
        ("compression", ctypes.c_char_p),
    ]


def options_size(version):
    """Bytes of SaveOptions a library of C API `version` is told about:
    the v3 struct ends where cuda_sources begins, the v4 one where
    external_metadata does."""
    if version >= WRITER_API_VERSION:
        return ctypes.sizeof(SaveOptions)
    if version >= CUDA_API_VERSION:
        return SaveOptions.external_metadata.offset
    return SaveOptions.cuda_sources.offset


class SaveStats(ctypes.Structure):
    _fields_ = [
        ("copy_seconds", ctypes.c_double),
        ("total_seconds", ctypes.c_double),
        ("bytes", ctypes.c_uint64),
        ("batches", ctypes.c_int32),
    ]


class ReadRequest(ctypes.Structure):
    _fields_ = [
        ("fqn", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int32),
        ("offsets", c_int64_p),
        ("sizes", c_int64_p),
        ("strides", c_int64_p),
        ("data", ctypes.c_void_p),
    ]


RESTORE_NO_VERIFY_CRC = 1  # CKPTD_RESTORE_NO_VERIFY_CRC


class RestoreOptions(ctypes.Structure):
    _fields_ = [
        ("group", ctypes.c_char_p),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("identity", ctypes.c_char_p),
        ("batch_bytes", ctypes.c_uint64),
    ]


class RestoreBytes(ctypes.Structure):
    _fields_ = [
        ("fqn", ctypes.c_char_p),
        ("nbytes", ctypes.c_uint64),
        ("data", ctypes.c_void_p),     # set by the library; ckptd_free_string
        ("length", ctypes.c_uint64),
    ]


class RestoreStats(ctypes.Structure):
    _fields_ = [
        ("storage_bytes", ctypes.c_uint64),
        ("copied_bytes", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("batches", ctypes.c_int32),
        ("group_ranks", ctypes.c_int32),
        ("seconds", ctypes.c_double),
    ]


def _candidates():
    env = os.environ.get("CKPTD_CLIENT_LIB")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    out = [here / _LIBNAME]
    # client/python/ckptd -> repository root
    if len(here.parents) >= 3:
        out.append(here.parents[2] / "build" / "client" / _LIBNAME)
    found = ctypes.util.find_library("ckptd_client")
    if found:
        out.append(pathlib.Path(found))
    return out


_lib = None
_lib_lock = threading.Lock()


def _declare(lib):
    P = ctypes.POINTER
    vp, cp, i32, u64, i64 = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64,
                             ctypes.c_int64)
    sigs = {
        "ckptd_last_error": (cp, []),
        "ckptd_api_version": (i32, []),
        "ckptd_connect_ex": (i32, [cp, i32, cp, ctypes.c_double, P(vp)]),
        "ckptd_close": (None, [vp]),
        "ckptd_info_json": (i32, [vp, P(vp)]),
        "ckptd_reserve": (i32, [vp, u64]),
        "ckptd_save_ex2": (i32, [vp, cp, cp, i32, i32, P(Item), ctypes.c_size_t,
                                 P(SaveOptions), ctypes.c_size_t, P(SaveStats), P(vp)]),
        "ckptd_wait_json": (i32, [vp, cp, i64, P(vp)]),
        "ckptd_status_json": (i32, [vp, cp, P(vp)]),
        "ckptd_list_json": (i32, [vp, cp, i32, P(vp)]),
        "ckptd_cancel": (i32, [vp, cp, cp]),
        "ckptd_free_string": (None, [vp]),
        "ckptd_reader_open": (i32, [cp, i32, P(vp)]),
        "ckptd_reader_close": (None, [vp]),
        "ckptd_reader_metadata_json": (i32, [vp, P(vp)]),
        "ckptd_reader_read": (i32, [vp, P(ReadRequest), ctypes.c_size_t, P(u64)]),
        "ckptd_reader_read_bytes": (i32, [vp, cp, P(vp), P(u64)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # Added without an API version bump (ckptd_c.h): present or not.
    optional = {
        "ckptd_reader_open_ex": (i32, [cp, i32, ctypes.c_uint32, P(vp)]),
        "ckptd_reader_metadata_json_ex": (i32, [vp, ctypes.c_uint32, P(vp)]),
        "ckptd_reader_chunks_json": (i32, [vp, cp, i32, P(i64), P(i64), P(vp)]),
    }
    if int(lib.ckptd_api_version()) >= RESTORE_API_VERSION:
        optional.update({
            "ckptd_restore_index": (i32, [vp, cp, P(vp), P(vp)]),
            "ckptd_restore": (i32, [vp, cp, P(RestoreOptions), P(ReadRequest), ctypes.c_size_t,
                                    P(RestoreBytes), ctypes.c_size_t, P(RestoreStats)]),
        })
    if int(lib.ckptd_api_version()) >= WRITER_API_VERSION:
        optional.update({
            "ckptd_wait_data_durable_json": (i32, [vp, cp, i64, P(vp)]),
            "ckptd_layout_json": (i32, [vp, cp, P(vp)]),
            "ckptd_commit_metadata": (i32, [vp, cp, ctypes.c_char_p, ctypes.c_size_t]),
        })
    for name, (restype, argtypes) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes


def lib():
    """The loaded native library (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if not path.exists() and os.sep in str(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                candidate = ctypes.CDLL(str(path))
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            try:
                version = candidate.ckptd_api_version()
            except AttributeError:
                tried.append(f"{path} (not libckptd_client: no ckptd_api_version)")
                continue
            if version < MIN_API_VERSION:
                tried.append(f"{path} (C API version {version}; this package needs "
                             f"{MIN_API_VERSION} or newer: rebuild the library)")
                continue
            _declare(candidate)
            _lib = candidate
            return _lib
        raise ImportError(
            "ckptd: cannot load the native client library libckptd_client.so; set "
            "CKPTD_CLIENT_LIB to its path (build it with scripts/build.sh). Tried: "
            + "; ".join(tried or ["nothing"]))


def library_path():
    """The file the native library was loaded from."""
    return lib()._name


def library_api_version():
    """ckptd_api_version() of the loaded library (3 or 4 and up)."""
    return int(lib().ckptd_api_version())


def _check(rc):
    if rc != 0:
        msg = lib().ckptd_last_error()
        raise error_for(rc, msg.decode("utf-8", "replace") if msg else "")


def _take_string(ptr):
    if not ptr.value:
        return ""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8", "replace")
    finally:
        lib().ckptd_free_string(ptr)


def _take_json(ptr):
    return json.loads(_take_string(ptr))


def _enc(s):
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode()


class Client:
    """A connection to the daemon (wraps ckptd_client*). Thread-safe like the
    C++ client: saves are serialized, the rest may run concurrently."""

    def __init__(self, socket=None, copy_threads=1, owner=None, rpc_timeout=0.0):
        self._h = ctypes.c_void_p()
        _check(lib().ckptd_connect_ex(_enc(socket), int(copy_threads), _enc(owner),
                                      float(rpc_timeout or 0.0), ctypes.byref(self._h)))
        self.socket = socket
        self.pid = os.getpid()
        self._info = None

    def close(self):
        if self._h and self._h.value:
            # A forked child must not tear down its parent's connection.
            if os.getpid() == self.pid:
                lib().ckptd_close(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def info(self):
        """The daemon's GetInfo as a dict. The GPU fields (C API 4) are
        always present: cuda_ipc (False from an older daemon or library),
        cuda_unavailable (why not), pinned_staging_bytes, cuda_devices."""
        if self._info is None:
            out = ctypes.c_void_p()
            _check(lib().ckptd_info_json(self._h, ctypes.byref(out)))
            self._info = parse_info(_take_json(out), library_api_version())
        return self._info

    def reserve(self, nbytes):
        _check(lib().ckptd_reserve(self._h, int(nbytes)))

    def save(self, checkpoint_id, job, rank, world_size, items, options):
        version = library_api_version()
        if version < CUDA_API_VERSION and bool(options.cuda_sources):
            raise ValueError("CUDA sources given to a libckptd_client.so of C API version "
                             f"{version} (< {CUDA_API_VERSION})")
        arr = (Item * len(items))(*items)
        stats = SaveStats()
        resolved = ctypes.c_void_p()
        _check(lib().ckptd_save_ex2(self._h, _enc(checkpoint_id), _enc(job or ""), int(rank),
                                    int(world_size), arr, len(items), ctypes.byref(options),
                                    options_size(version), ctypes.byref(stats),
                                    ctypes.byref(resolved)))
        return _take_string(resolved), stats

    def wait(self, checkpoint_id, timeout=None):
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        out = ctypes.c_void_p()
        _check(lib().ckptd_wait_json(self._h, _enc(checkpoint_id), ms, ctypes.byref(out)))
        return _take_json(out)

    def wait_data_durable(self, checkpoint_id, timeout=None):
        """wait, returning also once an external_metadata checkpoint's
        data is durable (its status' awaiting_metadata)."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        out = ctypes.c_void_p()
        _check(lib().ckptd_wait_data_durable_json(self._h, _enc(checkpoint_id), ms,
                                                  ctypes.byref(out)))
        return _take_json(out)

    def layout(self, checkpoint_id):
        """Where each item of an awaiting external_metadata checkpoint was
        written (ckptd_layout_json)."""
        out = ctypes.c_void_p()
        _check(lib().ckptd_layout_json(self._h, _enc(checkpoint_id), ctypes.byref(out)))
        return _take_json(out)

    def commit_metadata(self, checkpoint_id, data):
        """Hands the pickled Metadata to the daemon (ckptd_commit_metadata)."""
        _check(lib().ckptd_commit_metadata(self._h, _enc(checkpoint_id), data, len(data)))

    def status(self, checkpoint_id):
        out = ctypes.c_void_p()
        _check(lib().ckptd_status_json(self._h, _enc(checkpoint_id), ctypes.byref(out)))
        return _take_json(out)

    def list(self, job=None, include_disk=False):
        out = ctypes.c_void_p()
        _check(lib().ckptd_list_json(self._h, _enc(job or ""), int(bool(include_disk)),
                                     ctypes.byref(out)))
        return _take_json(out)

    def cancel(self, checkpoint_id, reason=None):
        _check(lib().ckptd_cancel(self._h, _enc(checkpoint_id), _enc(reason)))

    def restore_index(self, checkpoint_id):
        """(index dict, identity) of a checkpoint, decoded by the daemon
        (ckptd_restore_index; C API 5)."""
        out, ident = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib().ckptd_restore_index(self._h, _enc(checkpoint_id), ctypes.byref(out),
                                         ctypes.byref(ident)))
        try:
            index = _take_json(out)
        finally:
            identity = _take_string(ident)
        return index, identity

    def restore(self, checkpoint_id, options, requests, bytes_fqns, bytes_sizes):
        """Fills the ReadRequests and returns ([payload of each bytes item],
        RestoreStats) (ckptd_restore; C API 5)."""
        reqs = (ReadRequest * max(1, len(requests)))(*requests)
        names = [_enc(f) for f in bytes_fqns]
        items = (RestoreBytes * max(1, len(names)))(
            *[RestoreBytes(fqn=n, nbytes=int(sz)) for n, sz in zip(names, bytes_sizes)])
        stats = RestoreStats()
        _check(lib().ckptd_restore(self._h, _enc(checkpoint_id), ctypes.byref(options), reqs,
                                   len(requests), items, len(names), ctypes.byref(stats)))
        raws = []
        try:
            for k in range(len(names)):
                n = items[k].length
                raws.append(ctypes.string_at(items[k].data, n) if n else b"")
        finally:
            for k in range(len(names)):
                if items[k].data:
                    lib().ckptd_free_string(items[k].data)
        return raws, stats


READER_NO_VERIFY_CRC = 1  # CKPTD_READER_NO_VERIFY_CRC
METADATA_JSON_NO_CHUNKS = 1  # CKPTD_METADATA_JSON_NO_CHUNKS


class Reader:
    """An open checkpoint directory (wraps ckptd_reader*). verify_crc=False
    returns payload bytes without checking their CRC-32s (ckptd_c.h)."""

    def __init__(self, directory, threads=1, verify_crc=True):
        self._h = ctypes.c_void_p()
        flags = 0 if verify_crc else READER_NO_VERIFY_CRC
        if hasattr(lib(), "ckptd_reader_open_ex"):
            _check(lib().ckptd_reader_open_ex(_enc(directory), int(threads), flags,
                                              ctypes.byref(self._h)))
        else:  # an older library, which checks no payload CRC at all
            _check(lib().ckptd_reader_open(_enc(directory), int(threads), ctypes.byref(self._h)))
        self.directory = str(directory)

    def close(self):
        if self._h and self._h.value:
            lib().ckptd_reader_close(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def metadata(self, chunks=True):
        """The metadata as a dict (ckptd_c.h). chunks=False: tensor entries
        carry "num_chunks" instead of their "chunks" list, so that a
        checkpoint of millions of chunks costs a small dict (what load
        needs); a library without ckptd_reader_metadata_json_ex returns the
        chunk lists anyway."""
        out = ctypes.c_void_p()
        if not chunks and hasattr(lib(), "ckptd_reader_metadata_json_ex"):
            _check(lib().ckptd_reader_metadata_json_ex(self._h, METADATA_JSON_NO_CHUNKS,
                                                       ctypes.byref(out)))
        else:
            _check(lib().ckptd_reader_metadata_json(self._h, ctypes.byref(out)))
        return _take_json(out)

    def chunks(self, fqn, offsets=None, sizes=None):
        """The saved chunks of tensor `fqn` overlapping the box [offsets,
        offsets + sizes) (both None: every chunk), found through the
        reader's index: [{"offsets", "sizes", "file", "offset", "length"}].
        NotImplementedError with a library that lacks
        ckptd_reader_chunks_json."""
        if not hasattr(lib(), "ckptd_reader_chunks_json"):
            raise NotImplementedError(f"{library_path()} has no ckptd_reader_chunks_json")
        if (offsets is None) != (sizes is None):
            raise InvalidArgument("chunks: give both offsets and sizes, or neither")
        ndim, offs, szs = 0, None, None
        if offsets is not None:
            if len(offsets) != len(sizes):
                raise InvalidArgument(f"chunks: {len(offsets)} offsets but {len(sizes)} sizes")
            ndim, offs, szs = len(offsets), int64_array(offsets), int64_array(sizes)
        out = ctypes.c_void_p()
        _check(lib().ckptd_reader_chunks_json(self._h, _enc(fqn), ndim, offs, szs,
                                              ctypes.byref(out)))
        return _take_json(out)

    def read(self, requests):
        """Fills every ReadRequest; returns the bytes read from files."""
        if not requests:
            return 0
        arr = (ReadRequest * len(requests))(*requests)
        nread = ctypes.c_uint64()
        _check(lib().ckptd_reader_read(self._h, arr, len(requests), ctypes.byref(nread)))
        return nread.value

    def read_bytes(self, fqn):
        data = ctypes.c_void_p()
        n = ctypes.c_uint64()
        _check(lib().ckptd_reader_read_bytes(self._h, _enc(fqn), ctypes.byref(data),
                                             ctypes.byref(n)))
        try:
            return ctypes.string_at(data.value, n.value) if n.value else b""
        finally:
            lib().ckptd_free_string(data)


def save_options(overwrite=False, dedup_save_to_lowest_rank=False, keep_last_n=0,
                 cluster=None, external_metadata=False, metadata_timeout=None, keep_every=0,
                 compression=None):
    """A SaveOptions struct; `cluster` (a ckptd.Cluster or None) fills the
    multi-node fields; external_metadata / metadata_timeout (seconds) are
    ckptd.StorageWriter's; keep_every and compression (C API 6) are
    retention's and the payloads'. The struct keeps its strings and arrays alive."""
    opts = SaveOptions(overwrite=int(bool(overwrite)),
                       dedup_save_to_lowest_rank=int(bool(dedup_save_to_lowest_rank)),
                       keep_last_n=int(keep_last_n or 0),
                       external_metadata=int(bool(external_metadata)),
                       metadata_timeout_ms=int((metadata_timeout or 0) * 1000),
                       keep_every=int(keep_every or 0),
                       compression=(compression or "").encode())
    if cluster is not None:
        ranks = list(cluster.local_ranks)
        opts.coordinator = cluster.coordinator.encode()
        if ranks:
            opts.local_ranks = (ctypes.c_int32 * len(ranks))(*ranks)
        opts.num_local_ranks = len(ranks)
        opts.num_nodes = int(cluster.num_nodes)
    return opts


def restore_options(group="", local_rank=0, local_world_size=1, verify_crc=True,
                    identity="", batch_bytes=0):
    """A RestoreOptions struct (batch_bytes 0: the library's 256 MiB)."""
    return RestoreOptions(group=_enc(group or ""), local_rank=int(local_rank),
                          local_world_size=int(local_world_size),
                          flags=0 if verify_crc else RESTORE_NO_VERIFY_CRC,
                          identity=_enc(identity or ""), batch_bytes=int(batch_bytes or 0))


def parse_info(raw, api_version):
    """The daemon info dict with the GPU fields normalised: a library or
    daemon that predates them reports no CUDA IPC path, with the reason;
    "restore" is true only for a daemon that serves restores and a library
    of C API 5 or later."""
    info = dict(raw)
    info["restore"] = bool(raw.get("restore")) and api_version >= RESTORE_API_VERSION
    info["restore_gather_timeout_ms"] = int(raw.get("restore_gather_timeout_ms") or 0)
    if api_version < CUDA_API_VERSION:
        info["cuda_ipc"] = False
        info["cuda_unavailable"] = (f"libckptd_client.so has C API version {api_version} "
                                    f"(CUDA IPC needs {CUDA_API_VERSION})")
    elif "cuda_ipc" not in raw:
        info["cuda_ipc"] = False
        info.setdefault("cuda_unavailable", "the daemon does not report a CUDA IPC path "
                                            "(an older daemon)")
    info["cuda_ipc"] = bool(info.get("cuda_ipc"))
    info["cuda_unavailable"] = str(info.get("cuda_unavailable") or "")
    info["pinned_staging_bytes"] = int(info.get("pinned_staging_bytes") or 0)
    info["cuda_devices"] = [str(d) for d in (info.get("cuda_devices") or [])]
    return info


def cuda_sources_array(sources):
    """A ckptd_cuda_source* array for SaveOptions.cuda_sources from a list
    parallel to the items (None: a host item). The array keeps the
    CudaSource objects alive (ctypes' _objects)."""
    arr = (ctypes.POINTER(CudaSource) * max(1, len(sources)))()
    for i, src in enumerate(sources):
        if src is not None:
            arr[i] = ctypes.pointer(src)
    return arr


def int64_array(values):
    values = list(values)
    return (ctypes.c_int64 * max(1, len(values)))(*values)
