from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTION_STATE_UNSPECIFIED: _ClassVar[CollectionState]
    COLLECTION_STATE_READY: _ClassVar[CollectionState]
    COLLECTION_STATE_DAMAGED: _ClassVar[CollectionState]
    COLLECTION_STATE_OFFLINE: _ClassVar[CollectionState]

class DocumentFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOCUMENT_FORMAT_UNSPECIFIED: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_PLAIN: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_MARKDOWN: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_HTML: _ClassVar[DocumentFormat]

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_QUEUED: _ClassVar[OperationState]
    OPERATION_STATE_RUNNING: _ClassVar[OperationState]
    OPERATION_STATE_APPLIED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]

class OperationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_KIND_UNSPECIFIED: _ClassVar[OperationKind]
    OPERATION_KIND_UPSERT: _ClassVar[OperationKind]
    OPERATION_KIND_DELETE: _ClassVar[OperationKind]

class ChunkStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_STRATEGY_UNSPECIFIED: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_FIXED: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_SENTENCE: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_RECURSIVE: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_STRUCTURE: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_AUTO: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_SEMANTIC: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_CSV: _ClassVar[ChunkStrategy]
    CHUNK_STRATEGY_CODE: _ClassVar[ChunkStrategy]

class ChunkUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_UNIT_TOKENS: _ClassVar[ChunkUnit]
    CHUNK_UNIT_WORDS: _ClassVar[ChunkUnit]
    CHUNK_UNIT_CHARS: _ClassVar[ChunkUnit]

class SemanticThreshold(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEMANTIC_THRESHOLD_PERCENTILE: _ClassVar[SemanticThreshold]
    SEMANTIC_THRESHOLD_STD_DEV: _ClassVar[SemanticThreshold]
    SEMANTIC_THRESHOLD_INTERQUARTILE: _ClassVar[SemanticThreshold]
    SEMANTIC_THRESHOLD_GRADIENT: _ClassVar[SemanticThreshold]

class ResultOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_ORDER_SCORE: _ClassVar[ResultOrder]
    RESULT_ORDER_POSITION: _ClassVar[ResultOrder]

class Recovery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECOVERY_UNSPECIFIED: _ClassVar[Recovery]
    RECOVERY_RESEED: _ClassVar[Recovery]
    RECOVERY_START_OVER: _ClassVar[Recovery]
COLLECTION_STATE_UNSPECIFIED: CollectionState
COLLECTION_STATE_READY: CollectionState
COLLECTION_STATE_DAMAGED: CollectionState
COLLECTION_STATE_OFFLINE: CollectionState
DOCUMENT_FORMAT_UNSPECIFIED: DocumentFormat
DOCUMENT_FORMAT_PLAIN: DocumentFormat
DOCUMENT_FORMAT_MARKDOWN: DocumentFormat
DOCUMENT_FORMAT_HTML: DocumentFormat
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_QUEUED: OperationState
OPERATION_STATE_RUNNING: OperationState
OPERATION_STATE_APPLIED: OperationState
OPERATION_STATE_FAILED: OperationState
OPERATION_KIND_UNSPECIFIED: OperationKind
OPERATION_KIND_UPSERT: OperationKind
OPERATION_KIND_DELETE: OperationKind
CHUNK_STRATEGY_UNSPECIFIED: ChunkStrategy
CHUNK_STRATEGY_FIXED: ChunkStrategy
CHUNK_STRATEGY_SENTENCE: ChunkStrategy
CHUNK_STRATEGY_RECURSIVE: ChunkStrategy
CHUNK_STRATEGY_STRUCTURE: ChunkStrategy
CHUNK_STRATEGY_AUTO: ChunkStrategy
CHUNK_STRATEGY_SEMANTIC: ChunkStrategy
CHUNK_STRATEGY_CSV: ChunkStrategy
CHUNK_STRATEGY_CODE: ChunkStrategy
CHUNK_UNIT_TOKENS: ChunkUnit
CHUNK_UNIT_WORDS: ChunkUnit
CHUNK_UNIT_CHARS: ChunkUnit
SEMANTIC_THRESHOLD_PERCENTILE: SemanticThreshold
SEMANTIC_THRESHOLD_STD_DEV: SemanticThreshold
SEMANTIC_THRESHOLD_INTERQUARTILE: SemanticThreshold
SEMANTIC_THRESHOLD_GRADIENT: SemanticThreshold
RESULT_ORDER_SCORE: ResultOrder
RESULT_ORDER_POSITION: ResultOrder
RECOVERY_UNSPECIFIED: Recovery
RECOVERY_RESEED: Recovery
RECOVERY_START_OVER: Recovery

class CollectionSettings(_message.Message):
    __slots__ = ("budget_tokenizer", "default_chunking", "section_tokens")
    BUDGET_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CHUNKING_FIELD_NUMBER: _ClassVar[int]
    SECTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    budget_tokenizer: str
    default_chunking: ChunkingOptions
    section_tokens: int
    def __init__(self, budget_tokenizer: _Optional[str] = ..., default_chunking: _Optional[_Union[ChunkingOptions, _Mapping]] = ..., section_tokens: _Optional[int] = ...) -> None: ...

class CollectionStats(_message.Message):
    __slots__ = ("documents", "sections", "bytes", "generation", "dense")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    documents: int
    sections: int
    bytes: int
    generation: int
    dense: DenseStats
    def __init__(self, documents: _Optional[int] = ..., sections: _Optional[int] = ..., bytes: _Optional[int] = ..., generation: _Optional[int] = ..., dense: _Optional[_Union[DenseStats, _Mapping]] = ...) -> None: ...

class DenseStats(_message.Message):
    __slots__ = ("vectors", "sections_with_vector")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_WITH_VECTOR_FIELD_NUMBER: _ClassVar[int]
    vectors: int
    sections_with_vector: int
    def __init__(self, vectors: _Optional[int] = ..., sections_with_vector: _Optional[int] = ...) -> None: ...

class CollectionInfo(_message.Message):
    __slots__ = ("name", "settings", "stats", "state", "reason", "aliases")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: CollectionSettings
    stats: CollectionStats
    state: CollectionState
    reason: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[CollectionSettings, _Mapping]] = ..., stats: _Optional[_Union[CollectionStats, _Mapping]] = ..., state: _Optional[_Union[CollectionState, str]] = ..., reason: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("name", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: CollectionSettings
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[CollectionSettings, _Mapping]] = ...) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[CollectionInfo]
    def __init__(self, collections: _Optional[_Iterable[_Union[CollectionInfo, _Mapping]]] = ...) -> None: ...

class GetCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteCollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteCollectionResponse(_message.Message):
    __slots__ = ("consistency_token",)
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    consistency_token: int
    def __init__(self, consistency_token: _Optional[int] = ...) -> None: ...

class Alias(_message.Message):
    __slots__ = ("alias", "collection")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    alias: str
    collection: str
    def __init__(self, alias: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class CreateAliasRequest(_message.Message):
    __slots__ = ("alias", "collection")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    alias: str
    collection: str
    def __init__(self, alias: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class SwitchAliasRequest(_message.Message):
    __slots__ = ("alias", "collection")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    alias: str
    collection: str
    def __init__(self, alias: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class DeleteAliasRequest(_message.Message):
    __slots__ = ("alias",)
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    alias: str
    def __init__(self, alias: _Optional[str] = ...) -> None: ...

class DeleteAliasResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAliasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAliasesResponse(_message.Message):
    __slots__ = ("aliases",)
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    aliases: _containers.RepeatedCompositeFieldContainer[Alias]
    def __init__(self, aliases: _Optional[_Iterable[_Union[Alias, _Mapping]]] = ...) -> None: ...

class SectionBoundary(_message.Message):
    __slots__ = ("start", "end", "title")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    title: str
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., title: _Optional[str] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("id", "title", "text", "format", "metadata", "sections")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    text: str
    format: DocumentFormat
    metadata: _containers.ScalarMap[str, str]
    sections: _containers.RepeatedCompositeFieldContainer[SectionBoundary]
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., format: _Optional[_Union[DocumentFormat, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., sections: _Optional[_Iterable[_Union[SectionBoundary, _Mapping]]] = ...) -> None: ...

class UpsertDocumentsRequest(_message.Message):
    __slots__ = ("collection", "documents", "wait", "write_id")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    collection: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    wait: bool
    write_id: str
    def __init__(self, collection: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., wait: _Optional[bool] = ..., write_id: _Optional[str] = ...) -> None: ...

class DeleteDocumentsRequest(_message.Message):
    __slots__ = ("collection", "ids", "wait", "write_id")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    wait: bool
    write_id: str
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., wait: _Optional[bool] = ..., write_id: _Optional[str] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("documents", "sections", "generation", "consistency_token", "operation", "operation_ids")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    OPERATION_IDS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    sections: int
    generation: int
    consistency_token: int
    operation: Operation
    operation_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, documents: _Optional[int] = ..., sections: _Optional[int] = ..., generation: _Optional[int] = ..., consistency_token: _Optional[int] = ..., operation: _Optional[_Union[Operation, _Mapping]] = ..., operation_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("id", "collection", "kind", "state", "documents_total", "documents_done", "bytes_total", "bytes_done", "bytes_per_second", "eta_seconds", "error", "write_id", "consistency_token", "created_unix_ms", "started_unix_ms", "finished_unix_ms", "sections", "generation")
    ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    id: int
    collection: str
    kind: OperationKind
    state: OperationState
    documents_total: int
    documents_done: int
    bytes_total: int
    bytes_done: int
    bytes_per_second: float
    eta_seconds: float
    error: str
    write_id: str
    consistency_token: int
    created_unix_ms: int
    started_unix_ms: int
    finished_unix_ms: int
    sections: int
    generation: int
    def __init__(self, id: _Optional[int] = ..., collection: _Optional[str] = ..., kind: _Optional[_Union[OperationKind, str]] = ..., state: _Optional[_Union[OperationState, str]] = ..., documents_total: _Optional[int] = ..., documents_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., bytes_per_second: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., error: _Optional[str] = ..., write_id: _Optional[str] = ..., consistency_token: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., started_unix_ms: _Optional[int] = ..., finished_unix_ms: _Optional[int] = ..., sections: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ListOperationsRequest(_message.Message):
    __slots__ = ("collection", "limit")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    collection: str
    limit: int
    def __init__(self, collection: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListOperationsResponse(_message.Message):
    __slots__ = ("operations",)
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ...) -> None: ...

class WaitOperationRequest(_message.Message):
    __slots__ = ("id", "timeout_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ChunkingOptions(_message.Message):
    __slots__ = ("strategy", "max_tokens", "overlap_tokens", "unit", "separators", "semantic_threshold", "semantic_amount")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SEPARATORS_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_AMOUNT_FIELD_NUMBER: _ClassVar[int]
    strategy: ChunkStrategy
    max_tokens: int
    overlap_tokens: int
    unit: ChunkUnit
    separators: _containers.RepeatedScalarFieldContainer[str]
    semantic_threshold: SemanticThreshold
    semantic_amount: float
    def __init__(self, strategy: _Optional[_Union[ChunkStrategy, str]] = ..., max_tokens: _Optional[int] = ..., overlap_tokens: _Optional[int] = ..., unit: _Optional[_Union[ChunkUnit, str]] = ..., separators: _Optional[_Iterable[str]] = ..., semantic_threshold: _Optional[_Union[SemanticThreshold, str]] = ..., semantic_amount: _Optional[float] = ...) -> None: ...

class MetadataTerm(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("metadata", "doc_ids")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.RepeatedCompositeFieldContainer[MetadataTerm]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metadata: _Optional[_Iterable[_Union[MetadataTerm, _Mapping]]] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RetrieveRequest(_message.Message):
    __slots__ = ("collection", "query", "top_k", "token_budget", "chunking", "filter", "order", "min_score", "max_chunks_per_document", "diversity", "consistency_token")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNKS_PER_DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    DIVERSITY_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    collection: str
    query: str
    top_k: int
    token_budget: int
    chunking: ChunkingOptions
    filter: Filter
    order: ResultOrder
    min_score: float
    max_chunks_per_document: int
    diversity: float
    consistency_token: int
    def __init__(self, collection: _Optional[str] = ..., query: _Optional[str] = ..., top_k: _Optional[int] = ..., token_budget: _Optional[int] = ..., chunking: _Optional[_Union[ChunkingOptions, _Mapping]] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ..., order: _Optional[_Union[ResultOrder, str]] = ..., min_score: _Optional[float] = ..., max_chunks_per_document: _Optional[int] = ..., diversity: _Optional[float] = ..., consistency_token: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ScoreParts(_message.Message):
    __slots__ = ("bm25", "section", "dense")
    BM25_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    bm25: float
    section: float
    dense: float
    def __init__(self, bm25: _Optional[float] = ..., section: _Optional[float] = ..., dense: _Optional[float] = ...) -> None: ...

class RetrievedChunk(_message.Message):
    __slots__ = ("doc_id", "section_id", "section_title", "heading_path", "doc_title", "text", "bytes", "chars", "token_count", "score", "score_parts", "strategy", "metadata", "context")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_TITLE_FIELD_NUMBER: _ClassVar[int]
    HEADING_PATH_FIELD_NUMBER: _ClassVar[int]
    DOC_TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section_id: str
    section_title: str
    heading_path: _containers.RepeatedScalarFieldContainer[str]
    doc_title: str
    text: str
    bytes: Span
    chars: Span
    token_count: int
    score: float
    score_parts: ScoreParts
    strategy: ChunkStrategy
    metadata: _containers.ScalarMap[str, str]
    context: str
    def __init__(self, doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., section_title: _Optional[str] = ..., heading_path: _Optional[_Iterable[str]] = ..., doc_title: _Optional[str] = ..., text: _Optional[str] = ..., bytes: _Optional[_Union[Span, _Mapping]] = ..., chars: _Optional[_Union[Span, _Mapping]] = ..., token_count: _Optional[int] = ..., score: _Optional[float] = ..., score_parts: _Optional[_Union[ScoreParts, _Mapping]] = ..., strategy: _Optional[_Union[ChunkStrategy, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., context: _Optional[str] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "micros")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MICROS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    micros: int
    def __init__(self, stage: _Optional[str] = ..., micros: _Optional[int] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("chunks", "tokens_used", "token_budget", "generation", "cache_hit", "timings", "sections_considered", "chunks_considered", "log_position")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_CONSIDERED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_CONSIDERED_FIELD_NUMBER: _ClassVar[int]
    LOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[RetrievedChunk]
    tokens_used: int
    token_budget: int
    generation: int
    cache_hit: bool
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    sections_considered: int
    chunks_considered: int
    log_position: int
    def __init__(self, chunks: _Optional[_Iterable[_Union[RetrievedChunk, _Mapping]]] = ..., tokens_used: _Optional[int] = ..., token_budget: _Optional[int] = ..., generation: _Optional[int] = ..., cache_hit: _Optional[bool] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., sections_considered: _Optional[int] = ..., chunks_considered: _Optional[int] = ..., log_position: _Optional[int] = ...) -> None: ...

class CreateSnapshotRequest(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    def __init__(self, collection: _Optional[str] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("collection", "name", "bytes", "generation", "created_unix_ms")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    bytes: int
    generation: int
    created_unix_ms: int
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ..., bytes: _Optional[int] = ..., generation: _Optional[int] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    def __init__(self, collection: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("collection", "name")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DownloadSnapshotRequest(_message.Message):
    __slots__ = ("collection", "name")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class RestoreSnapshotRequest(_message.Message):
    __slots__ = ("collection", "snapshot_collection", "snapshot_name", "data")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    collection: str
    snapshot_collection: str
    snapshot_name: str
    data: bytes
    def __init__(self, collection: _Optional[str] = ..., snapshot_collection: _Optional[str] = ..., snapshot_name: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RestoreSnapshotResponse(_message.Message):
    __slots__ = ("collection", "source_collection", "generation", "files", "bytes")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    collection: CollectionInfo
    source_collection: str
    generation: int
    files: int
    bytes: int
    def __init__(self, collection: _Optional[_Union[CollectionInfo, _Mapping]] = ..., source_collection: _Optional[str] = ..., generation: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class RecoverLogRequest(_message.Message):
    __slots__ = ("recovery", "confirm_stream")
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_STREAM_FIELD_NUMBER: _ClassVar[int]
    recovery: Recovery
    confirm_stream: str
    def __init__(self, recovery: _Optional[_Union[Recovery, str]] = ..., confirm_stream: _Optional[str] = ...) -> None: ...

class RecoverLogResponse(_message.Message):
    __slots__ = ("incarnation", "collections", "documents", "aliases", "log_position", "skipped")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    LOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    collections: int
    documents: int
    aliases: int
    log_position: int
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, incarnation: _Optional[str] = ..., collections: _Optional[int] = ..., documents: _Optional[int] = ..., aliases: _Optional[int] = ..., log_position: _Optional[int] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...
