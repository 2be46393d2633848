"""Exceptions of the ckptd package.

Every failure reported by the daemon or the native library surfaces as a
CkptdError carrying the status code (gRPC / absl numbering) and the daemon's
message unchanged. Subclasses also derive from the matching builtin, so
`except FileNotFoundError` or `except ValueError` work as expected.

Each class knows its code (`InvalidArgument.code == INVALID_ARGUMENT`), so
code that raises one names only the message: `raise NotFound("...")`.
`error_for(code, message)` is the one mapping from a native status to its
class. The older form `Class(code, message)` is still accepted.
"""
import pickle

# Status codes (gRPC / absl numbering).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    OK: "OK", CANCELLED: "CANCELLED", UNKNOWN: "UNKNOWN", INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED", NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS", PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED", FAILED_PRECONDITION: "FAILED_PRECONDITION",
    ABORTED: "ABORTED", OUT_OF_RANGE: "OUT_OF_RANGE", UNIMPLEMENTED: "UNIMPLEMENTED",
    INTERNAL: "INTERNAL", UNAVAILABLE: "UNAVAILABLE", DATA_LOSS: "DATA_LOSS",
    UNAUTHENTICATED: "UNAUTHENTICATED",
}


def _message_and_code(cls, args, code):
    """(message, code) from the positional arguments of an error class:
    (message,) with `code` (None: the class's), or the older (code, message)."""
    if len(args) == 1:
        message = args[0]
    elif len(args) == 2 and isinstance(args[0], int) and code is None:
        code, message = args
    else:
        raise TypeError(f"{cls.__name__}(message, *, code=None) or {cls.__name__}(code, "
                        f"message); got {len(args)} positional arguments")
    return message, int(cls.code if code is None else code)


class CkptdError(RuntimeError):
    """A failed ckptd call. `code` is the numeric status code, `code_name`
    its name ("INVALID_ARGUMENT"), `message` the daemon's / library's text.

    CkptdError(message, code=X) raises any code without a class of its
    own; a subclass's code is its class attribute `code`, which `code=`
    overrides only where one class covers several codes (error_for)."""

    code = UNKNOWN

    def __init__(self, *args, code=None):
        message, code = _message_and_code(type(self), args, code)
        self.code = code
        self.code_name = CODE_NAMES.get(code, f"CODE_{code}")
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class InvalidArgument(CkptdError, ValueError):
    code = INVALID_ARGUMENT


class NotFound(CkptdError, FileNotFoundError):
    code = NOT_FOUND


class DeadlineExceeded(CkptdError, TimeoutError):
    code = DEADLINE_EXCEEDED


class PermissionDenied(CkptdError, PermissionError):
    code = PERMISSION_DENIED


class DaemonUnavailable(CkptdError, ConnectionError):
    """No daemon answered on the socket."""

    code = UNAVAILABLE


class CheckpointFailed(CkptdError):
    """A checkpoint ended FAILED or CANCELLED. `status` is its final
    CheckpointStatus; `code` the checkpoint's error code (UNKNOWN when the
    daemon gave none)."""

    code = UNKNOWN

    def __init__(self, *args, status=None, code=None):
        if len(args) == 3:  # the older (code, message, status)
            *args, status = args
        super().__init__(*args, code=code)
        self.status = status


class DataLoss(CkptdError):
    """The checkpoint's files are damaged (code DATA_LOSS): a payload whose
    CRC-32 does not match, a truncated or unparsable file. The message names
    the file, the item and the offset."""

    code = DATA_LOSS


class UnsafeCheckpointError(CkptdError, pickle.UnpicklingError):
    """A bytes item of the checkpoint pickles a global outside ckptd's
    allowlist (README "Security model"), which only a full unpickler would
    import or call: ckptd.load(..., weights_only=True) (the default) refuses
    it. `global_name` is "module.name", `fqn` the item. Code
    FAILED_PRECONDITION."""

    code = FAILED_PRECONDITION

    def __init__(self, message, global_name=None, fqn=None):
        super().__init__(message)
        self.global_name = global_name
        self.fqn = fqn


# The class of each code a native status may carry; any other code is a
# plain CkptdError. OUT_OF_RANGE (a box outside a tensor) is an invalid
# argument to Python, as ValueError covers both.
_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, DeadlineExceeded,
                                      PermissionDenied, DaemonUnavailable, DataLoss)}
_BY_CODE[OUT_OF_RANGE] = InvalidArgument


def error_for(code, message):
    """The exception for a native status (`code`, `message`): an instance of
    the code's class, carrying `code` itself."""
    code = int(code)
    return _BY_CODE.get(code, CkptdError)(message, code=code)
