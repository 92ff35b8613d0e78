"""Queued writes and their operations, against a real `lathe serve`: a write is answered at once
with its operation, `wait=True` follows it through WaitOperation, write ids deduplicate, and a
wait that runs out names the operation, which is applied all the same."""

from __future__ import annotations

import uuid
from typing import Callable

import grpc
import pytest

from conftest import ServerProcess
from lathe_client import (
    Document,
    Lathe,
    LatheError,
    Operation,
    OperationKind,
    OperationState,
    WriteQueued,
)
from lathe_client._proto.lathe.v1 import lathe_pb2


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def backlog(lathe: Lathe, collection: str, documents: int = 12) -> int:
    """Queues a write that takes the index worker a while (it embeds every section), so that
    a write queued after it stays QUEUED for that while; returns its operation id."""
    written = lathe.upsert(
        collection,
        [
            Document(id=f"backlog-{i}", text=f"Backlog entry {i} describes glaciers and fjords. " * 40)
            for i in range(documents)
        ],
    )
    assert written.operation is not None
    return written.operation.id


def queued_behind_a_backlog(lathe: Lathe, collection: str, write: Callable[[int], object]) -> WriteQueued:
    """`write(attempt)` after a backlog, expected to raise WriteQueued; on a server fast enough
    to apply the backlog within the write's wait, again behind a backlog 4 times larger."""
    documents = 12
    for attempt in range(4):
        backlog(lathe, collection, documents)
        try:
            write(attempt)
        except WriteQueued as queued:
            return queued
        documents *= 4
    pytest.fail("every write was applied within its wait, even behind the largest backlog")


def test_an_upsert_returns_at_once_with_its_operation(lathe: Lathe) -> None:
    name = unique_name("queued")
    lathe.create_collection(name)
    written = lathe.upsert(
        name, [Document(id=f"d{i}", text=f"Note {i} on gannets diving.") for i in range(3)]
    )
    operation = written.operation
    assert operation is not None
    assert operation.state in (OperationState.QUEUED, OperationState.RUNNING, OperationState.APPLIED)
    assert operation.kind is OperationKind.UPSERT
    assert operation.collection == name
    assert operation.documents_total == 3
    assert written.documents == 3
    assert written.operation_ids == (operation.id,)
    # On a single node an operation's id is the write's consistency token.
    assert written.consistency_token == operation.id == operation.consistency_token
    # A write id is sent by default: a fresh uuid4 per call.
    assert uuid.UUID(operation.write_id).version == 4
    # Read your writes: a retrieve carrying the token waits until the write is visible.
    found = lathe.retrieve(name, "gannets diving", budget=64, consistency_token=written.consistency_token)
    assert found.chunks and found.chunks[0].doc_id in {"d0", "d1", "d2"}
    assert lathe.get_operation(operation.id).state is OperationState.APPLIED
    assert lathe.get_collection(name).stats.documents == 3


def test_wait_reaches_applied_reports_progress_and_the_documents_are_retrievable(
    lathe: Lathe,
) -> None:
    name = unique_name("waited")
    lathe.create_collection(name)
    backlog(lathe, name, documents=4)
    seen: list[Operation] = []
    written = lathe.upsert(
        name,
        [Document(id="puffin", text="Puffins nest in burrows on sea cliffs.")],
        wait=True,
        progress=seen.append,
    )
    assert written.operation is not None and written.operation.state is OperationState.APPLIED
    assert written.sections >= 1 and written.generation > 0
    assert seen, "progress is called after each WaitOperation answer"
    assert all(isinstance(o, Operation) and o.id == written.operation.id for o in seen)
    assert seen[-1].state is OperationState.APPLIED
    assert seen[-1].documents_done == seen[-1].documents_total == 1
    assert lathe.retrieve(name, "puffins burrows", budget=64).chunks[0].doc_id == "puffin"


def test_the_same_write_id_three_times_is_one_operation_applied_once(lathe: Lathe) -> None:
    name = unique_name("dedupe")
    lathe.create_collection(name)
    documents = [Document(id=f"k{i}", text=f"Kittiwake colony {i} on the ledge.") for i in range(4)]
    write_id = f"import-{uuid.uuid4()}"
    answers = [lathe.upsert(name, documents, write_id=write_id) for _ in range(3)]
    ids = {a.operation.id for a in answers if a.operation is not None}
    assert len(ids) == 1, ids
    (operation_id,) = ids
    assert all(a.operation_ids == (operation_id,) for a in answers)
    assert lathe.wait_operation(operation_id).state is OperationState.APPLIED
    # The same once more, with wait: already applied, nothing queued.
    again = lathe.upsert(name, documents, write_id=write_id, wait=True)
    assert again.operation_ids == (operation_id,)
    operations = lathe.list_operations(name)
    assert [o.id for o in operations] == [operation_id], "applied once: one operation"
    assert operations[0].write_id == write_id
    assert lathe.get_collection(name).stats.documents == 4
    # The id reused for a different write is refused, naming write_id.
    with pytest.raises(LatheError) as raised:
        lathe.upsert(name, documents[:1], write_id=write_id)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "write_id" in raised.value.details


def test_operations_are_listed_newest_first_and_read_one_by_one(lathe: Lathe) -> None:
    name = unique_name("ops")
    lathe.create_collection(name)
    first = lathe.upsert(name, [Document(id="a", text="Albatross glides.")], wait=True)
    second = lathe.upsert(name, [Document(id="b", text="Bittern booms.")], wait=True)
    deleted = lathe.delete_documents(name, ["a"], wait=True, write_id=f"delete-{uuid.uuid4()}")
    listed = lathe.list_operations(name)
    assert [o.id for o in listed] == [
        deleted.operation.id,
        second.operation.id,
        first.operation.id,
    ]
    assert listed[0].kind is OperationKind.DELETE and listed[0].write_id.startswith("delete-")
    assert all(o.state is OperationState.APPLIED for o in listed)
    assert [o.id for o in lathe.list_operations(name, limit=1)] == [deleted.operation.id]
    one = lathe.get_operation(second.operation.id)
    assert one.collection == name and one.documents_total == 1 and one.sections >= 1
    assert one.created_unix_ms <= one.started_unix_ms <= one.finished_unix_ms
    assert lathe.get_collection(name).stats.documents == 1
    with pytest.raises(LatheError) as missing:
        lathe.get_operation(2**60)
    assert missing.value.code is grpc.StatusCode.NOT_FOUND
    with pytest.raises(LatheError) as too_many:
        lathe.list_operations(name, limit=5000)
    assert too_many.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_a_wait_that_runs_out_raises_write_queued_naming_the_operation_which_then_applies(
    lathe: Lathe,
) -> None:
    name = unique_name("late")
    lathe.create_collection(name)
    queued = queued_behind_a_backlog(
        lathe,
        name,
        lambda attempt: lathe.upsert(
            name,
            [Document(id=f"late-{attempt}", text="Storm petrels feed at night.")],
            wait=True,
            timeout=0,
        ),
    )
    assert queued.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert queued.collection == name and queued.write_id
    assert queued.operation is not None and queued.operation.id == queued.operation_id
    assert not queued.operation.ended
    assert queued.operation_ids == (queued.operation_id,)
    assert str(queued.operation_id) in str(queued)
    applied = lathe.wait_operation(queued.operation_id)
    assert applied.state is OperationState.APPLIED
    assert lathe.retrieve(name, "storm petrels", budget=64).chunks[0].doc_id.startswith("late-")


def test_the_servers_write_queued_answer_names_the_operation(server: ServerProcess) -> None:
    """A write sent with the server-side `wait` whose deadline passes: DEADLINE_EXCEEDED with
    an ErrorInfo (reason WRITE_QUEUED, domain lathe) that the client turns into WriteQueued."""
    name = unique_name("serverwait")
    with Lathe(server.address) as lathe, Lathe(server.address, timeout=0.3) as hurried:
        lathe.create_collection(name)
        hurried.health()  # connected before the deadline starts counting

        def write(attempt: int) -> None:
            request = lathe_pb2.UpsertDocumentsRequest(
                collection=name,
                documents=[lathe_pb2.Document(id="shag", text="Shags dry their wings.")],
                wait=True,
                write_id=f"server-wait-{attempt}",
            )
            hurried._call("UpsertDocuments", hurried._stub.UpsertDocuments, request)

        queued = queued_behind_a_backlog(lathe, name, write)
        assert queued.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert (queued.reason, queued.domain) == ("WRITE_QUEUED", "lathe")
        assert queued.metadata["collection"] == name
        assert queued.write_id.startswith("server-wait-") and queued.collection == name
        assert lathe.wait_operation(queued.operation_id).state is OperationState.APPLIED
        assert lathe.get_operation(queued.operation_id).write_id == queued.write_id


def test_an_upsert_larger_than_a_message_is_sent_in_parts_with_derived_write_ids(
    server: ServerProcess,
) -> None:
    name = unique_name("parts")
    documents = [Document(id=f"p{i}", text=f"Part {i} of the survey of eiders. " * 60) for i in range(5)]
    write_id = f"survey-{uuid.uuid4()}"
    # Each document is about 2 KB as a message: at most one fits in 4 KiB with the envelope.
    with Lathe(server.address, max_message_bytes=4096) as small:
        small.create_collection(name)
        written = small.upsert(name, documents, write_id=write_id, wait=True)
        assert len(written.operation_ids) == 5
        assert written.documents == 5
        assert written.operation is not None and written.operation.id == written.operation_ids[-1]
        assert written.consistency_token == written.operation_ids[-1]
        listed = {o.id: o for o in small.list_operations(name)}
        assert [listed[i].write_id for i in written.operation_ids] == [
            f"{write_id}/{i}" for i in range(5)
        ]
        assert all(listed[i].state is OperationState.APPLIED for i in written.operation_ids)
        # Sent again: every part deduplicated, nothing applied twice.
        again = small.upsert(name, documents, write_id=write_id)
        assert again.operation_ids == written.operation_ids
        with pytest.raises(LatheError) as too_large:
            small.upsert(name, [Document(id="huge", text="x" * 8192)])
        assert too_large.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "huge" in too_large.value.details
    with Lathe(server.address, max_batch_documents=2) as counted:
        split = counted.upsert(name, documents, write_id=f"counted-{uuid.uuid4()}")
        assert len(split.operation_ids) == 3
        counted.wait_operation(split.operation_ids[-1])
        assert counted.get_collection(name).stats.documents == 5


def test_an_upload_gives_each_message_its_write_id_and_operation(lathe: Lathe) -> None:
    name = unique_name("stream")
    lathe.create_collection(name)
    write_id = f"stream-{uuid.uuid4()}"
    batches = (
        [Document(id=f"s{b}-{i}", text=f"Batch {b} item {i} about skuas.") for i in range(2)]
        for b in range(3)
    )
    seen: list[Operation] = []
    written = lathe.upload(name, batches, wait=True, write_id=write_id, progress=seen.append)
    assert written.documents == 6 and len(written.operation_ids) == 3
    assert written.operation is not None and written.operation.state is OperationState.APPLIED
    listed = {o.id: o for o in lathe.list_operations(name)}
    assert [listed[i].write_id for i in written.operation_ids] == [
        f"{write_id}/{i}" for i in range(3)
    ]
    assert {o.id for o in seen} == set(written.operation_ids)
    assert lathe.get_collection(name).stats.documents == 6
