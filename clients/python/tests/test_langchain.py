"""lathe_client.langchain against a real `lathe serve`, with the real langchain-core: the
retriever (sync through Lathe, async through AsyncLathe), the VectorStore, and LangChain's
indexing API keeping a collection in sync."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest
from langchain_core.documents import Document
from langchain_core.indexing import InMemoryRecordManager, aindex, index
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from conftest import ServerProcess
from lathe_client import AsyncLathe, Lathe
from lathe_client import Document as LatheDocument
from lathe_client.langchain import CHUNK_METADATA_KEYS, LatheRetriever, LatheVectorStore

GUIDE = (
    "# Installing Lathe\n\nLathe ships as one binary.\n\n"
    "## Ports\n\nThe gRPC API listens on port 50051. Café owners and naïve users welcome.\n"
)
PUFFINS = "Puffins nest in burrows on sea cliffs and eat sand eels."


@pytest.fixture()
def collection(lathe: Lathe) -> Iterator[str]:
    name = f"lc-{uuid.uuid4().hex[:10]}"
    lathe.create_collection(name)
    yield name
    lathe.delete_collection(name)


@pytest.fixture()
def filled(lathe: Lathe, collection: str) -> str:
    lathe.upsert(
        collection,
        [
            LatheDocument(
                id="guide.md", text=GUIDE, format="markdown", title="Guide", metadata={"lang": "en"}
            ),
            LatheDocument(
                id="puffins.txt", text=PUFFINS, metadata={"lang": "en", "topic": "birds"}
            ),
        ],
        wait=True,
    )
    return collection


QUESTION = "which port does the gRPC API listen on"


def test_the_retriever_returns_lathe_chunks_as_documents_with_offsets_and_scores(
    lathe: Lathe, filled: str
) -> None:
    retriever = LatheRetriever(client=lathe, collection=filled, token_budget=64)
    assert isinstance(retriever, BaseRetriever)
    documents = retriever.invoke(QUESTION)
    expected = lathe.retrieve(filled, QUESTION, budget=64).chunks
    assert [d.metadata["doc_id"] for d in documents] == [c.doc_id for c in expected]
    best, chunk = documents[0], expected[0]
    assert best.id == "guide.md" and "50051" in best.page_content
    assert best.page_content == chunk.full_text
    metadata = best.metadata
    assert set(CHUNK_METADATA_KEYS) <= set(metadata)
    assert metadata["lang"] == "en", "the document's own metadata comes along"
    assert (metadata["doc_title"], metadata["section_id"]) == ("Guide", chunk.section_id)
    assert metadata["heading_path"] == ["Installing Lathe", "Ports"]
    assert metadata["section_title"] == chunk.section_title
    assert chunk.section_title.endswith("Ports")
    # The offsets locate the text in the document: chars in code points, bytes in UTF-8 (the
    # accents make them differ).
    text = GUIDE[metadata["char_start"] : metadata["char_end"]]
    assert text == chunk.text and best.page_content.endswith(text)
    assert GUIDE.encode()[metadata["byte_start"] : metadata["byte_end"]].decode() == text
    byte_length = metadata["byte_end"] - metadata["byte_start"]
    assert byte_length > metadata["char_end"] - metadata["char_start"]
    assert metadata["token_count"] == chunk.token_count > 0
    assert metadata["score"] == pytest.approx(chunk.score) and metadata["score"] > 0
    assert sum(d.metadata["token_count"] for d in documents) <= 64
    # Retrieve's arguments pass through: a metadata filter, and k caps the documents.
    birds = LatheRetriever(
        client=lathe, collection=filled, token_budget=256, metadata_filter={"topic": "birds"}
    ).invoke("port cliffs")
    assert {d.metadata["doc_id"] for d in birds} == {"puffins.txt"}
    one = LatheRetriever(client=lathe, collection=filled, token_budget=256, k=1)
    assert len(one.invoke("port cliffs")) == 1


def test_the_async_retriever_goes_through_async_lathe(
    server: ServerProcess, lathe: Lathe, filled: str
) -> None:
    expected = lathe.retrieve(filled, QUESTION, budget=64).chunks

    async def scenario() -> list[Document]:
        async with AsyncLathe(server.address) as client:
            # No sync client: ainvoke can only answer through the AsyncLathe.
            retriever = LatheRetriever(async_client=client, collection=filled, token_budget=64)
            with pytest.raises(ValueError, match="needs `client`"):
                retriever.invoke(QUESTION)
            return await retriever.ainvoke(QUESTION)

    documents = asyncio.run(scenario())
    assert [(d.id, d.page_content) for d in documents] == [
        (c.doc_id, c.full_text) for c in expected
    ]
    assert documents[0].metadata["char_start"] == expected[0].char_span.start
    with pytest.raises(ValueError, match="needs a client"):
        LatheRetriever(collection=filled)
    with pytest.raises(ValueError, match="needs `async_client`"):
        asyncio.run(LatheRetriever(client=lathe, collection=filled).ainvoke(QUESTION))


def test_the_vector_store_adds_searches_and_deletes_by_id(lathe: Lathe, collection: str) -> None:
    store = LatheVectorStore(lathe, collection=collection, token_budget=256)
    assert isinstance(store, VectorStore) and store.embeddings is None
    ids = store.add_documents(
        [
            Document(page_content=PUFFINS, metadata={"source": "birds.txt", "year": 2024}),
            Document(page_content="Gannets dive for mackerel.", metadata={"title": "Gannets"}),
        ],
        ids=["puffin-1", "gannet-1"],
    )
    assert ids == ["puffin-1", "gannet-1"]
    assert lathe.get_collection(collection).stats.documents == 2, "add waits until applied"
    (found, score), *_ = store.similarity_search_with_score("where do puffins nest", k=1)
    assert found.id == "puffin-1" and found.page_content == PUFFINS
    # Lathe metadata is string to string: other values are stored as JSON text.
    assert (found.metadata["source"], found.metadata["year"]) == ("birds.txt", "2024")
    assert score == found.metadata["score"] > 0
    gannet = store.similarity_search("gannets mackerel", k=1, filter={"title": "Gannets"})
    assert [(d.id, d.metadata["doc_title"]) for d in gannet] == [("gannet-1", "Gannets")]
    assert len(store.similarity_search("birds", k=1)) == 1

    retriever = store.as_retriever(search_kwargs={"k": 1})
    assert isinstance(retriever, VectorStoreRetriever)
    assert [d.id for d in retriever.invoke("mackerel diving")] == ["gannet-1"]

    # Without ids, a document keeps its own id, else gets a new one.
    own, fresh = store.add_texts(["Terns fly far.", "Skuas steal fish."], ids=None)
    assert own and fresh and own != fresh
    kept = store.add_documents([Document(id="tern-2", page_content="Terns are graceful.")])
    assert kept == ["tern-2"]
    assert lathe.get_collection(collection).stats.documents == 5

    assert store.delete(["puffin-1", own, fresh, "never-stored"]) is True
    assert lathe.get_collection(collection).stats.documents == 2
    assert "puffin-1" not in {d.id for d in store.similarity_search("puffins burrows cliffs", k=10)}
    with pytest.raises(ValueError, match="needs the ids"):
        store.delete()
    with pytest.raises(ValueError, match="2 ids for 1 documents"):
        store.add_documents([Document(page_content="x")], ids=["a", "b"])


def test_from_texts_creates_the_collection_and_markdown_is_parsed(lathe: Lathe) -> None:
    name = f"lc-{uuid.uuid4().hex[:10]}"
    store = LatheVectorStore.from_texts(
        [GUIDE], metadatas=[{"source": "guide.md"}], ids=["guide"],
        client=lathe, collection=name, document_format="markdown",
    )
    try:
        (best,) = store.similarity_search(QUESTION, k=1)
        assert best.id == "guide" and best.metadata["heading_path"] == ["Installing Lathe", "Ports"]
    finally:
        lathe.delete_collection(name)


def stored(lathe: Lathe, collection: str) -> dict[str, tuple[str, str]]:
    """Every document the collection holds: id -> (source, text). Each test document is one
    short chunk mentioning seabirds, and the collection's document count must agree."""
    result = lathe.retrieve(collection, "seabirds", budget=4096)
    documents = {c.doc_id: (c.metadata["source"], c.text) for c in result.chunks}
    assert lathe.get_collection(collection).stats.documents == len(documents)
    return documents


def seabird(source: str, text: str) -> Document:
    return Document(page_content=f"Seabirds: {text}", metadata={"source": source})


def source_documents() -> dict[str, list[Document]]:
    return {
        "puffins.md": [seabird("puffins.md", "puffins nest in burrows.")],
        "gannets.md": [seabird("gannets.md", "gannets dive for fish.")],
        "terns.md": [
            seabird("terns.md", "terns migrate pole to pole."),
            seabird("terns.md", "terns defend their nests."),
        ],
    }


def test_the_indexing_api_keeps_the_collection_in_sync(lathe: Lathe, collection: str) -> None:
    store = LatheVectorStore(lathe, collection=collection)
    records = InMemoryRecordManager(namespace=f"lathe/{collection}")
    records.create_schema()

    def sync(documents: list[Document], cleanup: str = "incremental") -> dict:
        return index(
            documents, records, store, cleanup=cleanup, source_id_key="source",
            key_encoder="sha256",
        )

    sources = source_documents()
    first = sync([d for docs in sources.values() for d in docs])
    assert first == {"num_added": 4, "num_updated": 0, "num_skipped": 0, "num_deleted": 0}
    held = stored(lathe, collection)
    assert sorted(text for _, text in held.values()) == sorted(
        d.page_content for docs in sources.values() for d in docs
    )
    # Lathe's ids are the record manager's keys (index() hashes each document into its id).
    assert set(held) == set(records.list_keys())
    old_gannet = next(i for i, (source, _) in held.items() if source == "gannets.md")

    # Again with gannets.md changed and one of the two terns.md documents removed: incremental
    # cleanup replaces the changed one, deletes the removed one and skips the rest.
    changed = seabird("gannets.md", "gannets plunge from thirty metres.")
    second = sync(sources["puffins.md"] + [changed] + sources["terns.md"][:1])
    assert second == {"num_added": 1, "num_updated": 0, "num_skipped": 2, "num_deleted": 2}
    held = stored(lathe, collection)
    assert sorted(held.values()) == sorted(
        [
            ("puffins.md", "Seabirds: puffins nest in burrows."),
            ("gannets.md", "Seabirds: gannets plunge from thirty metres."),
            ("terns.md", "Seabirds: terns migrate pole to pole."),
        ]
    )
    assert old_gannet not in held
    assert set(held) == set(records.list_keys())

    # A whole source gone (terns.md) is deleted by a full cleanup.
    third = sync(sources["puffins.md"] + [changed], cleanup="full")
    assert third == {"num_added": 0, "num_updated": 0, "num_skipped": 2, "num_deleted": 1}
    held = stored(lathe, collection)
    assert sorted(source for source, _ in held.values()) == ["gannets.md", "puffins.md"]
    assert set(held) == set(records.list_keys())


def test_the_async_indexing_api_goes_through_async_lathe(
    server: ServerProcess, lathe: Lathe, collection: str
) -> None:
    sources = source_documents()

    async def scenario() -> tuple[dict, dict, list[Document]]:
        async with AsyncLathe(server.address) as client:
            store = LatheVectorStore(async_client=client, collection=collection)
            records = InMemoryRecordManager(namespace=f"lathe/{collection}")
            await records.acreate_schema()
            options = {"cleanup": "incremental", "source_id_key": "source", "key_encoder": "sha256"}
            everything = [d for docs in sources.values() for d in docs]
            first = await aindex(everything, records, store, **options)
            fewer = sources["puffins.md"] + sources["terns.md"][1:]
            second = await aindex(fewer, records, store, **options)
            found = await store.as_retriever(search_kwargs={"k": 1}).ainvoke("terns defend nests")
            return first, second, found

    first, second, found = asyncio.run(scenario())
    assert first["num_added"] == 4
    assert (second["num_skipped"], second["num_deleted"]) == (2, 1)
    assert [d.page_content for d in found] == ["Seabirds: terns defend their nests."]
    assert sorted(text for _, text in stored(lathe, collection).values()) == [
        "Seabirds: gannets dive for fish.",
        "Seabirds: puffins nest in burrows.",
        "Seabirds: terns defend their nests.",
    ]
