"""Lathe in LangChain (`pip install 'lathe-client[langchain]'`).

    from lathe_client import AsyncLathe, Lathe
    from lathe_client.langchain import LatheRetriever, LatheVectorStore

    retriever = LatheRetriever(client=Lathe(address), collection="docs", token_budget=1024)
    retriever.invoke("which port?")            # chunks that fit 1024 tokens, best first

    store = LatheVectorStore(Lathe(address), collection="docs")
    store.add_documents(documents, ids=ids)    # upserts, waiting until they are visible
    store.delete(ids)
    store.as_retriever().invoke("which port?")
    index(documents, record_manager, store, cleanup="incremental", source_id_key="source")

Each retrieved chunk becomes a LangChain `Document` whose `page_content` is `Chunk.full_text`
(the chunk's `context`, when it has one, a line break, then its text), whose `id` is the Lathe
document id it comes from, and whose metadata is that document's metadata plus the chunk's
(`CHUNK_METADATA_KEYS`: doc_id, doc_title, section_id, section_title, heading_path, char_start,
char_end, byte_start, byte_end, token_count, score, score_bm25, score_section, score_dense,
strategy, context).

Lathe embeds on the server: there is no `Embeddings` object to give. The async methods
(`ainvoke`, `aadd_documents`, `adelete`, `asimilarity_search`, `aindex`) call an `AsyncLathe`
given as `async_client`; without one they raise ValueError rather than block a thread.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Sequence

from lathe_client._integrations import (
    CHUNK_METADATA_KEYS,
    chunk_metadata,
    lathe_metadata,
    require_a_client,
    retrieve_arguments,
)
from lathe_client.aio import AsyncLathe
from lathe_client.client import Lathe
from lathe_client.types import Chunk, ChunkStrategy, DocumentFormat, RetrieveResult
from lathe_client.types import Document as LatheDocument

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore
    from pydantic import Field, model_validator
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lathe_client.langchain needs langchain-core: pip install 'lathe-client[langchain]'"
    ) from error

__all__ = ["CHUNK_METADATA_KEYS", "LatheRetriever", "LatheVectorStore", "to_document"]


def to_document(chunk: Chunk) -> Document:
    """A retrieved chunk as a LangChain Document (see the module's docstring)."""
    return Document(id=chunk.doc_id, page_content=chunk.full_text, metadata=chunk_metadata(chunk))


class LatheRetriever(BaseRetriever):
    """A LangChain retriever backed by a Lathe collection: the documents it returns are the
    best chunks for the query whose token counts sum to at most `token_budget`, best first.

    `client` (a `Lathe`) serves `invoke`, `async_client` (an `AsyncLathe`) `ainvoke`; give
    either or both. `top_k`, `strategy`, `metadata_filter` (every key = value must match) and
    `min_score` are `Lathe.retrieve`'s arguments, `retrieve_kwargs` any other of them
    (`doc_ids`, `order`, `max_chunks_per_document`, `diversity`, `chunking`, ...); `k` caps the
    number of documents returned (None: as many as fit the budget).
    """

    client: Lathe | None = None
    async_client: AsyncLathe | None = None
    collection: str
    token_budget: int = 1024
    top_k: int | None = None
    strategy: ChunkStrategy | str | None = None
    metadata_filter: dict[str, str] | None = None
    min_score: float | None = None
    k: int | None = None
    retrieve_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_a_client(self) -> "LatheRetriever":
        require_a_client("LatheRetriever", self.client, self.async_client)
        return self

    def _arguments(self) -> dict[str, Any]:
        return retrieve_arguments(
            self.token_budget,
            self.top_k,
            self.strategy,
            self.metadata_filter,
            self.min_score,
            self.retrieve_kwargs,
        )

    def _documents(self, result: RetrieveResult) -> list[Document]:
        chunks = result.chunks if self.k is None else result.chunks[: self.k]
        return [to_document(chunk) for chunk in chunks]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.client is None:
            raise ValueError("LatheRetriever.invoke needs `client` (a Lathe)")
        return self._documents(self.client.retrieve(self.collection, query, **self._arguments()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.async_client is None:
            raise ValueError("LatheRetriever.ainvoke needs `async_client` (an AsyncLathe)")
        result = await self.async_client.retrieve(self.collection, query, **self._arguments())
        return self._documents(result)


class LatheVectorStore(VectorStore):
    """A Lathe collection as a LangChain VectorStore, which LangChain's indexing API
    (`langchain_core.indexing.index` / `aindex`) keeps in sync with a source of documents.

    Each LangChain Document is stored whole as one Lathe document whose id is the LangChain id
    (the `ids` given, else the document's own `id`, else a new uuid4): `index()` passes the
    hashes it keys its record manager with, so deleting those ids deletes exactly those
    documents. The text is `page_content`, parsed as `document_format` ("plain", "markdown" or
    "html"); the title is the metadata value under `title_key` when it is a string; the metadata
    is stored as strings (see `lathe_metadata`: non-string values as JSON text) and comes back
    as strings. Lathe splits each document into sections itself; a search returns the best
    chunks of them, each a Document with the id of the document it comes from.

    Writes wait until they are visible (`wait=True`, bounded by `write_timeout` seconds, None:
    as long as it takes); with `wait=False` they are queued and applied shortly after.
    `similarity_search(query, k)` returns at most `k` chunks, best first, within
    `token_budget` tokens (a `token_budget` keyword overrides it for one call); `filter` (a
    dict of metadata key = value, all must match) and any other keyword go to `Lathe.retrieve`.
    The scores of `similarity_search_with_score` are Lathe's (higher is better, not bounded to
    0..1), so `similarity_search_with_relevance_scores` is not supported.
    """

    def __init__(
        self,
        client: Lathe | None = None,
        *,
        collection: str,
        async_client: AsyncLathe | None = None,
        token_budget: int = 1024,
        document_format: DocumentFormat | str = DocumentFormat.PLAIN,
        title_key: str | None = "title",
        wait: bool = True,
        write_timeout: float | None = None,
        retrieve_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require_a_client("LatheVectorStore", client, async_client)
        self.client = client
        self.async_client = async_client
        self.collection = collection
        self.token_budget = token_budget
        self.document_format = DocumentFormat(
            document_format.lower() if isinstance(document_format, str) else document_format
        )
        self.title_key = title_key
        self.wait = wait
        self.write_timeout = write_timeout
        self.retrieve_kwargs = dict(retrieve_kwargs or {})

    @property
    def embeddings(self) -> Embeddings | None:
        """None: Lathe embeds documents and queries on the server."""
        return None

    # -- writes ------------------------------------------------------------------------------

    def add_documents(
        self, documents: list[Document], ids: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """Upserts the documents (replacing any stored under the same ids); their ids. Other
        keywords (`index()` passes `batch_size`) are ignored: `Lathe.upsert` splits a large
        write by itself."""
        stored, ids = self._to_lathe(documents, ids)
        self._sync_client("add_documents").upsert(
            self.collection, stored, wait=self.wait, timeout=self.write_timeout
        )
        return ids

    async def aadd_documents(
        self, documents: list[Document], ids: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """`add_documents` through the AsyncLathe."""
        stored, ids = self._to_lathe(documents, ids)
        await self._async_client("aadd_documents").upsert(
            self.collection, stored, wait=self.wait, timeout=self.write_timeout
        )
        return ids

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upserts the texts as documents (with the `metadatas`, when given); their ids."""
        return self.add_documents(_documents(texts, metadatas), ids=ids, **kwargs)

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """`add_texts` through the AsyncLathe."""
        return await self.aadd_documents(_documents(texts, metadatas), ids=ids, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Deletes the documents of these ids (ids not stored are no error); True once done.
        Deleting everything (ids None) is refused: delete the collection for that."""
        self._sync_client("delete").delete_documents(
            self.collection, _ids_to_delete(ids), wait=self.wait, timeout=self.write_timeout
        )
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """`delete` through the AsyncLathe."""
        await self._async_client("adelete").delete_documents(
            self.collection, _ids_to_delete(ids), wait=self.wait, timeout=self.write_timeout
        )
        return True

    # -- search ------------------------------------------------------------------------------

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        """At most `k` chunks for `query`, best first, within the token budget."""
        return [document for document, _ in self.similarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        """`similarity_search` through the AsyncLathe."""
        pairs = await self.asimilarity_search_with_score(query, k, **kwargs)
        return [document for document, _ in pairs]

    def similarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """At most `k` chunks for `query` with their Lathe scores, best first."""
        result = self._sync_client("similarity_search").retrieve(
            self.collection, query, **self._search_arguments(kwargs)
        )
        return [(to_document(c), c.score) for c in result.chunks[:k]]

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """`similarity_search_with_score` through the AsyncLathe."""
        result = await self._async_client("asimilarity_search").retrieve(
            self.collection, query, **self._search_arguments(kwargs)
        )
        return [(to_document(c), c.score) for c in result.chunks[:k]]

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> "LatheVectorStore":
        """A store over `collection` (created when missing) holding the texts; `kwargs` are
        the constructor's (`client`, `collection`, ...). `embedding` is ignored: Lathe embeds
        on the server."""
        store = cls(**kwargs)
        store._sync_client("from_texts").create_collection(store.collection, exist_ok=True)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    # -- plumbing ----------------------------------------------------------------------------

    def _to_lathe(
        self, documents: Sequence[Document], ids: Sequence[str] | None
    ) -> tuple[list[LatheDocument], list[str]]:
        """The Lathe documents of LangChain's, and their ids."""
        if ids is not None and len(ids) != len(documents):
            raise ValueError(f"{len(ids)} ids for {len(documents)} documents")
        chosen = [
            ids[i] if ids is not None else (d.id or str(uuid.uuid4()))
            for i, d in enumerate(documents)
        ]
        stored = []
        for doc_id, document in zip(chosen, documents):
            title = document.metadata.get(self.title_key) if self.title_key else None
            stored.append(
                LatheDocument(
                    id=doc_id,
                    text=document.page_content,
                    title=title if isinstance(title, str) else "",
                    format=self.document_format,
                    metadata=lathe_metadata(document.metadata),
                )
            )
        return stored, chosen

    def _search_arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        overrides = dict(kwargs)
        token_budget = overrides.pop("token_budget", self.token_budget)
        metadata_filter = overrides.pop("filter", None)
        return retrieve_arguments(
            token_budget, None, None, metadata_filter, None, self.retrieve_kwargs, overrides
        )

    def _sync_client(self, method: str) -> Lathe:
        if self.client is None:
            raise ValueError(f"LatheVectorStore.{method} needs `client` (a Lathe)")
        return self.client

    def _async_client(self, method: str) -> AsyncLathe:
        if self.async_client is None:
            raise ValueError(f"LatheVectorStore.{method} needs `async_client` (an AsyncLathe)")
        return self.async_client


def _documents(texts: Iterable[str], metadatas: list[dict] | None) -> list[Document]:
    texts = list(texts)
    if metadatas is not None and len(metadatas) != len(texts):
        raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
    return [
        Document(page_content=text, metadata=metadatas[i] if metadatas else {})
        for i, text in enumerate(texts)
    ]


def _ids_to_delete(ids: list[str] | None) -> list[str]:
    if ids is None:
        raise ValueError(
            "LatheVectorStore.delete needs the ids to delete (delete_collection deletes all)"
        )
    return list(ids)
