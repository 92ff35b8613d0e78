"""The client's retry policy and operation waits, against an in-process Python gRPC server that
plays lathe.v1.Lathe with scripted answers (failures the real server gives only under load)."""

from __future__ import annotations

from concurrent import futures
from typing import Iterator

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from conftest import free_port
from lathe_client import Document, Lathe, LatheError, OperationFailed, OperationState
from lathe_client._proto.lathe.v1 import lathe_pb2, lathe_pb2_grpc
from lathe_client.client import WAIT_STEP_SECONDS


def queue_full_status() -> status_pb2.Status:
    retry, info = any_pb2.Any(), any_pb2.Any()
    retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=3)))
    info.Pack(error_details_pb2.ErrorInfo(reason="WRITE_QUEUE_FULL", domain="lathe"))
    return status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED, message="the write queue is full", details=[retry, info]
    )


class ScriptedLathe(lathe_pb2_grpc.LatheServicer):
    """Fails the first `failures` calls of each method with `code`, then answers."""

    def __init__(self, failures: int = 0, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.failures = failures
        self.code = code
        self.rich_status: status_pb2.Status | None = None
        self.calls: dict[str, list[object]] = {}
        # The states WaitOperation answers in turn (the last one repeats).
        self.wait_states = [lathe_pb2.OPERATION_STATE_APPLIED]
        self.wait_error = ""

    def _fail(self, method: str, request: object, context: grpc.ServicerContext) -> None:
        seen = self.calls.setdefault(method, [])
        seen.append(request)
        if len(seen) <= self.failures:
            if self.rich_status is not None:
                context.abort_with_status(rpc_status.to_status(self.rich_status))
            context.abort(self.code, f"scripted failure {len(seen)}")

    def UpsertDocuments(self, request, context):  # type: ignore[no-untyped-def]
        self._fail("UpsertDocuments", request, context)
        operation = lathe_pb2.Operation(
            id=7,
            collection=request.collection,
            state=lathe_pb2.OPERATION_STATE_QUEUED,
            documents_total=len(request.documents),
            write_id=request.write_id,
            consistency_token=7,
        )
        return lathe_pb2.WriteResponse(
            documents=len(request.documents),
            consistency_token=7,
            operation=operation,
            operation_ids=[7],
        )

    def DeleteDocuments(self, request, context):  # type: ignore[no-untyped-def]
        # As a replica answers: the write's log position, no operation.
        self.calls.setdefault("DeleteDocuments", []).append(request)
        return lathe_pb2.WriteResponse(documents=len(request.ids), consistency_token=42)

    def Retrieve(self, request, context):  # type: ignore[no-untyped-def]
        self.calls.setdefault("Retrieve", []).append(request)
        return lathe_pb2.RetrieveResponse(generation=9, log_position=request.consistency_token)

    def CreateCollection(self, request, context):  # type: ignore[no-untyped-def]
        self._fail("CreateCollection", request, context)
        return lathe_pb2.CollectionInfo(name=request.name)

    def CreateAlias(self, request, context):  # type: ignore[no-untyped-def]
        self._fail("CreateAlias", request, context)
        return lathe_pb2.Alias(alias=request.alias, collection=request.collection)

    def SwitchAlias(self, request, context):  # type: ignore[no-untyped-def]
        self._fail("SwitchAlias", request, context)
        return lathe_pb2.Alias(alias=request.alias, collection=request.collection)

    def WaitOperation(self, request, context):  # type: ignore[no-untyped-def]
        seen = self.calls.setdefault("WaitOperation", [])
        seen.append(request)
        state = self.wait_states[min(len(seen), len(self.wait_states)) - 1]
        return lathe_pb2.Operation(
            id=request.id,
            collection="c",
            state=state,
            documents_total=1,
            documents_done=1 if state == lathe_pb2.OPERATION_STATE_APPLIED else 0,
            error=self.wait_error if state == lathe_pb2.OPERATION_STATE_FAILED else "",
            sections=1 if state == lathe_pb2.OPERATION_STATE_APPLIED else 0,
            generation=3 if state == lathe_pb2.OPERATION_STATE_APPLIED else 0,
        )


@pytest.fixture()
def scripted() -> Iterator[tuple[str, ScriptedLathe]]:
    servicer = ScriptedLathe()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lathe_pb2_grpc.add_LatheServicer_to_server(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    yield address, servicer
    server.stop(None)


DOCUMENTS = [Document(id="a", text="Terns.")]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_a_write_answered_unavailable_or_resource_exhausted_is_retried_with_its_write_id(
    scripted: tuple[str, ScriptedLathe], code: grpc.StatusCode
) -> None:
    address, servicer = scripted
    servicer.failures, servicer.code = 2, code
    with Lathe(address) as lathe:
        written = lathe.upsert("c", DOCUMENTS)
    sent = servicer.calls["UpsertDocuments"]
    assert len(sent) == 3, "two failures, then the third attempt answers"
    write_ids = {request.write_id for request in sent}
    assert len(write_ids) == 1 and written.operation.write_id in write_ids
    assert written.operation_ids == (7,)


def test_retries_stop_at_max_attempts_and_the_error_carries_retry_info(
    scripted: tuple[str, ScriptedLathe],
) -> None:
    address, servicer = scripted
    servicer.failures, servicer.rich_status = 100, queue_full_status()
    with Lathe(address, max_attempts=2) as lathe:
        with pytest.raises(LatheError) as raised:
            lathe.upsert("c", DOCUMENTS)
    assert len(servicer.calls["UpsertDocuments"]) == 2
    error = raised.value
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (error.reason, error.domain, error.retry_after) == ("WRITE_QUEUE_FULL", "lathe", 3.0)


def test_no_retries_with_one_attempt_nor_for_other_codes_nor_collection_creation(
    scripted: tuple[str, ScriptedLathe],
) -> None:
    address, servicer = scripted
    servicer.failures, servicer.code = 1, grpc.StatusCode.UNAVAILABLE
    with Lathe(address, max_attempts=1) as single:
        with pytest.raises(LatheError) as raised:
            single.upsert("c", DOCUMENTS)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert len(servicer.calls["UpsertDocuments"]) == 1
    with Lathe(address) as lathe:
        # A retried CreateCollection that had been applied would answer ALREADY_EXISTS.
        with pytest.raises(LatheError):
            lathe.create_collection("c")
        assert len(servicer.calls["CreateCollection"]) == 1
        # As would a retried CreateAlias; a retried switch is the same switch.
        with pytest.raises(LatheError):
            lathe.create_alias("live", "c")
        assert len(servicer.calls["CreateAlias"]) == 1
        assert lathe.switch_alias("live", "c").collection == "c"
        assert len(servicer.calls["SwitchAlias"]) == 2
        servicer.calls.clear()
        servicer.code = grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(LatheError):
            lathe.upsert("c", DOCUMENTS)
        assert len(servicer.calls["UpsertDocuments"]) == 1


def test_wait_follows_the_operation_in_bounded_steps_and_reports_each_answer(
    scripted: tuple[str, ScriptedLathe],
) -> None:
    address, servicer = scripted
    servicer.wait_states = [
        lathe_pb2.OPERATION_STATE_QUEUED,
        lathe_pb2.OPERATION_STATE_RUNNING,
        lathe_pb2.OPERATION_STATE_APPLIED,
    ]
    seen = []
    with Lathe(address) as lathe:
        written = lathe.upsert("c", DOCUMENTS, wait=True, progress=seen.append)
    assert [o.state for o in seen] == [
        OperationState.QUEUED,
        OperationState.RUNNING,
        OperationState.APPLIED,
    ]
    waits = servicer.calls["WaitOperation"]
    assert all(w.id == 7 and 0 < w.timeout_ms <= WAIT_STEP_SECONDS * 1000 for w in waits)
    assert written.operation.state is OperationState.APPLIED
    assert (written.sections, written.generation) == (1, 3)


def test_a_failed_operation_raises_operation_failed(scripted: tuple[str, ScriptedLathe]) -> None:
    address, servicer = scripted
    servicer.wait_states = [lathe_pb2.OPERATION_STATE_FAILED]
    servicer.wait_error = "embedding model refused the text"
    with Lathe(address) as lathe:
        with pytest.raises(OperationFailed) as raised:
            lathe.upsert("c", DOCUMENTS, wait=True)
        # wait_operation answers the failed operation as it stands, without raising.
        assert lathe.wait_operation(7).state is OperationState.FAILED
    failed = raised.value
    assert failed.code is grpc.StatusCode.FAILED_PRECONDITION
    assert failed.operation_id == 7 and failed.operation.state is OperationState.FAILED
    assert "embedding model refused the text" in str(failed)


def test_with_replication_wait_reads_the_write_through_its_consistency_token(
    scripted: tuple[str, ScriptedLathe],
) -> None:
    address, servicer = scripted
    with Lathe(address) as lathe:
        queued = lathe.delete_documents("c", ["a"])
        assert servicer.calls.get("Retrieve") is None, "no wait, no barrier"
        assert (queued.operation, queued.operation_ids, queued.consistency_token) == (None, (), 42)
        waited = lathe.delete_documents("c", ["a"], wait=True)
    (barrier,) = servicer.calls["Retrieve"]
    assert barrier.collection == "c" and barrier.consistency_token == 42
    assert (waited.generation, waited.consistency_token, waited.documents) == (9, 42, 1)
