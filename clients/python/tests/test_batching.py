"""How `Lathe.upsert` cuts a write into requests that fit in a message (no server needed), and
the plain types of operations."""

from __future__ import annotations

import json

import grpc
import pytest

from lathe_client import Lathe, LatheError, Operation, OperationKind, OperationState
from lathe_client._proto.lathe.v1 import lathe_pb2
from lathe_client.batching import batch_end
from lathe_client.client import retry_service_config


def test_batches_fill_up_to_their_bytes_and_always_take_one_document() -> None:
    sizes = [10, 20, 30, 500, 5]
    assert batch_end(sizes, 0, 60, 64) == 3
    assert batch_end(sizes, 0, 29, 64) == 1
    assert batch_end(sizes, 3, 60, 64) == 4  # a document larger than the batch goes alone
    assert batch_end(sizes, 0, 1000, 2) == 2  # the document count caps it too
    covered, start = [], 0
    while start < len(sizes):
        end = batch_end(sizes, start, 40, 64)
        assert end > start
        covered.extend(range(start, end))
        start = end
    assert covered == [0, 1, 2, 3, 4]


def documents(count: int, size: int) -> list[lathe_pb2.Document]:
    return [lathe_pb2.Document(id=f"d{i}", text="x" * size) for i in range(count)]


def test_an_upsert_is_split_under_the_message_size_with_a_write_id_per_part() -> None:
    # No call is made: the channel is never connected.
    with Lathe("127.0.0.1:1", max_message_bytes=16 * 1024) as lathe:
        requests = lathe._split_upsert("c", documents(40, 1000), "w")
        assert len(requests) > 1
        assert all(r.ByteSize() <= 16 * 1024 for r in requests)
        assert [d.id for r in requests for d in r.documents] == [f"d{i}" for i in range(40)]
        assert [r.write_id for r in requests] == [f"w/{i}" for i in range(len(requests))]
        assert all(r.collection == "c" and not r.wait for r in requests)
        # One request keeps the write id as given; "" stays "" (no deduplication).
        (single,) = lathe._split_upsert("c", documents(2, 1000), "w")
        assert single.write_id == "w"
        assert {r.write_id for r in lathe._split_upsert("c", documents(40, 1000), "")} == {""}
        # An empty upsert is still one request.
        assert len(lathe._split_upsert("c", [], "w")) == 1
        with pytest.raises(LatheError) as raised:
            lathe._split_upsert("c", documents(1, 20_000), "w")
        assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(ValueError, match="128"):
            lathe._split_upsert("c", documents(40, 1000), "w" * 127)
    with Lathe("127.0.0.1:1", max_batch_documents=3) as lathe:
        assert [len(r.documents) for r in lathe._split_upsert("c", documents(7, 10), "w")] == [3, 3, 1]


def test_the_retry_policy_covers_the_service_but_not_what_a_retry_would_apply_twice() -> None:
    config = json.loads(retry_service_config(5))
    retried, not_retried = config["methodConfig"]
    assert retried["name"] == [{"service": "lathe.v1.Lathe"}]
    policy = retried["retryPolicy"]
    assert policy["maxAttempts"] == 5
    assert set(policy["retryableStatusCodes"]) == {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
    assert {n["method"] for n in not_retried["name"]} == {
        "CreateCollection",
        "DeleteCollection",
        "CreateAlias",
        "DeleteAlias",
        "CreateSnapshot",
        "DeleteSnapshot",
        "RestoreSnapshot",
    }
    assert "retryPolicy" not in not_retried
    assert "retryPolicy" not in json.loads(retry_service_config(1))["methodConfig"][0]


def test_an_operation_reads_as_one_progress_line() -> None:
    running = Operation(
        id=4,
        collection="c",
        kind=OperationKind.UPSERT,
        state=OperationState.RUNNING,
        documents_total=500,
        documents_done=120,
        bytes_total=5_000_000,
        bytes_done=1_200_000,
        bytes_per_second=400_000.0,
        eta_seconds=9.5,
    )
    assert running.line() == (
        "operation 4 RUNNING: documents 120/500, 1.20/5.00 MB, 0.40 MB/s, ETA 9.5 s"
    )
    assert running.fraction_done == pytest.approx(0.24)
    assert not running.ended and not running.applied
    failed = Operation(id=5, collection="c", kind=OperationKind.DELETE, state=OperationState.FAILED, error="boom")
    assert failed.ended and failed.failed and failed.line().endswith(": boom")
