"""Plain dataclasses and enums of the Lathe API, free of protobuf types."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Sequence

# The package re-exports exactly these (lathe_client/__init__.py).
__all__ = [
    "Chunk",
    "Chunking",
    "ChunkStrategy",
    "ChunkUnit",
    "CollectionDeleted",
    "CollectionInfo",
    "CollectionSettings",
    "CollectionState",
    "CollectionStats",
    "Document",
    "DocumentFormat",
    "ResultOrder",
    "RetrieveResult",
    "ScoreParts",
    "SectionBoundary",
    "SemanticThreshold",
    "Span",
    "StageTiming",
    "WriteResult",
]


class DocumentFormat(enum.Enum):
    """How Lathe parses a document's text."""

    PLAIN = "plain"
    MARKDOWN = "markdown"
    HTML = "html"


class ChunkStrategy(enum.Enum):
    """How retrieved sections are re-chunked at query time (see lathe.proto ChunkStrategy)."""

    UNSPECIFIED = "unspecified"
    FIXED = "fixed"
    SENTENCE = "sentence"
    RECURSIVE = "recursive"
    STRUCTURE = "structure"
    AUTO = "auto"
    SEMANTIC = "semantic"
    CSV = "csv"
    CODE = "code"


class SemanticThreshold(enum.Enum):
    """The semantic strategy's breakpoint rule over sentence distances (see lathe.proto)."""

    PERCENTILE = "percentile"
    STD_DEV = "std_dev"
    INTERQUARTILE = "interquartile"
    GRADIENT = "gradient"


class ChunkUnit(enum.Enum):
    """Unit of a fixed window."""

    TOKENS = "tokens"
    WORDS = "words"
    CHARS = "chars"


class ResultOrder(enum.Enum):
    """SCORE: best chunk first. POSITION: grouped by document, in document order, each chunk
    under its heading path (in `context`, counted in the budget)."""

    SCORE = "score"
    POSITION = "position"


@dataclass(frozen=True)
class SectionBoundary:
    """A caller-given section, in code points into the document text (end exclusive)."""

    start: int
    end: int
    title: str = ""


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str = ""
    # A DocumentFormat or its value ("plain", "markdown", "html").
    format: DocumentFormat | str = DocumentFormat.PLAIN
    metadata: Mapping[str, str] = field(default_factory=dict)
    sections: Sequence[SectionBoundary] = ()


@dataclass(frozen=True)
class Chunking:
    """Chunking options of a request or a collection's default."""

    strategy: ChunkStrategy = ChunkStrategy.UNSPECIFIED
    max_tokens: int | None = None
    overlap_tokens: int | None = None
    unit: ChunkUnit = ChunkUnit.TOKENS
    separators: Sequence[str] = ()
    semantic_threshold: SemanticThreshold = SemanticThreshold.PERCENTILE
    semantic_amount: float | None = None


@dataclass(frozen=True)
class CollectionSettings:
    budget_tokenizer: str = ""
    default_chunking: Chunking | None = None
    section_tokens: int | None = None


@dataclass(frozen=True)
class CollectionStats:
    documents: int
    sections: int
    bytes: int
    generation: int


class CollectionState(enum.Enum):
    """Whether a collection can serve (see lathe.proto CollectionState)."""

    UNSPECIFIED = "unspecified"
    READY = "ready"
    # Its own files are missing, truncated or garbled: calls to it raise DATA_LOSS.
    DAMAGED = "damaged"
    # Its tokenizer file is missing; its data is intact: calls raise FAILED_PRECONDITION.
    OFFLINE = "offline"


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    # None when the collection's collection.json cannot be read.
    settings: CollectionSettings | None
    # None when the collection is not READY.
    stats: CollectionStats | None
    state: CollectionState = CollectionState.READY
    # Why the collection is not READY: the file and the cause ("" when READY).
    reason: str = ""


@dataclass(frozen=True)
class CollectionDeleted:
    """What `delete_collection` deleted."""

    name: str
    # With replication: the delete's position in the log (see WriteResult). 0 on a single node.
    consistency_token: int = 0


@dataclass(frozen=True)
class WriteResult:
    documents: int
    sections: int
    # With wait=True: the index generation at which the write is visible; otherwise 0.
    generation: int
    # With replication: the write's position in the log; pass it to `retrieve(...,
    # consistency_token=)` on any replica to read the write there. 0 on a single node.
    consistency_token: int = 0


@dataclass(frozen=True)
class Span:
    """Half-open [start, end) range."""

    start: int
    end: int


@dataclass(frozen=True)
class ScoreParts:
    bm25: float
    section: float
    dense: float


@dataclass(frozen=True)
class Chunk:
    """One retrieved chunk. `byte_span` indexes the UTF-8 bytes and `char_span` the code points
    of the document text as Lathe stores it, so `text == doc_text[char_span.start:char_span.end]`."""

    text: str
    doc_id: str
    # The section the chunk starts in: a chunk runs on into the next sections of the same
    # heading path when only whitespace lies between them.
    section_id: str
    section_title: str
    heading_path: tuple[str, ...]
    doc_title: str
    byte_span: Span
    char_span: Span
    token_count: int
    score: float
    score_parts: ScoreParts
    strategy: ChunkStrategy
    metadata: Mapping[str, str]
    # What to read before the text: in POSITION order the section's heading path (" > ") as a
    # line, then the header rows of a table this chunk continues without holding them; "" for
    # most chunks in SCORE order. `token_count` counts `context + "\n" + text` when it is set.
    context: str = ""

    @property
    def full_text(self) -> str:
        """What to put in a prompt: the context (when there is one), a line break, the text."""
        return f"{self.context}\n{self.text}" if self.context else self.text


@dataclass(frozen=True)
class StageTiming:
    stage: str
    micros: int


@dataclass(frozen=True)
class RetrieveResult:
    chunks: list[Chunk]
    tokens_used: int
    token_budget: int
    generation: int
    cache_hit: bool
    sections_considered: int
    chunks_considered: int
    timings: list[StageTiming]
    # With replication: the log position the answering replica had applied. 0 on a single node.
    log_position: int = 0
