"""The RAG example runs against a real server, with and without LangChain."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from conftest import ServerProcess
from lathe_client import Document, Lathe

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import rag_retriever  # noqa: E402


def test_the_example_script_prints_a_prompt_with_cited_context(server: ServerProcess) -> None:
    collection = f"rag-{uuid.uuid4().hex[:8]}"
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / "rag_retriever.py"), "--address", server.address,
         "--collection", collection, "--demo", "--budget", "64", "which port serves metrics?"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "[1] install.md chars" in completed.stdout
    assert "9090" in completed.stdout
    assert "Question: which port serves metrics?" in completed.stdout
    # And through the packaged LangChain retriever.
    assert "# LangChain retriever: " in completed.stdout
    assert "# LangChain retriever: 0 documents" not in completed.stdout


def test_build_prompt_keeps_the_context_within_budget(lathe: Lathe) -> None:
    collection = f"rag-{uuid.uuid4().hex[:8]}"
    lathe.create_collection(collection)
    lathe.upsert(collection, rag_retriever.DEMO_DOCUMENTS, wait=True)
    prompt, chunks = rag_retriever.build_prompt(lathe, collection, "token budget packing", 64)
    assert chunks
    assert sum(c.token_count for c in chunks) <= 64
    for chunk in chunks:
        assert chunk.text in prompt


def test_langchain_retriever_returns_documents_with_offsets(lathe: Lathe) -> None:
    from lathe_client.langchain import LatheRetriever

    assert rag_retriever.LatheRetriever is LatheRetriever, "the example uses the packaged one"
    collection = f"rag-{uuid.uuid4().hex[:8]}"
    lathe.create_collection(collection)
    lathe.upsert(collection, [Document(id="a", text="Puffins nest on cliffs.", metadata={"lang": "en"})], wait=True)
    retriever = rag_retriever.LatheRetriever(client=lathe, collection=collection, token_budget=32)
    documents = retriever.invoke("where do puffins nest")
    assert [d.metadata["doc_id"] for d in documents] == ["a"]
    assert documents[0].page_content == "Puffins nest on cliffs."
    assert documents[0].metadata["lang"] == "en"
    assert (documents[0].metadata["char_start"], documents[0].metadata["char_end"]) == (0, 23)

