"""Python client of the Lathe retrieval server.

    from lathe_client import Lathe, Document

    with Lathe("127.0.0.1:50051") as lathe:
        lathe.create_collection("docs")
        lathe.upsert("docs", [Document(id="a.md", text="# Title\n\nBody", format="markdown")], wait=True)
        # Without wait, the write is queued and its operation returned at once:
        queued = lathe.upsert("docs", [Document(id="b.md", text="More")])
        lathe.wait_operation(queued.operation.id, progress=lambda op: print(op.line()))
        for chunk in lathe.retrieve("docs", "body", budget=256).chunks:
            print(chunk.doc_id, chunk.char_span, chunk.score, chunk.text)

`AsyncLathe` has the same methods as coroutines (grpc.aio). With the extras installed,
`lathe_client.langchain` (LatheRetriever, LatheVectorStore) and `lathe_client.llama_index`
(LatheRetriever) plug Lathe into LangChain and LlamaIndex.
"""

from lathe_client import types
from lathe_client.aio import AsyncLathe
from lathe_client.client import SERVICE_NAME, Lathe
from lathe_client.errors import LatheError, OperationFailed, WriteQueued
from lathe_client.types import *  # noqa: F403 (exactly types.__all__)

__all__ = ["SERVICE_NAME", "AsyncLathe", "Lathe", "LatheError", "OperationFailed", "WriteQueued"]
__all__ += types.__all__
