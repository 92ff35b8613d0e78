"""Lathe in LlamaIndex (`pip install 'lathe-client[llama-index]'`).

    from lathe_client import Lathe
    from lathe_client.llama_index import LatheRetriever

    retriever = LatheRetriever(client=Lathe(address), collection="docs", token_budget=1024)
    retriever.retrieve("which port?")          # NodeWithScore, best first, within 1024 tokens
    RetrieverQueryEngine.from_args(retriever)  # any LlamaIndex query engine or chat engine

Each retrieved chunk becomes a `NodeWithScore` holding a `TextNode`: its text is
`Chunk.full_text` (the chunk's `context`, when it has one, a line break, then its text), its
metadata the document's metadata plus the chunk's (`CHUNK_METADATA_KEYS`, the same as the
LangChain integration's: doc_id, doc_title, section_id, section_title, heading_path, char_start,
char_end, byte_start, byte_end, token_count, score, score_bm25, score_section, score_dense,
strategy, context), its `ref_doc_id` (SOURCE relationship) the Lathe document id,
`start_char_idx`/`end_char_idx` the chunk's char span in that document, and its `id_`
`"{doc_id}#{char_start}-{char_end}"`. The chunk keys are left out of what LlamaIndex shows an
LLM or an embedding model (`excluded_llm_metadata_keys`, `excluded_embed_metadata_keys`); the
document's own metadata is not. The node's score is Lathe's (higher is better, not bounded).
"""

from __future__ import annotations

from typing import Any, Mapping

from lathe_client._integrations import (
    CHUNK_METADATA_KEYS,
    chunk_metadata,
    require_a_client,
    retrieve_arguments,
)
from lathe_client.aio import AsyncLathe
from lathe_client.client import Lathe
from lathe_client.types import Chunk, ChunkStrategy, RetrieveResult

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.schema import (
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lathe_client.llama_index needs llama-index-core: "
        "pip install 'lathe-client[llama-index]'"
    ) from error

__all__ = ["CHUNK_METADATA_KEYS", "LatheRetriever", "to_node"]


def to_node(chunk: Chunk) -> NodeWithScore:
    """A retrieved chunk as a LlamaIndex NodeWithScore (see the module's docstring)."""
    metadata = chunk_metadata(chunk)
    node = TextNode(
        id_=f"{chunk.doc_id}#{chunk.char_span.start}-{chunk.char_span.end}",
        text=chunk.full_text,
        metadata=metadata,
        start_char_idx=chunk.char_span.start,
        end_char_idx=chunk.char_span.end,
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=chunk.doc_id)},
        excluded_llm_metadata_keys=list(CHUNK_METADATA_KEYS),
        excluded_embed_metadata_keys=list(CHUNK_METADATA_KEYS),
    )
    return NodeWithScore(node=node, score=chunk.score)


class LatheRetriever(BaseRetriever):
    """A LlamaIndex retriever backed by a Lathe collection: the nodes it returns are the best
    chunks for the query whose token counts sum to at most `token_budget`, best first.

    `client` (a `Lathe`) serves `retrieve`, `async_client` (an `AsyncLathe`) `aretrieve`; give
    either or both. `top_k`, `strategy`, `metadata_filter` (every key = value must match) and
    `min_score` are `Lathe.retrieve`'s arguments, `retrieve_kwargs` any other of them
    (`doc_ids`, `order`, `max_chunks_per_document`, `diversity`, `chunking`, ...);
    `similarity_top_k` caps the number of nodes returned (None: as many as fit the budget).
    `callback_manager` and `verbose` are BaseRetriever's.
    """

    def __init__(
        self,
        client: Lathe | None = None,
        *,
        collection: str,
        async_client: AsyncLathe | None = None,
        token_budget: int = 1024,
        top_k: int | None = None,
        strategy: ChunkStrategy | str | None = None,
        metadata_filter: Mapping[str, str] | None = None,
        min_score: float | None = None,
        similarity_top_k: int | None = None,
        retrieve_kwargs: Mapping[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        require_a_client("LatheRetriever", client, async_client)
        self.client = client
        self.async_client = async_client
        self.collection = collection
        self.similarity_top_k = similarity_top_k
        self._arguments = retrieve_arguments(
            token_budget, top_k, strategy, metadata_filter, min_score, retrieve_kwargs or {}
        )
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _nodes(self, result: RetrieveResult) -> list[NodeWithScore]:
        chunks = result.chunks
        if self.similarity_top_k is not None:
            chunks = chunks[: self.similarity_top_k]
        return [to_node(chunk) for chunk in chunks]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.client is None:
            raise ValueError("LatheRetriever.retrieve needs `client` (a Lathe)")
        result = self.client.retrieve(self.collection, query_bundle.query_str, **self._arguments)
        return self._nodes(result)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.async_client is None:
            raise ValueError("LatheRetriever.aretrieve needs `async_client` (an AsyncLathe)")
        result = await self.async_client.retrieve(
            self.collection, query_bundle.query_str, **self._arguments
        )
        return self._nodes(result)
