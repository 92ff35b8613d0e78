"""What the LangChain and LlamaIndex integrations share: the metadata a retrieved chunk carries
into a framework's document, and the arguments of their `retrieve` calls. Imports neither
framework."""

from __future__ import annotations

import json
from typing import Any, Mapping

from lathe_client.types import Chunk, ChunkStrategy

# The keys a retrieved chunk adds to its document's own metadata (they win over document keys of
# the same name). Offsets index the document text as Lathe stores it: chars in code points, bytes
# in UTF-8, end exclusive; they locate the chunk's `text` (without its `context`).
CHUNK_METADATA_KEYS = (
    "doc_id",  # the Lathe document id (with LatheVectorStore: the LangChain document id)
    "doc_title",
    "section_id",  # the section the chunk starts in
    "section_title",
    "heading_path",  # list of headings, outermost first
    "char_start",
    "char_end",
    "byte_start",
    "byte_end",
    "token_count",  # in the collection's budget tokenizer, counting `context` when set
    "score",
    "score_bm25",
    "score_section",
    "score_dense",
    "strategy",  # the chunking strategy that cut the chunk ("structure", "sentence", ...)
    "context",  # what the text is prefixed with (heading path, table header); often ""
)


def require_a_client(owner: str, client: object | None, async_client: object | None) -> None:
    """Refuses an integration built with neither a `Lathe` nor an `AsyncLathe`."""
    if client is None and async_client is None:
        raise ValueError(f"{owner} needs a client (Lathe) or an async_client (AsyncLathe)")


def chunk_metadata(chunk: Chunk) -> dict[str, Any]:
    """The metadata of a retrieved chunk in a framework's document: the document's own metadata
    (strings, as Lathe stores them) and then CHUNK_METADATA_KEYS."""
    return {
        **chunk.metadata,
        "doc_id": chunk.doc_id,
        "doc_title": chunk.doc_title,
        "section_id": chunk.section_id,
        "section_title": chunk.section_title,
        "heading_path": list(chunk.heading_path),
        "char_start": chunk.char_span.start,
        "char_end": chunk.char_span.end,
        "byte_start": chunk.byte_span.start,
        "byte_end": chunk.byte_span.end,
        "token_count": chunk.token_count,
        "score": chunk.score,
        "score_bm25": chunk.score_parts.bm25,
        "score_section": chunk.score_parts.section,
        "score_dense": chunk.score_parts.dense,
        "strategy": chunk.strategy.value,
        "context": chunk.context,
    }


def lathe_metadata(metadata: Mapping[str, Any]) -> dict[str, str]:
    """A framework document's metadata as Lathe stores it (string to string, matched exactly by
    retrieve filters): strings as they are, None left out, anything else as JSON text (numbers
    and booleans as `3`, `2.5`, `true`; lists and dicts as JSON)."""
    stored: dict[str, str] = {}
    for key, value in metadata.items():
        if value is None:
            continue
        stored[str(key)] = value if isinstance(value, str) else json.dumps(value, default=str)
    return stored


def retrieve_arguments(
    token_budget: int,
    top_k: int | None,
    strategy: ChunkStrategy | str | None,
    metadata_filter: Mapping[str, str] | None,
    min_score: float | None,
    retrieve_kwargs: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of `Lathe.retrieve` (and `AsyncLathe.retrieve`) of a retriever's
    settings; `retrieve_kwargs` adds any other of its arguments (doc_ids, order,
    max_chunks_per_document, diversity, chunking, ...), `overrides` those of one call."""
    arguments: dict[str, Any] = {"budget": token_budget}
    if top_k is not None:
        arguments["top_k"] = top_k
    if strategy is not None:
        arguments["strategy"] = strategy
    if metadata_filter:
        arguments["metadata"] = dict(metadata_filter)
    if min_score is not None:
        arguments["min_score"] = min_score
    arguments.update(retrieve_kwargs)
    arguments.update(overrides or {})
    return arguments

