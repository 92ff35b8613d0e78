"""Python client of the Lathe retrieval server.

    from lathe_client import Lathe, Document

    with Lathe("127.0.0.1:50051") as lathe:
        lathe.create_collection("docs")
        lathe.upsert("docs", [Document(id="a.md", text="# Title\n\nBody", format="markdown")], wait=True)
        for chunk in lathe.retrieve("docs", "body", budget=256).chunks:
            print(chunk.doc_id, chunk.char_span, chunk.score, chunk.text)
"""

from lathe_client import types
from lathe_client.client import SERVICE_NAME, Lathe
from lathe_client.errors import LatheError
from lathe_client.types import *  # noqa: F403 (exactly types.__all__)

__all__ = ["SERVICE_NAME", "Lathe", "LatheError"]
__all__ += types.__all__
