"""The client's exceptions: `LatheError` for every failed call, and two subclasses for writes
that were stored but are not (yet) applied."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import grpc

if TYPE_CHECKING:
    from lathe_client.types import Operation

# The domain of the server's google.rpc.ErrorInfo details.
ERROR_DOMAIN = "lathe"
# ErrorInfo reasons the client acts on.
REASON_WRITE_QUEUED = "WRITE_QUEUED"
REASON_WRITE_QUEUE_FULL = "WRITE_QUEUE_FULL"


class LatheError(Exception):
    """A failed call. `code` is the gRPC status code (e.g. grpc.StatusCode.INVALID_ARGUMENT),
    `details` the server's message (for invalid arguments it names the field).

    When the server attached google.rpc details: `reason`, `domain` and `metadata` are its
    ErrorInfo (e.g. reason "WRITE_QUEUE_FULL", domain "lathe"), and `retry_after` its RetryInfo
    delay in seconds (a full write queue says when to try again); otherwise "", "", {} and None."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        method: str = "",
        *,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.details = details
        self.method = method
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        where = f" in {method}" if method else ""
        super().__init__(f"{code.name}{where}: {details}")

    @property
    def code_name(self) -> str:
        """The status code's name, e.g. "INVALID_ARGUMENT"."""
        return self.code.name

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, method: str = "") -> "LatheError":
        """The error of a failed call; a `WriteQueued` when the server says the write is stored
        but its wait ran out (DEADLINE_EXCEEDED with ErrorInfo reason WRITE_QUEUED)."""
        # Errors raised by a call are also grpc.Call objects carrying code() and details().
        code = (error.code() if hasattr(error, "code") else None) or grpc.StatusCode.UNKNOWN
        details = (error.details() if hasattr(error, "details") else None) or ""
        if not hasattr(error, "code"):
            details = str(error)
        reason, domain, metadata, retry_after = _status_details(error)
        if domain == ERROR_DOMAIN and reason == REASON_WRITE_QUEUED and "operation_id" in metadata:
            return WriteQueued(
                details,
                method,
                operation_id=int(metadata["operation_id"]),
                collection=metadata.get("collection", ""),
                write_id=metadata.get("write_id", ""),
                code=code,
                reason=reason,
                domain=domain,
                metadata=metadata,
            )
        return cls(
            code,
            details,
            method,
            reason=reason,
            domain=domain,
            metadata=metadata,
            retry_after=retry_after,
        )


class WriteQueued(LatheError):
    """A write that is stored in the server's durable write queue and will be applied, but was
    not visible within the wait asked for (code DEADLINE_EXCEEDED). `operation_id` names the
    operation to follow (`Lathe.wait_operation`, `Lathe.get_operation`); `operation` is its
    state as last seen by the client (None when the server's answer named only the id), and
    `operation_ids` every operation of the write (several when `upsert` sent it in parts; the
    ones before `operation_id` are applied)."""

    def __init__(
        self,
        details: str,
        method: str = "",
        *,
        operation_id: int,
        collection: str = "",
        write_id: str = "",
        operation: "Operation | None" = None,
        operation_ids: tuple[int, ...] = (),
        code: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED,
        reason: str = REASON_WRITE_QUEUED,
        domain: str = ERROR_DOMAIN,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            code,
            details,
            method,
            reason=reason,
            domain=domain,
            metadata=metadata
            if metadata is not None
            else {
                "operation_id": str(operation_id),
                "collection": collection,
                "write_id": write_id,
            },
        )
        self.operation_id = operation_id
        self.collection = collection
        self.write_id = write_id
        self.operation = operation
        self.operation_ids = operation_ids or (operation_id,)


class OperationFailed(LatheError):
    """A queued write whose operation ended FAILED (code FAILED_PRECONDITION, as the server's
    own answer to a `wait` write that failed). `operation` is the failed operation: its `error`
    says why, and with `documents_done` > 0 it was applied up to that document."""

    def __init__(self, operation: "Operation", method: str = "") -> None:
        super().__init__(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"operation {operation.id} of collection `{operation.collection}` failed: "
            f"{operation.error or 'no reason given'}",
            method,
        )
        self.operation = operation
        self.operation_id = operation.id


def _status_details(
    error: grpc.RpcError,
) -> tuple[str, str, dict[str, str], float | None]:
    """ErrorInfo (reason, domain, metadata) and RetryInfo (seconds) of the call's
    google.rpc.Status, read from its `grpc-status-details-bin` trailer."""
    reason, domain, metadata, retry_after = "", "", {}, None
    if not hasattr(error, "trailing_metadata"):
        return reason, domain, metadata, retry_after
    try:
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except (ImportError, ValueError, TypeError, AttributeError):
        # No grpcio-status, or a Status whose code or message disagree with the call's.
        return reason, domain, metadata, retry_after
    if status is None:
        return reason, domain, metadata, retry_after
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    return reason, domain, metadata, retry_after
