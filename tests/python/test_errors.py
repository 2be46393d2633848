"""ckptd's exception classes: each knows its status code, error_for maps a
native status (code + message) to its class, and the older
Class(code, message) form still works. No daemon or native library needed."""
import pickle
import sys

import pytest

import pyclient_util

pytest.importorskip("torch")
if str(pyclient_util.PACKAGE_DIR) not in sys.path:
    sys.path.insert(0, str(pyclient_util.PACKAGE_DIR))

import ckptd  # noqa: E402
from ckptd import errors  # noqa: E402

CLASSES = [
    (ckptd.InvalidArgument, errors.INVALID_ARGUMENT, ValueError),
    (ckptd.NotFound, errors.NOT_FOUND, FileNotFoundError),
    (ckptd.DeadlineExceeded, errors.DEADLINE_EXCEEDED, TimeoutError),
    (ckptd.PermissionDenied, errors.PERMISSION_DENIED, PermissionError),
    (ckptd.DaemonUnavailable, errors.UNAVAILABLE, ConnectionError),
    (ckptd.DataLoss, errors.DATA_LOSS, ckptd.CkptdError),
]


@pytest.mark.parametrize("cls,code,builtin", CLASSES, ids=lambda x: getattr(x, "__name__", x))
def test_each_class_carries_its_code(cls, code, builtin):
    e = cls("what went wrong")
    assert cls.code == code and e.code == code
    assert e.code_name == errors.CODE_NAMES[code]
    assert e.message == "what went wrong"
    assert str(e) == f"{errors.CODE_NAMES[code]}: what went wrong"
    assert isinstance(e, ckptd.CkptdError) and isinstance(e, builtin)
    # The older form names the code twice; it still gives the same error.
    old = cls(code, "what went wrong")
    assert (old.code, old.message, str(old)) == (e.code, e.message, str(e))


@pytest.mark.parametrize("code", range(17))
def test_error_for_maps_every_native_code(code):
    e = errors.error_for(code, f"status {code}")
    want = {errors.INVALID_ARGUMENT: ckptd.InvalidArgument,
            errors.OUT_OF_RANGE: ckptd.InvalidArgument,
            errors.NOT_FOUND: ckptd.NotFound,
            errors.DEADLINE_EXCEEDED: ckptd.DeadlineExceeded,
            errors.PERMISSION_DENIED: ckptd.PermissionDenied,
            errors.UNAVAILABLE: ckptd.DaemonUnavailable,
            errors.DATA_LOSS: ckptd.DataLoss}.get(code, ckptd.CkptdError)
    assert type(e) is want, (code, type(e))
    assert e.code == code and e.message == f"status {code}"
    assert str(e).startswith(errors.CODE_NAMES[code] + ": ")


def test_error_for_unknown_code_keeps_it():
    e = errors.error_for(99, "from the future")
    assert type(e) is ckptd.CkptdError and e.code == 99 and e.code_name == "CODE_99"


def test_plain_error_with_another_code():
    e = ckptd.CkptdError("daemon has no peer service", code=errors.FAILED_PRECONDITION)
    assert e.code == 9 and str(e) == "FAILED_PRECONDITION: daemon has no peer service"
    assert ckptd.CkptdError("x").code == errors.UNKNOWN


def test_checkpoint_failed_keeps_the_checkpoints_code_and_status():
    st = ckptd.CheckpointStatus(checkpoint_id="/c", state="FAILED", error="disk full",
                                error_code=errors.RESOURCE_EXHAUSTED)
    e = ckptd.CheckpointFailed("checkpoint /c FAILED: disk full", status=st, code=st.error_code)
    assert e.code == errors.RESOURCE_EXHAUSTED and e.status is st
    assert ckptd.CheckpointFailed("no code given", status=st).code == errors.UNKNOWN
    old = ckptd.CheckpointFailed(13, "m", st)
    assert (old.code, old.message, old.status) == (13, "m", st)


def test_unsafe_checkpoint_error_is_failed_precondition():
    e = ckptd.UnsafeCheckpointError("os.system is not allowed", "os.system", "optim.x")
    assert e.code == errors.FAILED_PRECONDITION and e.global_name == "os.system"
    assert e.fqn == "optim.x" and isinstance(e, pickle.UnpicklingError)


def test_misused_constructor_says_how():
    with pytest.raises(TypeError, match=r"NotFound\(message, \*, code=None\)"):
        ckptd.NotFound("a", "b")
    with pytest.raises(TypeError):
        ckptd.NotFound()
