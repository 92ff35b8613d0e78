"""Plain dataclasses and enums of the Lathe API, free of protobuf types."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Sequence

# The package re-exports exactly these (lathe_client/__init__.py).
__all__ = [
    "Alias",
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
    "Operation",
    "OperationKind",
    "OperationState",
    "Recovered",
    "Recovery",
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
    # The aliases naming this collection, by name.
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Alias:
    """A second name for a collection: any call taking a collection name accepts it."""

    alias: str
    collection: str


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a collection kept by the server (`data_dir/snapshots/<collection>/<name>`)."""

    collection: str
    name: str
    bytes: int
    generation: int
    created_unix_ms: int


@dataclass(frozen=True)
class Restored:
    """A collection created from a snapshot: its name, and what the snapshot held."""

    collection: str
    source_collection: str
    generation: int
    files: int
    bytes: int


@dataclass(frozen=True)
class CollectionDeleted:
    """What `delete_collection` deleted."""

    name: str
    # With replication: the delete's position in the log (see WriteResult). 0 on a single node.
    consistency_token: int = 0


class OperationState(enum.Enum):
    """Where a queued write stands (see lathe.proto OperationState)."""

    UNSPECIFIED = "unspecified"
    # Durable in the write queue, waiting for the collection's index worker.
    QUEUED = "queued"
    # Being embedded and applied.
    RUNNING = "running"
    # Visible to every retrieve.
    APPLIED = "applied"
    # Not applied (or, when documents_done > 0, applied up to that document); `error` says why.
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        """APPLIED or FAILED: the state will not change any more."""
        return self in (OperationState.APPLIED, OperationState.FAILED)


class OperationKind(enum.Enum):
    UNSPECIFIED = "unspecified"
    UPSERT = "upsert"
    DELETE = "delete"


class Recovery(enum.Enum):
    """What an operator decides once a replicated write log is lost (see lathe.proto Recovery)."""

    UNSPECIFIED = "unspecified"
    # A new log holding the data of the replica asked.
    RESEED = "reseed"
    # A new, empty log.
    START_OVER = "start_over"


@dataclass(frozen=True)
class Recovered:
    """What `Lathe.recover_log` did (see lathe.proto RecoverLogResponse)."""

    incarnation: str
    collections: int
    documents: int
    aliases: int
    log_position: int
    # Collections the replica could not read, "name: why": not in the new log.
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Operation:
    """The progress of one queued write (a single node's write queue; see lathe.proto
    Operation)."""

    id: int
    collection: str
    kind: OperationKind
    state: OperationState
    documents_total: int = 0
    documents_done: int = 0
    # Bytes of document text (deletes: of document ids).
    bytes_total: int = 0
    bytes_done: int = 0
    # Text embedded and applied per second: while running, so far; once applied, overall.
    bytes_per_second: float = 0.0
    # While queued or running: the seconds left at the collection's recent rate (None until
    # there is one).
    eta_seconds: float | None = None
    # Why a failed operation failed ("" otherwise).
    error: str = ""
    write_id: str = ""
    # Pass it to `retrieve(..., consistency_token=)` to read this write (on a single node, the
    # operation's id).
    consistency_token: int = 0
    # Unix time in milliseconds; 0 when not yet.
    created_unix_ms: int = 0
    started_unix_ms: int = 0
    finished_unix_ms: int = 0
    # Once applied: the sections indexed and the generation that shows the write.
    sections: int = 0
    generation: int = 0

    @property
    def ended(self) -> bool:
        """Applied or failed: the operation will not change any more."""
        return self.state.ended

    @property
    def applied(self) -> bool:
        return self.state is OperationState.APPLIED

    @property
    def failed(self) -> bool:
        return self.state is OperationState.FAILED

    @property
    def fraction_done(self) -> float:
        """Share of the write's bytes applied, 0..1 (1 once applied)."""
        if self.state is OperationState.APPLIED:
            return 1.0
        if self.bytes_total == 0:
            return 0.0
        return min(1.0, self.bytes_done / self.bytes_total)

    def line(self) -> str:
        """One line for a progress display: state, documents, megabytes, rate and ETA."""
        eta = "" if self.eta_seconds is None or self.ended else f", ETA {self.eta_seconds:.1f} s"
        text = (
            f"operation {self.id} {self.state.name}: "
            f"documents {self.documents_done}/{self.documents_total}, "
            f"{self.bytes_done / 1e6:.2f}/{self.bytes_total / 1e6:.2f} MB, "
            f"{self.bytes_per_second / 1e6:.2f} MB/s{eta}"
        )
        return f"{text}: {self.error}" if self.error else text


@dataclass(frozen=True)
class WriteResult:
    """What a write did. Without wait the write is queued (its `operation` QUEUED, RUNNING or
    already APPLIED) and `sections` and `generation` are 0; with wait it is applied."""

    documents: int
    sections: int
    # With wait=True: the index generation at which the write is visible; otherwise 0.
    generation: int
    # Pass it to `retrieve(..., consistency_token=)` to read the write: on a single node the
    # (last) operation's id, with replication the write's position in the log (on any replica).
    consistency_token: int = 0
    # The write's (last) operation as last seen (single node; None with replication, where
    # writes are applied before they are acknowledged).
    operation: Operation | None = None
    # Every operation the write queued, in order: one per request the client sent (an upsert
    # larger than one message is sent as several) or per message of an upload.
    operation_ids: tuple[int, ...] = ()


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
