"""What the synchronous `Lathe` and the asyncio `AsyncLathe` share: the channel's settings, the
requests each method sends and the conversion of answers to the plain types of `types.py`. Only
the calls themselves (blocking or awaited) and the waits between them differ between the two."""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

import grpc
from grpc_health.v1 import health_pb2

from lathe_client._proto.lathe.v1 import lathe_pb2
from lathe_client.batching import batch_end
from lathe_client.errors import LatheError, OperationFailed, WriteQueued
from lathe_client.types import (
    Chunk,
    Restored,
    Snapshot,
    Chunking,
    ChunkStrategy,
    ChunkUnit,
    CollectionInfo,
    CollectionSettings,
    CollectionState,
    CollectionStats,
    Document,
    DocumentFormat,
    Operation,
    OperationKind,
    OperationState,
    Recovered,
    Recovery,
    ResultOrder,
    RetrieveResult,
    ScoreParts,
    SectionBoundary,
    SemanticThreshold,
    Span,
    StageTiming,
    WriteResult,
)

# The server's default limits.max_message_bytes.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
# The server's default limits.max_batch_documents: the most documents in one upsert request.
DEFAULT_MAX_BATCH_DOCUMENTS = 10_000
# The server's bound on a write_id.
MAX_WRITE_ID_BYTES = 128
# The name the server reports SERVING under once its indexes and models are loaded.
SERVICE_NAME = "lathe.v1.Lathe"
# Attempts of a call answered UNAVAILABLE or RESOURCE_EXHAUSTED (the gRPC retry policy).
DEFAULT_MAX_ATTEMPTS = 5
# Longest single WaitOperation call of a wait (the wait itself goes on until the write ends).
WAIT_STEP_SECONDS = 10.0
# A WaitOperation call's deadline past the time it asks the server to wait.
_WAIT_CALL_SLACK_SECONDS = 5.0
# Room left in a message for protobuf framing the client does not count.
_MESSAGE_SLACK = 1024


def retry_service_config(max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> str:
    """The channel's service config: every lathe.v1.Lathe call answered UNAVAILABLE or
    RESOURCE_EXHAUSTED (a full write queue, a server shedding load) is tried again, up to
    `max_attempts` in all, with exponential backoff (gRPC's jittered delays of up to 0.5, 1, 2,
    4 s, ..., at most 8 s), within the call's deadline. Writes are safe to retry because each
    carries a write_id. CreateCollection, DeleteCollection, CreateAlias, DeleteAlias,
    DeleteSnapshot and RestoreSnapshot are not retried: a retry of one that was applied would
    answer ALREADY_EXISTS or NOT_FOUND (SwitchAlias is: switching twice to one collection is
    switching once), and neither is CreateSnapshot, whose retry would take a second snapshot.
    max_attempts 1: no retries."""
    retried: dict[str, Any] = {"name": [{"service": SERVICE_NAME}]}
    if max_attempts > 1:
        retried["retryPolicy"] = {
            "maxAttempts": max_attempts,
            "initialBackoff": "0.5s",
            "maxBackoff": "8s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
        }
    not_retried = {
        "name": [
            {"service": SERVICE_NAME, "method": "CreateCollection"},
            {"service": SERVICE_NAME, "method": "DeleteCollection"},
            {"service": SERVICE_NAME, "method": "CreateAlias"},
            {"service": SERVICE_NAME, "method": "DeleteAlias"},
            {"service": SERVICE_NAME, "method": "CreateSnapshot"},
            {"service": SERVICE_NAME, "method": "DeleteSnapshot"},
            {"service": SERVICE_NAME, "method": "RestoreSnapshot"},
        ]
    }
    return json.dumps({"methodConfig": [retried, not_retried]})


class _UseClientTimeout:
    """`_call`'s default deadline: the client's `timeout`."""


_CLIENT_TIMEOUT = _UseClientTimeout()

StrategyLike = Union[ChunkStrategy, str]
DocumentLike = Union[Document, Mapping[str, Any]]
PemLike = Union[bytes, str, "os.PathLike[str]"]


# -- channel ----------------------------------------------------------------------------


def _channel_options(
    max_message_bytes: int, max_attempts: int, server_name: str | None
) -> list[tuple[str, Any]]:
    """The channel arguments of a client: message limits and the retry policy."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry_service_config(max_attempts)),
        # A sent message stays buffered for a retry up to this size (default 256 KiB): as
        # large as a message may be, so that a large write is retried too.
        ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
    ]
    if server_name:
        # Lets a certificate issued for a DNS name be checked while dialling an IP address.
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def _channel_credentials(
    tls: bool, root_certificates: PemLike | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials when `tls` or `root_certificates` ask for TLS; None: a plaintext channel."""
    if not tls and root_certificates is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read_pem(root_certificates))


def _serving_status_name(response: health_pb2.HealthCheckResponse) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def _not_ready(service: str, timeout: float, last_error: LatheError | None) -> LatheError:
    """What `wait_until_ready` raises when `service` was not SERVING in time."""
    if last_error is not None:
        return last_error
    return LatheError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{service} not SERVING after {timeout}s")


def _deadline(timeout: float | None) -> float | None:
    """The time.monotonic() at which `timeout` seconds from now end (None: never)."""
    return None if timeout is None else time.monotonic() + timeout


# -- requests ---------------------------------------------------------------------------


def _create_collection_request(
    name: str,
    budget_tokenizer: str,
    default_chunking: Chunking | None,
    section_tokens: int | None,
) -> lathe_pb2.CreateCollectionRequest:
    settings = lathe_pb2.CollectionSettings(budget_tokenizer=budget_tokenizer)
    if default_chunking is not None:
        settings.default_chunking.CopyFrom(_chunking_to_proto(default_chunking))
    if section_tokens is not None:
        settings.section_tokens = section_tokens
    return lathe_pb2.CreateCollectionRequest(name=name, settings=settings)


class _ClientBase:
    """The settings `Lathe` and `AsyncLathe` share (see `Lathe` for the arguments), and the
    cutting of an upsert into requests; each subclass opens its own kind of channel with
    `_options` and `_credentials`."""

    def __init__(
        self,
        target: str,
        *,
        tls: bool,
        root_certificates: PemLike | None,
        server_name: str | None,
        api_key: str | None,
        timeout: float | None,
        max_message_bytes: int,
        max_batch_documents: int,
        max_attempts: int,
    ) -> None:
        if max_batch_documents < 1:
            raise ValueError("max_batch_documents must be at least 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.target = target
        self.timeout = timeout
        self._max_message_bytes = max_message_bytes
        self._max_batch_documents = max_batch_documents
        self._options = _channel_options(max_message_bytes, max_attempts, server_name)
        self._credentials = _channel_credentials(tls, root_certificates)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )

    def _upsert_requests(
        self, collection: str, documents: Iterable[DocumentLike], write_id: str
    ) -> list[lathe_pb2.UpsertDocumentsRequest]:
        return self._split_upsert(collection, [_document_to_proto(d) for d in documents], write_id)

    def _split_upsert(
        self, collection: str, protos: list[lathe_pb2.Document], write_id: str
    ) -> list[lathe_pb2.UpsertDocumentsRequest]:
        """The requests of one upsert: as few as keep each under this client's largest message
        and the server's documents per request, in order; each with its own write id."""
        sizes = [_field_bytes(p.ByteSize()) for p in protos]
        # Everything but the documents, with room for the longest write id a part can carry.
        envelope = lathe_pb2.UpsertDocumentsRequest(
            collection=collection, write_id=write_id + "/" + "9" * 20
        ).ByteSize()
        budget = self._max_message_bytes - envelope - _MESSAGE_SLACK
        for i, size in enumerate(sizes):
            if size > budget:
                raise LatheError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"documents[{i}] (`{protos[i].id}`) is {size} bytes as a message, more than "
                    f"this client sends in one ({self._max_message_bytes} bytes, "
                    "max_message_bytes less the request's other fields); nothing was sent",
                    "UpsertDocuments",
                )
        bounds, start = [], 0
        while start < len(protos):
            end = batch_end(sizes, start, budget, self._max_batch_documents)
            bounds.append((start, end))
            start = end
        if not bounds:
            bounds = [(0, 0)]
        return [
            lathe_pb2.UpsertDocumentsRequest(
                collection=collection,
                documents=protos[begin:end],
                write_id=_part_write_id(write_id, i, len(bounds)),
            )
            for i, (begin, end) in enumerate(bounds)
        ]


def _upload_request(
    collection: str, batch: Iterable[DocumentLike], write_id: str, index: int
) -> lathe_pb2.UpsertDocumentsRequest:
    """Message `index` of an upload: one batch, with the write id `f"{write_id}/{index}"`."""
    return lathe_pb2.UpsertDocumentsRequest(
        collection=collection,
        documents=[_document_to_proto(d) for d in batch],
        write_id=_part_write_id(write_id, index, 2),
    )


def _upload_requests(
    collection: str, batches: Iterable[Iterable[DocumentLike]], write_id: str
) -> Iterator[lathe_pb2.UpsertDocumentsRequest]:
    """The messages of an upload, one per batch, made as the stream reads them."""
    return (_upload_request(collection, b, write_id, i) for i, b in enumerate(batches))


def _warn_ignored_batch_sizing(
    batch_seconds: float | None, first_batch_bytes: int | None, max_batch_documents: int | None
) -> None:
    """`upload_documents`' warning for the batch sizing arguments it no longer uses."""
    if any(v is not None for v in (batch_seconds, first_batch_bytes, max_batch_documents)):
        warnings.warn(
            "upload_documents' batch sizing is ignored: the server queues writes of any size; "
            "use upsert(..., wait=True)",
            DeprecationWarning,
            stacklevel=3,
        )


def _retrieve_request(
    collection: str,
    query: str,
    *,
    budget: int,
    top_k: int | None,
    strategy: StrategyLike | None,
    max_tokens: int | None,
    overlap_tokens: int | None,
    chunking: Chunking | None,
    metadata: Mapping[str, str] | None,
    doc_ids: Sequence[str],
    order: ResultOrder | str,
    min_score: float | None,
    max_chunks_per_document: int | None,
    diversity: float | None,
    consistency_token: int,
) -> lathe_pb2.RetrieveRequest:
    """The RetrieveRequest of `Lathe.retrieve`'s arguments."""
    if chunking is None:
        chunking = Chunking(
            strategy=_strategy(strategy) if strategy is not None else ChunkStrategy.UNSPECIFIED,
            max_tokens=max_tokens,
            overlap_tokens=overlap_tokens,
        )
    elif strategy is not None or max_tokens is not None or overlap_tokens is not None:
        raise ValueError("give either `chunking` or strategy/max_tokens/overlap_tokens")
    request = lathe_pb2.RetrieveRequest(
        collection=collection,
        query=query,
        token_budget=budget,
        chunking=_chunking_to_proto(chunking),
        order=_order(order),
        consistency_token=consistency_token,
    )
    if top_k is not None:
        request.top_k = top_k
    if min_score is not None:
        request.min_score = min_score
    if max_chunks_per_document is not None:
        request.max_chunks_per_document = max_chunks_per_document
    if diversity is not None:
        request.diversity = diversity
    if metadata or doc_ids:
        request.filter.CopyFrom(
            lathe_pb2.Filter(
                metadata=[
                    lathe_pb2.MetadataTerm(key=key, value=value)
                    for key, value in (metadata or {}).items()
                ],
                doc_ids=list(doc_ids),
            )
        )
    return request


def _visible_request(collection: str, token: int) -> lathe_pb2.RetrieveRequest:
    """A retrieve that answers once the write at log position `token` is visible on the
    replica that answers it (replication's wait)."""
    return lathe_pb2.RetrieveRequest(
        collection=collection,
        query="*",
        top_k=1,
        token_budget=1,
        consistency_token=token,
    )


def _wait_step(
    operation_id: int, deadline: float | None
) -> tuple[lathe_pb2.WaitOperationRequest, float]:
    """The next WaitOperation call of a wait until `deadline` (time.monotonic(); None: no end):
    the request, which asks the server to wait at most WAIT_STEP_SECONDS, and the call's
    deadline in seconds."""
    step = WAIT_STEP_SECONDS
    if deadline is not None:
        step = max(0.0, min(step, deadline - time.monotonic()))
    request = lathe_pb2.WaitOperationRequest(id=operation_id, timeout_ms=int(step * 1000))
    return request, step + _WAIT_CALL_SLACK_SECONDS


def _wait_over(answer: Operation, deadline: float | None) -> bool:
    """Whether a wait stops at this WaitOperation answer: the operation ended or time is up."""
    return answer.ended or (deadline is not None and time.monotonic() >= deadline)


@dataclass(frozen=True)
class _Write:
    """The answers to the requests of one write (an upsert sent in parts has several)."""

    method: str
    collection: str
    write_id: str
    responses: Sequence[lathe_pb2.WriteResponse]

    @property
    def operation_ids(self) -> tuple[int, ...]:
        return tuple(i for r in self.responses for i in r.operation_ids)

    @property
    def consistency_token(self) -> int:
        return max((r.consistency_token for r in self.responses), default=0)

    @property
    def replicated(self) -> bool:
        """With replication there are no operations: the write is in the log at
        `consistency_token`, and a retrieve carrying it answers once the replica applied it."""
        return not self.operation_ids and bool(self.consistency_token)

    def answered(self, generation: int | None = None) -> WriteResult:
        """The result as the server answered it (without waiting on operations); `generation`:
        the one a replication wait saw."""
        return WriteResult(
            documents=sum(r.documents for r in self.responses),
            sections=sum(r.sections for r in self.responses),
            generation=(
                max((r.generation for r in self.responses), default=0)
                if generation is None
                else generation
            ),
            consistency_token=self.consistency_token,
            operation=next(
                (
                    _operation_from_proto(r.operation)
                    for r in reversed(self.responses)
                    if r.HasField("operation")
                ),
                None,
            ),
            operation_ids=self.operation_ids,
        )

    def check_ended(self, ended: Operation, timeout: float | None) -> Operation:
        """The operation once waited on: it when APPLIED; raises OperationFailed when it
        FAILED and WriteQueued when the wait of `timeout` seconds ran out first."""
        if ended.state is OperationState.FAILED:
            raise OperationFailed(ended, self.method)
        if ended.state is not OperationState.APPLIED:
            raise WriteQueued(
                f"operation {ended.id} of collection `{self.collection}` is still "
                f"{ended.state.name} after waiting {timeout} s; it stays queued and will be "
                "applied (wait_operation follows it)",
                self.method,
                operation_id=ended.id,
                collection=self.collection,
                write_id=ended.write_id or self.write_id,
                operation=ended,
                operation_ids=self.operation_ids,
            )
        return ended

    def applied(self, operations: Sequence[Operation]) -> WriteResult:
        """The result once every operation of the write is applied (`operations`, in order)."""
        return WriteResult(
            documents=sum(r.documents for r in self.responses),
            sections=sum(o.sections for o in operations),
            generation=max(o.generation for o in operations),
            consistency_token=self.consistency_token,
            operation=operations[-1],
            operation_ids=self.operation_ids,
        )


# -- conversions ------------------------------------------------------------------------


def _read_pem(value: PemLike | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    return Path(value).read_bytes()


def _strategy(value: StrategyLike) -> ChunkStrategy:
    if isinstance(value, ChunkStrategy):
        return value
    try:
        return ChunkStrategy(value.lower())
    except ValueError:
        names = ", ".join(s.value for s in ChunkStrategy)
        raise ValueError(f"unknown chunk strategy {value!r}; expected one of {names}") from None


# Protobuf enum fields accept their value names, which keeps these mappings typed.
def _order(value: ResultOrder | str) -> str:
    order = value if isinstance(value, ResultOrder) else ResultOrder(value.lower())
    return f"RESULT_ORDER_{order.name}"


def _chunking_to_proto(chunking: Chunking) -> lathe_pb2.ChunkingOptions:
    options = lathe_pb2.ChunkingOptions(
        strategy=f"CHUNK_STRATEGY_{chunking.strategy.name}",
        unit=f"CHUNK_UNIT_{chunking.unit.name}",
        separators=list(chunking.separators),
        semantic_threshold=f"SEMANTIC_THRESHOLD_{chunking.semantic_threshold.name}",
    )
    if chunking.semantic_amount is not None:
        options.semantic_amount = chunking.semantic_amount
    if chunking.max_tokens is not None:
        options.max_tokens = chunking.max_tokens
    if chunking.overlap_tokens is not None:
        options.overlap_tokens = chunking.overlap_tokens
    return options


def _chunking_from_proto(options: lathe_pb2.ChunkingOptions) -> Chunking:
    return Chunking(
        strategy=_strategy_from_proto(options.strategy),
        max_tokens=options.max_tokens if options.HasField("max_tokens") else None,
        overlap_tokens=options.overlap_tokens if options.HasField("overlap_tokens") else None,
        unit=ChunkUnit[lathe_pb2.ChunkUnit.Name(options.unit).removeprefix("CHUNK_UNIT_")],
        separators=tuple(options.separators),
        semantic_threshold=SemanticThreshold[
            lathe_pb2.SemanticThreshold.Name(options.semantic_threshold).removeprefix(
                "SEMANTIC_THRESHOLD_"
            )
        ],
        semantic_amount=(
            options.semantic_amount if options.HasField("semantic_amount") else None
        ),
    )


def _strategy_from_proto(value: int) -> ChunkStrategy:
    name = lathe_pb2.ChunkStrategy.Name(value).removeprefix("CHUNK_STRATEGY_")
    return ChunkStrategy[name]


def _document_to_proto(document: DocumentLike) -> lathe_pb2.Document:
    if not isinstance(document, Document):
        document = Document(**document)
    document_format = document.format
    if isinstance(document_format, str):
        document_format = DocumentFormat(document_format.lower())
    return lathe_pb2.Document(
        id=document.id,
        title=document.title,
        text=document.text,
        format=f"DOCUMENT_FORMAT_{document_format.name}",
        metadata=dict(document.metadata),
        sections=[
            lathe_pb2.SectionBoundary(start=s.start, end=s.end, title=s.title)
            for s in (
                b if isinstance(b, SectionBoundary) else SectionBoundary(**b)
                for b in document.sections
            )
        ],
    )


_COLLECTION_STATES = {
    lathe_pb2.COLLECTION_STATE_UNSPECIFIED: CollectionState.UNSPECIFIED,
    lathe_pb2.COLLECTION_STATE_READY: CollectionState.READY,
    lathe_pb2.COLLECTION_STATE_DAMAGED: CollectionState.DAMAGED,
    lathe_pb2.COLLECTION_STATE_OFFLINE: CollectionState.OFFLINE,
}


def _collection_from_proto(info: lathe_pb2.CollectionInfo) -> CollectionInfo:
    settings = info.settings
    return CollectionInfo(
        name=info.name,
        settings=(
            CollectionSettings(
                budget_tokenizer=settings.budget_tokenizer,
                default_chunking=(
                    _chunking_from_proto(settings.default_chunking)
                    if settings.HasField("default_chunking")
                    else None
                ),
                section_tokens=(
                    settings.section_tokens if settings.HasField("section_tokens") else None
                ),
            )
            if info.HasField("settings")
            else None
        ),
        stats=(
            CollectionStats(
                documents=info.stats.documents,
                sections=info.stats.sections,
                bytes=info.stats.bytes,
                generation=info.stats.generation,
            )
            if info.HasField("stats")
            else None
        ),
        state=_COLLECTION_STATES.get(info.state, CollectionState.UNSPECIFIED),
        reason=info.reason,
        aliases=tuple(info.aliases),
    )


def _operation_from_proto(operation: lathe_pb2.Operation) -> Operation:
    return Operation(
        id=operation.id,
        collection=operation.collection,
        kind=_OPERATION_KINDS.get(operation.kind, OperationKind.UNSPECIFIED),
        state=_OPERATION_STATES.get(operation.state, OperationState.UNSPECIFIED),
        documents_total=operation.documents_total,
        documents_done=operation.documents_done,
        bytes_total=operation.bytes_total,
        bytes_done=operation.bytes_done,
        bytes_per_second=operation.bytes_per_second,
        eta_seconds=operation.eta_seconds if operation.HasField("eta_seconds") else None,
        error=operation.error,
        write_id=operation.write_id,
        consistency_token=operation.consistency_token,
        created_unix_ms=operation.created_unix_ms,
        started_unix_ms=operation.started_unix_ms,
        finished_unix_ms=operation.finished_unix_ms,
        sections=operation.sections,
        generation=operation.generation,
    )


_OPERATION_STATES = {
    lathe_pb2.OPERATION_STATE_UNSPECIFIED: OperationState.UNSPECIFIED,
    lathe_pb2.OPERATION_STATE_QUEUED: OperationState.QUEUED,
    lathe_pb2.OPERATION_STATE_RUNNING: OperationState.RUNNING,
    lathe_pb2.OPERATION_STATE_APPLIED: OperationState.APPLIED,
    lathe_pb2.OPERATION_STATE_FAILED: OperationState.FAILED,
}
_OPERATION_KINDS = {
    lathe_pb2.OPERATION_KIND_UNSPECIFIED: OperationKind.UNSPECIFIED,
    lathe_pb2.OPERATION_KIND_UPSERT: OperationKind.UPSERT,
    lathe_pb2.OPERATION_KIND_DELETE: OperationKind.DELETE,
}


def _new_write_id() -> str:
    return str(uuid.uuid4())


def _part_write_id(write_id: str, index: int, parts: int) -> str:
    """The write id of part `index` of a write sent in `parts` requests: the write's own when
    it is one request, else `f"{write_id}/{index}"` ("" stays "": no deduplication)."""
    if not write_id or parts == 1:
        part = write_id
    else:
        part = f"{write_id}/{index}"
    if len(part.encode("utf-8")) > MAX_WRITE_ID_BYTES:
        raise ValueError(
            f"write_id {part!r} is {len(part.encode('utf-8'))} bytes; the server takes at most "
            f"{MAX_WRITE_ID_BYTES} (a write sent in parts adds '/<part>' to it)"
        )
    return part


def _field_bytes(size: int) -> int:
    """Bytes of a length-delimited field of `size` bytes in a message: tag, length, body."""
    length = 1
    while size >= 1 << (7 * length):
        length += 1
    return 1 + length + size


def _chunk_from_proto(chunk: lathe_pb2.RetrievedChunk) -> Chunk:
    return Chunk(
        text=chunk.text,
        doc_id=chunk.doc_id,
        section_id=chunk.section_id,
        section_title=chunk.section_title,
        heading_path=tuple(chunk.heading_path),
        doc_title=chunk.doc_title,
        byte_span=Span(chunk.bytes.start, chunk.bytes.end),
        char_span=Span(chunk.chars.start, chunk.chars.end),
        token_count=chunk.token_count,
        score=chunk.score,
        score_parts=ScoreParts(
            bm25=chunk.score_parts.bm25,
            section=chunk.score_parts.section,
            dense=chunk.score_parts.dense,
        ),
        strategy=_strategy_from_proto(chunk.strategy),
        metadata=dict(chunk.metadata),
        context=chunk.context,
    )


def _retrieve_from_proto(response: lathe_pb2.RetrieveResponse) -> RetrieveResult:
    return RetrieveResult(
        chunks=[_chunk_from_proto(c) for c in response.chunks],
        tokens_used=response.tokens_used,
        token_budget=response.token_budget,
        generation=response.generation,
        cache_hit=response.cache_hit,
        sections_considered=response.sections_considered,
        chunks_considered=response.chunks_considered,
        timings=[StageTiming(t.stage, t.micros) for t in response.timings],
        log_position=response.log_position,
    )


def _snapshot_from_proto(reply: Any) -> Snapshot:
    return Snapshot(
        collection=reply.collection,
        name=reply.name,
        bytes=reply.bytes,
        generation=reply.generation,
        created_unix_ms=reply.created_unix_ms,
    )


def _restored_from_proto(reply: Any) -> Restored:
    return Restored(
        collection=reply.collection.name,
        source_collection=reply.source_collection,
        generation=reply.generation,
        files=reply.files,
        bytes=reply.bytes,
    )


def _restore_messages(collection: str, path: str) -> Iterable[Any]:
    """The first message names the collection; each carries the file's next 1 MiB."""
    with open(path, "rb") as snapshot:
        first = True
        while True:
            data = snapshot.read(1 << 20)
            if not data and not first:
                return
            yield lathe_pb2.RestoreSnapshotRequest(
                collection=collection if first else "", data=data
            )
            first = False


def _recover_log_request(recovery: Recovery, confirm_stream: str) -> lathe_pb2.RecoverLogRequest:
    return lathe_pb2.RecoverLogRequest(
        recovery=f"RECOVERY_{Recovery(recovery).name}", confirm_stream=confirm_stream
    )


def _recovered_from_proto(reply: lathe_pb2.RecoverLogResponse) -> Recovered:
    return Recovered(
        incarnation=reply.incarnation,
        collections=reply.collections,
        documents=reply.documents,
        aliases=reply.aliases,
        log_position=reply.log_position,
        skipped=list(reply.skipped),
    )
