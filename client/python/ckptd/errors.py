"""Exceptions of the ckptd package.

Every failure reported by the daemon or the native library surfaces as a
CkptdError carrying the status code (gRPC / absl numbering) and the daemon's
message unchanged. Subclasses also derive from the matching builtin, so
`except FileNotFoundError` or `except ValueError` work as expected.
"""
import pickle

CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class CkptdError(RuntimeError):
    """A failed ckptd call. `code` is the numeric status code, `code_name`
    its name ("INVALID_ARGUMENT"), `message` the daemon's / library's text."""

    def __init__(self, code, message):
        self.code = int(code)
        self.code_name = CODE_NAMES.get(self.code, f"CODE_{self.code}")
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class InvalidArgument(CkptdError, ValueError):
    pass


class NotFound(CkptdError, FileNotFoundError):
    pass


class DeadlineExceeded(CkptdError, TimeoutError):
    pass


class PermissionDenied(CkptdError, PermissionError):
    pass


class DaemonUnavailable(CkptdError, ConnectionError):
    """No daemon answered on the socket."""


class CheckpointFailed(CkptdError):
    """A checkpoint ended FAILED or CANCELLED. `status` is its final
    CheckpointStatus."""

    def __init__(self, code, message, status=None):
        super().__init__(code, message)
        self.status = status


class DataLoss(CkptdError):
    """The checkpoint's files are damaged (code DATA_LOSS): a payload whose
    CRC-32 does not match, a truncated or unparsable file. The message names
    the file, the item and the offset."""


class UnsafeCheckpointError(CkptdError, pickle.UnpicklingError):
    """A bytes item of the checkpoint pickles a global outside ckptd's
    allowlist (README "Security model"), which only a full unpickler would
    import or call: ckptd.load(..., weights_only=True) (the default) refuses
    it. `global_name` is "module.name", `fqn` the item. Code
    FAILED_PRECONDITION."""

    def __init__(self, message, global_name=None, fqn=None):
        super().__init__(9, message)
        self.global_name = global_name
        self.fqn = fqn


_BY_CODE = {3: InvalidArgument, 11: InvalidArgument, 5: NotFound, 4: DeadlineExceeded,
            7: PermissionDenied, 14: DaemonUnavailable, 15: DataLoss}


def error_for(code, message):
    """The CkptdError subclass instance for a status code."""
    return _BY_CODE.get(int(code), CkptdError)(code, message)
