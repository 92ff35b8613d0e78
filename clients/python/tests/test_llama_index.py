"""lathe_client.llama_index against a real `lathe serve`, with the real llama-index-core: sync
retrieval through Lathe, async through AsyncLathe."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from conftest import ServerProcess
from lathe_client import AsyncLathe, Document, Lathe
from lathe_client.llama_index import CHUNK_METADATA_KEYS, LatheRetriever

GUIDE = (
    "# Installing Lathe\n\nLathe ships as one binary.\n\n"
    "## Ports\n\nThe gRPC API listens on port 50051. Café owners and naïve users welcome.\n"
)
PUFFINS = "Puffins nest in burrows on sea cliffs and eat sand eels."
QUESTION = "which port does the gRPC API listen on"


@pytest.fixture()
def filled(lathe: Lathe) -> Iterator[str]:
    name = f"li-{uuid.uuid4().hex[:10]}"
    lathe.create_collection(name)
    lathe.upsert(
        name,
        [
            Document(
                id="guide.md", text=GUIDE, format="markdown", title="Guide", metadata={"lang": "en"}
            ),
            Document(id="puffins.txt", text=PUFFINS, metadata={"topic": "birds"}),
        ],
        wait=True,
    )
    yield name
    lathe.delete_collection(name)


def test_the_retriever_returns_nodes_with_lathe_offsets_and_scores(
    lathe: Lathe, filled: str
) -> None:
    retriever = LatheRetriever(lathe, collection=filled, token_budget=64)
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve(QUESTION)
    expected = lathe.retrieve(filled, QUESTION, budget=64).chunks
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [(n.node.ref_doc_id, n.score) for n in nodes] == [(c.doc_id, c.score) for c in expected]
    best, chunk = nodes[0].node, expected[0]
    assert best.ref_doc_id == "guide.md" and "50051" in best.get_content()
    assert best.get_content(metadata_mode=MetadataMode.NONE) == chunk.full_text
    assert best.id_ == f"guide.md#{chunk.char_span.start}-{chunk.char_span.end}"
    assert (best.start_char_idx, best.end_char_idx) == (chunk.char_span.start, chunk.char_span.end)
    metadata = best.metadata
    assert set(CHUNK_METADATA_KEYS) <= set(metadata)
    assert metadata["lang"] == "en" and metadata["doc_title"] == "Guide"
    assert metadata["heading_path"] == ["Installing Lathe", "Ports"]
    assert GUIDE[metadata["char_start"] : metadata["char_end"]] == chunk.text
    assert GUIDE.encode()[metadata["byte_start"] : metadata["byte_end"]].decode() == chunk.text
    assert (metadata["token_count"], metadata["score"]) == (chunk.token_count, chunk.score)
    assert sum(n.node.metadata["token_count"] for n in nodes) <= 64
    # What LlamaIndex shows an LLM: the document's metadata, not Lathe's bookkeeping.
    shown = best.get_content(metadata_mode=MetadataMode.LLM)
    assert "lang: en" in shown and "byte_start" not in shown and "score" not in shown
    # Retrieve's arguments pass through; a QueryBundle works as well as a string.
    birds = LatheRetriever(
        lathe, collection=filled, token_budget=256, metadata_filter={"topic": "birds"}
    ).retrieve(QueryBundle("port cliffs"))
    assert {n.node.ref_doc_id for n in birds} == {"puffins.txt"}
    capped = LatheRetriever(lathe, collection=filled, token_budget=256, similarity_top_k=1)
    assert len(capped.retrieve("port cliffs")) == 1


def test_the_async_retriever_goes_through_async_lathe(
    server: ServerProcess, lathe: Lathe, filled: str
) -> None:
    expected = lathe.retrieve(filled, QUESTION, budget=64).chunks

    async def scenario() -> list[NodeWithScore]:
        async with AsyncLathe(server.address) as client:
            retriever = LatheRetriever(async_client=client, collection=filled, token_budget=64)
            with pytest.raises(ValueError, match="needs `client`"):
                retriever.retrieve(QUESTION)
            return await retriever.aretrieve(QUESTION)

    nodes = asyncio.run(scenario())
    assert [(n.node.ref_doc_id, n.node.get_content(), n.score) for n in nodes] == [
        (c.doc_id, c.full_text, c.score) for c in expected
    ]
    with pytest.raises(ValueError, match="needs a client"):
        LatheRetriever(collection=filled)
    with pytest.raises(ValueError, match="needs `async_client`"):
        asyncio.run(LatheRetriever(lathe, collection=filled).aretrieve(QUESTION))
