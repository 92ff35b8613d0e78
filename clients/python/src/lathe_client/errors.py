"""The one exception type of the client."""

from __future__ import annotations

import grpc


class LatheError(Exception):
    """A failed call. `code` is the gRPC status code (e.g. grpc.StatusCode.INVALID_ARGUMENT),
    `details` the server's message (for invalid arguments it names the field)."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "") -> None:
        self.code = code
        self.details = details
        self.method = method
        where = f" in {method}" if method else ""
        super().__init__(f"{code.name}{where}: {details}")

    @property
    def code_name(self) -> str:
        """The status code's name, e.g. "INVALID_ARGUMENT"."""
        return self.code.name

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, method: str = "") -> "LatheError":
        # Errors raised by a call are also grpc.Call objects carrying code() and details().
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", method)
