"""A typed, synchronous client for the Lathe gRPC API."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lathe_client._proto.lathe.v1 import lathe_pb2, lathe_pb2_grpc
from lathe_client.batching import BatchSizer, UploadProgress, batch_end
from lathe_client.errors import LatheError
from lathe_client.types import (
    Chunk,
    Chunking,
    ChunkStrategy,
    ChunkUnit,
    CollectionDeleted,
    CollectionInfo,
    CollectionSettings,
    CollectionState,
    CollectionStats,
    Document,
    DocumentFormat,
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
# The name the server reports SERVING under once its indexes and models are loaded.
SERVICE_NAME = "lathe.v1.Lathe"

StrategyLike = Union[ChunkStrategy, str]
DocumentLike = Union[Document, Mapping[str, Any]]
PemLike = Union[bytes, str, "os.PathLike[str]"]
_Result = TypeVar("_Result")


class Lathe:
    """Client of one Lathe server.

    >>> lathe = Lathe("127.0.0.1:50051")
    >>> lathe.create_collection("docs")
    >>> lathe.upsert("docs", [Document(id="a", text="...")], wait=True)
    >>> lathe.retrieve("docs", "question", budget=512).chunks

    TLS: pass `root_certificates` (PEM bytes, or a path to a PEM file) to trust a private CA, or
    `tls=True` to use the system roots. API keys: `api_key` is sent on every call as
    `authorization: Bearer <key>` metadata. `timeout` is each call's deadline in seconds.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        tls: bool = False,
        root_certificates: PemLike | None = None,
        server_name: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self.timeout = timeout
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if server_name:
            # Lets a certificate issued for a DNS name be checked while dialling an IP address.
            options.append(("grpc.ssl_target_name_override", server_name))
        if tls or root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(root_certificates)
            )
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        self._stub = lathe_pb2_grpc.LatheStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Lathe":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def health(self, service: str = SERVICE_NAME) -> str:
        """The health status name of `service` ("SERVING", "NOT_SERVING", ...)."""
        response = self._call(
            "Health.Check",
            self._health.Check,
            health_pb2.HealthCheckRequest(service=service),
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_until_ready(self, timeout: float = 30.0, service: str = SERVICE_NAME) -> None:
        """Blocks until the server reports `service` SERVING; raises LatheError(UNAVAILABLE or
        DEADLINE_EXCEEDED) when it does not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last_error: LatheError | None = None
        while time.monotonic() < deadline:
            try:
                if self.health(service) == "SERVING":
                    return
            except LatheError as error:
                last_error = error
            time.sleep(0.05)
        if last_error is not None:
            raise last_error
        raise LatheError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{service} not SERVING after {timeout}s")

    # -- collections -------------------------------------------------------------------------

    def create_collection(
        self,
        name: str,
        *,
        budget_tokenizer: str = "",
        default_chunking: Chunking | None = None,
        section_tokens: int | None = None,
        exist_ok: bool = False,
    ) -> CollectionInfo:
        """Creates the collection. With exist_ok=True a collection of that name already there is
        returned as it is (its settings are not compared with these) instead of raising
        ALREADY_EXISTS."""
        settings = lathe_pb2.CollectionSettings(budget_tokenizer=budget_tokenizer)
        if default_chunking is not None:
            settings.default_chunking.CopyFrom(_chunking_to_proto(default_chunking))
        if section_tokens is not None:
            settings.section_tokens = section_tokens
        request = lathe_pb2.CreateCollectionRequest(name=name, settings=settings)
        try:
            reply = self._call("CreateCollection", self._stub.CreateCollection, request)
        except LatheError as error:
            if exist_ok and error.code == grpc.StatusCode.ALREADY_EXISTS:
                return self.get_collection(name)
            raise
        return _collection_from_proto(reply)

    def get_collection(self, name: str) -> CollectionInfo:
        request = lathe_pb2.GetCollectionRequest(name=name)
        return _collection_from_proto(self._call("GetCollection", self._stub.GetCollection, request))

    def list_collections(self) -> list[CollectionInfo]:
        response = self._call(
            "ListCollections", self._stub.ListCollections, lathe_pb2.ListCollectionsRequest()
        )
        return [_collection_from_proto(info) for info in response.collections]

    def delete_collection(self, name: str) -> CollectionDeleted:
        """Deletes the collection; says which, with the delete's consistency token (0 on a
        single node)."""
        request = lathe_pb2.DeleteCollectionRequest(name=name)
        reply = self._call("DeleteCollection", self._stub.DeleteCollection, request)
        return CollectionDeleted(name=name, consistency_token=reply.consistency_token)

    # -- documents ---------------------------------------------------------------------------

    def upsert(
        self, collection: str, documents: Iterable[DocumentLike], *, wait: bool = False
    ) -> WriteResult:
        """Replaces every section of each named document. With wait=True the call returns once
        the write is durable and visible to the next retrieve."""
        request = _upsert_request(collection, documents, wait)
        return _write_from_proto(self._call("UpsertDocuments", self._stub.UpsertDocuments, request))

    def upload(
        self,
        collection: str,
        batches: Iterable[Iterable[DocumentLike]],
        *,
        wait: bool = False,
    ) -> WriteResult:
        """Streams batches of documents in one call (for corpora larger than one message)."""
        requests = (_upsert_request(collection, batch, wait) for batch in batches)
        return _write_from_proto(self._call("UploadDocuments", self._stub.UploadDocuments, requests))

    def upload_documents(
        self,
        collection: str,
        documents: Iterable[DocumentLike],
        *,
        batch_seconds: float = 10.0,
        first_batch_bytes: int = 64 * 1024,
        max_batch_documents: int = 64,
        progress: Callable[[UploadProgress], None] | None = None,
    ) -> WriteResult:
        """Upserts a corpus of any size in `wait` batches that each finish well within this
        client's deadline: cut by bytes of text, sized from the throughput measured so far to
        take about `batch_seconds`. A batch that still runs past its deadline is applied whole or
        not at all, and is sent again a quarter the size. `progress` is called after each batch.
        After an interruption, call it again with the same documents: what is already stored is
        re-sent but costs no inference (the server reuses the vectors of unchanged sections).
        Returns the totals; `generation` is the last batch's."""
        protos = [_document_to_proto(d) for d in documents]
        sizes = [len(p.text.encode("utf-8")) for p in protos]
        sizer = BatchSizer(first_batch_bytes, batch_seconds)
        started = time.monotonic()
        stored = WriteResult(documents=0, sections=0, generation=0, consistency_token=0)
        stored_bytes, next_document = 0, 0
        while next_document < len(protos):
            end = batch_end(sizes, next_document, sizer.batch_bytes, max(1, max_batch_documents))
            sent_bytes = sum(sizes[next_document:end])
            request = lathe_pb2.UpsertDocumentsRequest(
                collection=collection, documents=protos[next_document:end], wait=True
            )
            batch_started = time.monotonic()
            try:
                written = _write_from_proto(
                    self._call("UpsertDocuments", self._stub.UpsertDocuments, request)
                )
            except LatheError as error:
                if error.code is not grpc.StatusCode.DEADLINE_EXCEEDED or end - next_document == 1:
                    raise
                sizer.timed_out(sent_bytes)
                continue
            sizer.observe(sent_bytes, time.monotonic() - batch_started)
            stored = WriteResult(
                documents=stored.documents + written.documents,
                sections=stored.sections + written.sections,
                generation=written.generation,
                consistency_token=max(stored.consistency_token, written.consistency_token),
            )
            stored_bytes += sent_bytes
            next_document = end
            if progress is not None:
                progress(
                    UploadProgress(
                        documents=next_document,
                        total_documents=len(protos),
                        bytes=stored_bytes,
                        total_bytes=sum(sizes),
                        seconds=time.monotonic() - started,
                    )
                )
        return stored

    def delete_documents(
        self, collection: str, ids: Iterable[str], *, wait: bool = False
    ) -> WriteResult:
        request = lathe_pb2.DeleteDocumentsRequest(collection=collection, ids=list(ids), wait=wait)
        return _write_from_proto(self._call("DeleteDocuments", self._stub.DeleteDocuments, request))

    # -- retrieval ---------------------------------------------------------------------------

    def retrieve(
        self,
        collection: str,
        query: str,
        *,
        budget: int,
        top_k: int | None = None,
        strategy: StrategyLike | None = None,
        max_tokens: int | None = None,
        overlap_tokens: int | None = None,
        chunking: Chunking | None = None,
        metadata: Mapping[str, str] | None = None,
        doc_ids: Sequence[str] = (),
        order: ResultOrder | str = ResultOrder.SCORE,
        min_score: float | None = None,
        max_chunks_per_document: int | None = None,
        diversity: float | None = None,
        consistency_token: int = 0,
    ) -> RetrieveResult:
        """Retrieves the top_k sections for `query`, re-chunks them and returns the best chunks
        whose token counts (in the collection's budget tokenizer) sum to at most `budget`.

        `strategy`, `max_tokens` and `overlap_tokens` are shorthands for `chunking`; `metadata`
        (every key = value must match) and `doc_ids` filter the documents. `min_score` drops
        chunks scoring below it, `max_chunks_per_document` caps the chunks of one document, and
        `diversity` (0..1, 0 = off) reorders chunks by maximal marginal relevance before packing;
        left unset, the server applies MMR only when the query is ambiguous (its best chunks
        spread evenly over many documents).
        With replication, `consistency_token` (a write's) makes the replica answer only once it
        has applied that write."""
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
        return _retrieve_from_proto(self._call("Retrieve", self._stub.Retrieve, request))

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, method: str, function: Callable[..., _Result], request: Any) -> _Result:
        try:
            return function(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise LatheError.from_rpc_error(error, method) from None


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


def _upsert_request(
    collection: str, documents: Iterable[DocumentLike], wait: bool
) -> lathe_pb2.UpsertDocumentsRequest:
    return lathe_pb2.UpsertDocumentsRequest(
        collection=collection,
        documents=[_document_to_proto(d) for d in documents],
        wait=wait,
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
    )


def _write_from_proto(response: lathe_pb2.WriteResponse) -> WriteResult:
    return WriteResult(
        documents=response.documents,
        sections=response.sections,
        generation=response.generation,
        consistency_token=response.consistency_token,
    )


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
