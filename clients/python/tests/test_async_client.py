"""AsyncLathe (grpc.aio) against a real `lathe serve`, its retry policy against the scripted
server of test_retries, and its parity with Lathe's public methods."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from typing import AsyncIterator, Awaitable, Callable, TypeVar

import grpc
import pytest

from conftest import ServerProcess
from lathe_client import (
    AsyncLathe,
    Document,
    Lathe,
    LatheError,
    OperationFailed,
    OperationState,
    ResultOrder,
)
from lathe_client._proto.lathe.v1 import lathe_pb2
from test_retries import DOCUMENTS, ScriptedLathe, queue_full_status, scripted  # noqa: F401

T = TypeVar("T")

GUIDE = (
    "# Installing Lathe\n\nLathe ships as one binary.\n\n"
    "## Ports\n\nThe gRPC API listens on port 50051. Café owners welcome.\n"
)
PUFFINS = "Puffins nest in burrows on sea cliffs and eat sand eels."


def run(address: str, scenario: Callable[[AsyncLathe], Awaitable[T]], **kwargs: object) -> T:
    """Runs `scenario` with an AsyncLathe made inside the event loop that runs it."""

    async def main() -> T:
        async with AsyncLathe(address, **kwargs) as lathe:  # type: ignore[arg-type]
            return await scenario(lathe)

    return asyncio.run(main())


def test_async_lathe_has_the_public_methods_of_lathe_as_coroutines() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, asynchronous = public(Lathe), public(AsyncLathe)
    assert set(sync) == set(asynchronous)
    for name, signature in sync.items():
        assert inspect.iscoroutinefunction(getattr(AsyncLathe, name)), name
        # The same parameters, kinds and defaults (annotations may widen: upload takes async
        # iterables too).
        assert [
            (p.name, p.kind, p.default) for p in asynchronous[name].parameters.values()
        ] == [(p.name, p.kind, p.default) for p in signature.parameters.values()], name
    assert list(inspect.signature(AsyncLathe.__init__).parameters) == list(
        inspect.signature(Lathe.__init__).parameters
    )


def test_collections_writes_operations_and_retrieval_through_grpc_aio(
    server: ServerProcess, lathe: Lathe
) -> None:
    name = f"aio-{uuid.uuid4().hex[:10]}"
    seen: list[OperationState] = []

    async def scenario(client: AsyncLathe) -> None:
        assert await client.health() == "SERVING"
        await client.wait_until_ready(timeout=5)
        created = await client.create_collection(name)
        assert created.name == name and created.stats.documents == 0
        with pytest.raises(LatheError) as raised:
            await client.create_collection(name)
        assert raised.value.code is grpc.StatusCode.ALREADY_EXISTS
        assert (await client.create_collection(name, exist_ok=True)).name == name
        assert name in [c.name for c in await client.list_collections()]
        alias = f"{name}-alias"
        assert (await client.create_alias(alias, name)).collection == name
        assert (await client.switch_alias(alias, name)).collection == name
        assert alias in [a.alias for a in await client.list_aliases()]
        await client.delete_alias(alias)
        assert alias not in [a.alias for a in await client.list_aliases()]

        written = await client.upsert(
            name,
            [
                Document(id="guide.md", text=GUIDE, format="markdown", metadata={"kind": "guide"}),
                {"id": "puffins.txt", "text": PUFFINS},
            ],
            wait=True,
            progress=lambda operation: seen.append(operation.state),
        )
        assert written.documents == 2 and written.sections >= 2 and written.generation > 0
        assert written.operation.state is OperationState.APPLIED

        result = await client.retrieve(name, "which port does the API listen on", budget=64)
        best = result.chunks[0]
        assert best.doc_id == "guide.md" and "50051" in best.text
        assert GUIDE[best.char_span.start : best.char_span.end] == best.text
        assert GUIDE.encode()[best.byte_span.start : best.byte_span.end].decode() == best.text
        assert result.tokens_used <= 64

        # The same request through the sync client answers the same chunks.
        same = lathe.retrieve(name, "which port does the API listen on", budget=64)
        assert [(c.doc_id, c.char_span, c.text) for c in same.chunks] == [
            (c.doc_id, c.char_span, c.text) for c in result.chunks
        ]
        filtered = await client.retrieve(
            name, "nest cliffs port", budget=256, metadata={"kind": "guide"},
            order=ResultOrder.POSITION,
        )
        assert {c.doc_id for c in filtered.chunks} == {"guide.md"}

        # Without wait the operation is followed by hand.
        queued = await client.delete_documents(name, ["puffins.txt"])
        assert queued.operation is not None and queued.operation_ids == (queued.operation.id,)
        ended = await client.wait_operation(queued.operation.id, timeout=60)
        assert ended.state is OperationState.APPLIED
        assert (await client.get_operation(ended.id)).state is OperationState.APPLIED
        listed = await client.list_operations(name)
        assert [o.id for o in listed][:1] == [ended.id], "newest first"
        after = await client.retrieve(
            name, "puffins", budget=256, consistency_token=queued.consistency_token
        )
        assert "puffins.txt" not in {c.doc_id for c in after.chunks}
        assert (await client.get_collection(name)).stats.documents == 1

        # upload streams batches, from an async iterable too.
        async def batches() -> AsyncIterator[list[Document]]:
            for i in range(2):
                yield [Document(id=f"up{i}.txt", text=f"Batch {i} talks about gannets.")]

        uploaded = await client.upload(name, batches(), wait=True, write_id="aio-upload")
        assert uploaded.documents == 2 and len(uploaded.operation_ids) == 2
        operations = {o.id: o for o in await client.list_operations(name)}
        assert [operations[i].write_id for i in uploaded.operation_ids] == [
            "aio-upload/0",
            "aio-upload/1",
        ]
        assert (await client.get_collection(name)).stats.documents == 3

        with pytest.raises(LatheError) as raised:
            await client.retrieve(name, "x", budget=0)
        assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.method == "Retrieve"
        deleted = await client.delete_collection(name)
        assert deleted.name == name
        with pytest.raises(LatheError) as raised:
            await client.get_collection(name)
        assert raised.value.code is grpc.StatusCode.NOT_FOUND

    run(server.address, scenario)
    assert seen and seen[-1] is OperationState.APPLIED


def test_async_calls_are_retried_by_the_same_policy_with_their_write_id(
    scripted: tuple[str, ScriptedLathe],  # noqa: F811
) -> None:
    address, servicer = scripted
    servicer.failures, servicer.code = 2, grpc.StatusCode.RESOURCE_EXHAUSTED
    written = run(address, lambda client: client.upsert("c", DOCUMENTS))
    sent = servicer.calls["UpsertDocuments"]
    assert len(sent) == 3, "two failures, then the third attempt answers"
    assert {r.write_id for r in sent} == {written.operation.write_id}


def test_async_retries_stop_at_max_attempts_and_the_error_carries_its_details(
    scripted: tuple[str, ScriptedLathe],  # noqa: F811
) -> None:
    address, servicer = scripted
    servicer.failures, servicer.rich_status = 100, queue_full_status()

    async def scenario(client: AsyncLathe) -> LatheError:
        with pytest.raises(LatheError) as raised:
            await client.upsert("c", DOCUMENTS)
        return raised.value

    error = run(address, scenario, max_attempts=2)
    assert len(servicer.calls["UpsertDocuments"]) == 2
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (error.reason, error.domain, error.retry_after) == ("WRITE_QUEUE_FULL", "lathe", 3.0)
    # CreateCollection is not retried.
    servicer.calls.clear()
    servicer.failures, servicer.rich_status, servicer.code = 1, None, grpc.StatusCode.UNAVAILABLE

    async def create(client: AsyncLathe) -> None:
        with pytest.raises(LatheError):
            await client.create_collection("c")

    run(address, create)
    assert len(servicer.calls["CreateCollection"]) == 1


def test_async_waits_report_progress_and_a_failed_operation_raises(
    scripted: tuple[str, ScriptedLathe],  # noqa: F811
) -> None:
    address, servicer = scripted
    servicer.wait_states = [
        lathe_pb2.OPERATION_STATE_QUEUED,
        lathe_pb2.OPERATION_STATE_APPLIED,
    ]
    seen: list[OperationState] = []
    written = run(
        address,
        lambda client: client.upsert(
            "c", DOCUMENTS, wait=True, progress=lambda o: seen.append(o.state)
        ),
    )
    assert seen == [OperationState.QUEUED, OperationState.APPLIED]
    assert (written.sections, written.generation) == (1, 3)

    servicer.calls.clear()
    servicer.wait_states, servicer.wait_error = [lathe_pb2.OPERATION_STATE_FAILED], "refused"

    async def failing(client: AsyncLathe) -> OperationFailed:
        with pytest.raises(OperationFailed) as raised:
            await client.upsert("c", DOCUMENTS, wait=True)
        return raised.value

    failed = run(address, failing)
    assert failed.operation_id == 7 and "refused" in str(failed)

    # With replication (no operations), wait reads the write through its consistency token.
    waited = run(address, lambda client: client.delete_documents("c", ["a"], wait=True))
    (barrier,) = servicer.calls["Retrieve"]
    assert barrier.consistency_token == 42
    assert (waited.generation, waited.consistency_token) == (9, 42)
