"""The client against a real `lathe serve` process."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
from tokenizers import Tokenizer

from conftest import models_dir, start_server
from lathe_client import (
    Alias,
    Chunking,
    CollectionDeleted,
    ChunkStrategy,
    CollectionState,
    Document,
    DocumentFormat,
    Lathe,
    LatheError,
    OperationState,
    Recovery,
    ResultOrder,
)

MARKDOWN = (
    "# Installing Lathe\n\nLathe ships as one binary.\n\n"
    "## On Debian\n\nRun the installer with apt and then start the service. "
    "The daemon listens on port 50051.\n\n"
    "## On macOS\n\nUse Homebrew to install the formula. Café and naïve users welcome.\n"
)
VOLCANO = (
    "# Volcanoes\n\nA volcano is a rupture in the crust of a planet.\n\n"
    "## Eruptions\n\nMagma rises through vents and erupts as lava flows and ash clouds.\n"
)
PLAIN = (
    "The quarterly report showed revenue growth of twelve percent.\n\n"
    "The board approved a new dividend policy for shareholders.\n\n"
    "Operating costs fell because the logistics network was consolidated into three hubs."
)
LONG_PLAIN = " ".join(
    f"Paragraph {i} discusses the migration of arctic terns and their long flights." for i in range(60)
)


@pytest.fixture(scope="module")
def minilm() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(models_dir() / "minilm" / "tokenizer.json"))
    # The file ships fixed padding and truncation at 128; budgets count the real tokens.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def docs(lathe: Lathe) -> str:
    name = unique_name("docs")
    lathe.create_collection(name)
    written = lathe.upsert(
        name,
        [
            Document(id="guide.md", text=MARKDOWN, format=DocumentFormat.MARKDOWN, title="Guide"),
            Document(id="volcano.md", text=VOLCANO, format="markdown", metadata={"topic": "geo"}),
            {"id": "report.txt", "text": PLAIN, "metadata": {"topic": "finance"}},
            Document(id="terns.txt", text=LONG_PLAIN),
        ],
        wait=True,
    )
    assert written.documents == 4
    assert written.sections >= 4
    assert written.generation > 0, "a wait write reports the generation it is visible at"
    return name


def test_health_reports_serving_for_the_server_and_the_lathe_service(lathe: Lathe) -> None:
    assert lathe.health("") == "SERVING"
    assert lathe.health("lathe.v1.Lathe") == "SERVING"


def test_create_with_exist_ok_returns_the_collection_there_and_csv_settings_read_back(
    lathe: Lathe,
) -> None:
    name = unique_name("exist")
    chunking = Chunking(strategy=ChunkStrategy.CSV, max_tokens=96)
    created = lathe.create_collection(name, default_chunking=chunking)
    assert created.settings.default_chunking == chunking
    with pytest.raises(LatheError) as raised:
        lathe.create_collection(name)
    assert raised.value.code == grpc.StatusCode.ALREADY_EXISTS
    again = lathe.create_collection(name, exist_ok=True)
    assert again.name == name
    assert again.settings.default_chunking == chunking
    assert lathe.get_collection(name).settings.default_chunking.strategy is ChunkStrategy.CSV
    lathe.delete_collection(name)


def test_collections_are_created_listed_read_and_deleted(lathe: Lathe) -> None:
    name = unique_name("coll")
    created = lathe.create_collection(
        name, default_chunking=Chunking(strategy=ChunkStrategy.SENTENCE, max_tokens=64)
    )
    assert created.name == name
    assert created.state is CollectionState.READY and created.reason == ""
    assert created.stats is not None and created.stats.documents == 0
    assert created.settings.default_chunking is not None
    assert created.settings.default_chunking.strategy is ChunkStrategy.SENTENCE
    assert created.settings.default_chunking.max_tokens == 64
    assert name in [c.name for c in lathe.list_collections()]
    assert lathe.get_collection(name).name == name
    lathe.delete_collection(name)
    with pytest.raises(LatheError) as raised:
        lathe.get_collection(name)
    assert raised.value.code is grpc.StatusCode.NOT_FOUND


def test_recover_log_on_a_single_node_is_refused_naming_it(lathe: Lathe) -> None:
    # A single node has no write log: the replicas' recovery is refused, and nothing changes.
    with pytest.raises(LatheError) as raised:
        lathe.recover_log(Recovery.START_OVER, "LATHE")
    assert raised.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "single node" in str(raised.value)


def test_an_alias_names_a_collection_until_switched_and_is_listed(lathe: Lathe) -> None:
    first, second, alias = unique_name("v1"), unique_name("v2"), unique_name("live")
    for name, text in [(first, "Puffins nest on cliffs."), (second, "Puffins eat sand eels.")]:
        lathe.create_collection(name)
        lathe.upsert(name, [{"id": f"{name}-doc", "text": text}], wait=True)
    assert lathe.create_alias(alias, first) == Alias(alias=alias, collection=first)
    assert Alias(alias=alias, collection=first) in lathe.list_aliases()
    assert lathe.get_collection(alias).name == first
    assert alias in lathe.get_collection(first).aliases
    assert lathe.retrieve(alias, "puffins", budget=32).chunks[0].doc_id == f"{first}-doc"
    assert lathe.switch_alias(alias, second).collection == second
    assert lathe.retrieve(alias, "puffins", budget=32).chunks[0].doc_id == f"{second}-doc"
    with pytest.raises(LatheError) as raised:
        lathe.delete_collection(second)
    assert raised.value.code is grpc.StatusCode.FAILED_PRECONDITION
    lathe.delete_alias(alias)
    assert alias not in [a.alias for a in lathe.list_aliases()]
    for name in (first, second):
        lathe.delete_collection(name)


def test_a_snapshot_downloads_and_restores_and_a_damaged_one_is_refused(
    lathe: Lathe, tmp_path
) -> None:
    source, copy = unique_name("snap"), unique_name("restored")
    lathe.create_collection(source)
    lathe.upsert(source, [{"id": "gull", "text": "Gulls follow the ferry."}], wait=True)
    taken = lathe.create_snapshot(source)
    assert taken.collection == source and taken.name in [s.name for s in lathe.list_snapshots(source)]
    path = str(tmp_path / taken.name)
    assert lathe.download_snapshot(source, taken.name, path) == taken.bytes
    restored = lathe.restore_snapshot(copy, path)
    assert (restored.collection, restored.source_collection) == (copy, source)
    assert restored.generation == taken.generation
    assert lathe.retrieve(copy, "gulls", budget=32).chunks[0].doc_id == "gull"
    damaged = bytearray(open(path, "rb").read())
    damaged[512 + 5] ^= 0x01  # inside the first file (collection.json), after its tar header
    (tmp_path / "damaged").write_bytes(bytes(damaged))
    with pytest.raises(LatheError) as raised:
        lathe.restore_snapshot(unique_name("never"), str(tmp_path / "damaged"))
    assert raised.value.code is grpc.StatusCode.DATA_LOSS
    assert "nothing was created" in str(raised.value)
    lathe.delete_snapshot(source, taken.name)
    assert taken.name not in [s.name for s in lathe.list_snapshots(source)]
    for name in (source, copy):
        lathe.delete_collection(name)


def test_retrieve_returns_chunks_within_budget_with_exact_offsets(
    lathe: Lathe, docs: str, minilm: Tokenizer
) -> None:
    result = lathe.retrieve(docs, "which port does the daemon listen on", budget=64, top_k=4)
    assert result.chunks, "the markdown section about the port must be found"
    best = result.chunks[0]
    assert best.doc_id == "guide.md"
    assert "50051" in best.text
    assert MARKDOWN.encode()[best.byte_span.start : best.byte_span.end].decode() == best.text
    assert MARKDOWN[best.char_span.start : best.char_span.end] == best.text
    assert result.token_budget == 64
    recounted = sum(count_tokens(minilm, chunk.text) for chunk in result.chunks)
    assert recounted <= 64
    assert result.tokens_used == recounted
    for chunk in result.chunks:
        assert chunk.token_count == count_tokens(minilm, chunk.text)
        assert chunk.score > 0


@pytest.mark.parametrize("strategy", ["fixed", "sentence", "recursive", "structure", "auto"])
@pytest.mark.parametrize("budget", [8, 40, 200])
def test_every_strategy_stays_within_every_budget(
    lathe: Lathe, docs: str, minilm: Tokenizer, strategy: str, budget: int
) -> None:
    result = lathe.retrieve(
        docs, "arctic terns migration flights", budget=budget, top_k=8, strategy=strategy, max_tokens=32
    )
    recounted = sum(count_tokens(minilm, chunk.text) for chunk in result.chunks)
    assert recounted <= budget
    assert result.tokens_used == recounted
    for chunk in result.chunks:
        source = {"terns.txt": LONG_PLAIN, "guide.md": MARKDOWN, "volcano.md": VOLCANO}.get(chunk.doc_id)
        if source is not None:
            assert source[chunk.char_span.start : chunk.char_span.end] == chunk.text
        # Windows of one section that overlap or touch are merged into one span (no text is
        # returned twice), so a returned span may be longer than max_tokens; the budget holds.
        assert chunk.token_count <= budget


def test_metadata_and_document_filters_apply(lathe: Lathe, docs: str) -> None:
    result = lathe.retrieve(docs, "how does magma erupt", budget=64)
    assert result.chunks[0].doc_id == "volcano.md"
    assert "lava flows" in " ".join(c.text for c in result.chunks)

    filtered = lathe.retrieve(docs, "policy growth magma", budget=256, metadata={"topic": "finance"})
    assert filtered.chunks
    assert {c.doc_id for c in filtered.chunks} == {"report.txt"}
    by_id = lathe.retrieve(docs, "policy growth magma", budget=256, doc_ids=["volcano.md"])
    assert {c.doc_id for c in by_id.chunks} == {"volcano.md"}


def test_position_order_groups_by_document_in_document_order(lathe: Lathe, docs: str) -> None:
    result = lathe.retrieve(
        docs, "arctic terns paragraph", budget=300, top_k=8, order=ResultOrder.POSITION,
        strategy="fixed", max_tokens=16,
    )
    assert len(result.chunks) >= 2
    terns = [c for c in result.chunks if c.doc_id == "terns.txt"]
    assert [c.char_span.start for c in terns] == sorted(c.char_span.start for c in terns)


def test_selection_controls_cap_documents_floor_scores_and_are_checked(
    lathe: Lathe, docs: str
) -> None:
    capped = lathe.retrieve(
        docs, "arctic terns paragraph", budget=300, top_k=8, strategy="fixed", max_tokens=16,
        max_chunks_per_document=1, diversity=0.5,
    )
    assert capped.chunks
    doc_ids = [c.doc_id for c in capped.chunks]
    assert len(doc_ids) == len(set(doc_ids))
    floor = capped.chunks[0].score
    floored = lathe.retrieve(
        docs, "arctic terns paragraph", budget=300, top_k=8, strategy="fixed", max_tokens=16,
        min_score=floor,
    )
    assert floored.chunks and all(c.score >= floor for c in floored.chunks)
    with pytest.raises(LatheError) as raised:
        lathe.retrieve(docs, "terns", budget=100, diversity=1.5)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "diversity" in str(raised.value)


def test_upsert_replaces_and_delete_removes(lathe: Lathe) -> None:
    name = unique_name("replace")
    lathe.create_collection(name)
    lathe.upsert(name, [Document(id="a", text="The old text mentions pelicans.")], wait=True)
    lathe.upsert(name, [Document(id="a", text="The new text mentions flamingos.")], wait=True)
    # Dense retrieval always has nearest sections: what must hold is that the old text is gone.
    assert all("pelicans" not in c.text for c in lathe.retrieve(name, "pelicans", budget=50).chunks)
    assert lathe.retrieve(name, "flamingos", budget=50).chunks[0].doc_id == "a"
    deleted = lathe.delete_documents(name, ["a"], wait=True)
    assert deleted.documents == 1
    assert deleted.operation is not None and deleted.operation.state is OperationState.APPLIED
    assert lathe.retrieve(name, "flamingos", budget=50).chunks == []
    assert lathe.get_collection(name).stats.documents == 0


def test_streaming_upload_writes_every_batch(lathe: Lathe) -> None:
    name = unique_name("upload")
    lathe.create_collection(name)
    batches = (
        [Document(id=f"doc-{b}-{i}", text=f"Batch {b} item {i} talks about otters.") for i in range(5)]
        for b in range(3)
    )
    written = lathe.upload(name, batches, wait=True)
    assert written.documents == 15
    assert len(written.operation_ids) == 3, "one operation per message"
    assert lathe.get_collection(name).stats.documents == 15


def test_upload_documents_is_a_thin_alias_of_upsert_with_wait(lathe: Lathe) -> None:
    name = unique_name("batched")
    lathe.create_collection(name)
    documents = [
        Document(id=f"doc-{i}", text=f"Document {i} follows the terns. " * 40) for i in range(12)
    ]
    seen = []
    written = lathe.upload_documents(name, documents, progress=seen.append)
    assert written.documents == 12
    assert written.operation is not None and written.operation.state is OperationState.APPLIED
    assert lathe.get_collection(name).stats.documents == 12
    assert seen and seen[-1].state is OperationState.APPLIED
    # The former sizing arguments are accepted, ignored, and warned about; sending the same
    # documents again stores nothing twice.
    with pytest.warns(DeprecationWarning):
        again = lathe.upload_documents(name, documents, first_batch_bytes=1, max_batch_documents=5)
    assert again.documents == 12
    assert lathe.get_collection(name).stats.documents == 12


def test_a_zero_budget_is_invalid_argument_naming_token_budget(lathe: Lathe, docs: str) -> None:
    with pytest.raises(LatheError) as raised:
        lathe.retrieve(docs, "anything", budget=0)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.code_name == "INVALID_ARGUMENT"
    assert "token_budget" in raised.value.details
    assert raised.value.method == "Retrieve"


def test_a_writes_consistency_token_is_its_operation_and_reads_the_write(lathe: Lathe) -> None:
    name = unique_name("tokens")
    lathe.create_collection(name)
    # No wait: the retrieve that carries the token waits until the write is visible.
    written = lathe.upsert(name, [Document(id="probe", text="A probe of tokens.")])
    assert written.operation is not None
    assert written.consistency_token == written.operation.id > 0
    result = lathe.retrieve(name, "probe", budget=64, consistency_token=written.consistency_token)
    assert [c.doc_id for c in result.chunks] == ["probe"]
    assert result.log_position == 0
    assert lathe.delete_collection(name) == CollectionDeleted(name=name, consistency_token=0)


def test_errors_carry_their_grpc_codes(lathe: Lathe) -> None:
    with pytest.raises(LatheError) as missing:
        lathe.retrieve(unique_name("missing"), "anything", budget=10)
    assert missing.value.code is grpc.StatusCode.NOT_FOUND

    name = unique_name("dup")
    lathe.create_collection(name)
    with pytest.raises(LatheError) as duplicate:
        lathe.create_collection(name)
    assert duplicate.value.code is grpc.StatusCode.ALREADY_EXISTS

    with pytest.raises(LatheError) as bad_name:
        lathe.create_collection("no spaces allowed")
    assert bad_name.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_an_unreachable_server_is_unavailable() -> None:
    from conftest import free_port

    with Lathe(f"127.0.0.1:{free_port()}", timeout=2.0) as nobody:
        with pytest.raises(LatheError) as raised:
            nobody.list_collections()
    assert raised.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_sigterm_drains_and_an_acknowledged_write_survives_a_restart(tmp_path: Path) -> None:
    first = start_server(tmp_path)
    with Lathe(first.address) as client:
        client.create_collection("durable")
        # No wait: the acknowledged write is in the durable queue; SIGTERM or not, it is applied
        # (before the exit, or after the restart).
        written = client.upsert("durable", [Document(id="d", text="Kestrels hover over meadows.")])
    assert first.stop() == 0, first.log()
    second = start_server(tmp_path)
    try:
        with Lathe(second.address) as client:
            answer = client.retrieve(
                "durable", "kestrels", budget=20, consistency_token=written.consistency_token
            )
            assert answer.chunks[0].doc_id == "d"
    finally:
        assert second.stop() == 0, second.log()


def test_a_damaged_collection_is_listed_with_its_state_and_reason(tmp_path: Path) -> None:
    first = start_server(tmp_path, {"models": {"dense": "off"}})
    with Lathe(first.address) as client:
        client.create_collection("kept")
        client.create_collection("healthy")
        client.upsert("healthy", [Document(id="d", text="Kestrels hover over meadows.")], wait=True)
    assert first.stop() == 0, first.log()
    settings = first.data_dir / "collections" / "kept" / "collection.json"
    settings.unlink()
    second = start_server(tmp_path, {"models": {"dense": "off"}})
    try:
        with Lathe(second.address) as client:
            listed = {info.name: info for info in client.list_collections()}
            kept = listed["kept"]
            assert kept.state is CollectionState.DAMAGED
            assert str(settings) in kept.reason
            assert kept.settings is None and kept.stats is None
            assert listed["healthy"].state is CollectionState.READY
            with pytest.raises(LatheError) as raised:
                client.retrieve("kept", "kestrels", budget=20)
            assert raised.value.code is grpc.StatusCode.DATA_LOSS
            assert "kept" in raised.value.details
            client.delete_collection("kept")
            assert client.retrieve("healthy", "kestrels", budget=20).chunks[0].doc_id == "d"
    finally:
        assert second.stop() == 0, second.log()
