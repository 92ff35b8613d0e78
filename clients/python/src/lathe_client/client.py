"""A typed, synchronous client for the Lathe gRPC API."""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lathe_client._proto.lathe.v1 import lathe_pb2, lathe_pb2_grpc
from lathe_client.batching import batch_end
from lathe_client.errors import LatheError, OperationFailed, WriteQueued
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
    Operation,
    OperationKind,
    OperationState,
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
    carries a write_id. CreateCollection and DeleteCollection are not retried: a retry of one
    that was applied would answer ALREADY_EXISTS or NOT_FOUND. max_attempts 1: no retries."""
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
        ]
    }
    return json.dumps({"methodConfig": [retried, not_retried]})


class _UseClientTimeout:
    """`_call`'s default deadline: the client's `timeout`."""


_CLIENT_TIMEOUT = _UseClientTimeout()

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
    `authorization: Bearer <key>` metadata. `timeout` is each call's deadline in seconds (a
    write's wait for its operation is bounded by the method's own `timeout` instead).
    `max_message_bytes` is the largest message sent or received (the server's default limit:
    an upsert above it is sent in parts), `max_batch_documents` the most documents sent in one
    upsert request (the server's default limit). `max_attempts`: calls answered UNAVAILABLE or
    RESOURCE_EXHAUSTED are retried by gRPC's retry policy up to this many attempts in all
    (see `retry_service_config`; 1 turns retries off).
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
        max_batch_documents: int = DEFAULT_MAX_BATCH_DOCUMENTS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if max_batch_documents < 1:
            raise ValueError("max_batch_documents must be at least 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.target = target
        self.timeout = timeout
        self._max_message_bytes = max_message_bytes
        self._max_batch_documents = max_batch_documents
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
        self,
        collection: str,
        documents: Iterable[DocumentLike],
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Replaces every section of each named document.

        The server checks the write, stores it in the collection's durable write queue and
        answers at once: without `wait` the result's `operation` is QUEUED, RUNNING or already
        APPLIED (follow it with `wait_operation` or `get_operation`). With `wait=True` the call
        returns once the write is visible to the next retrieve, waiting through WaitOperation and
        calling `progress(operation)` after each answer; `timeout` bounds that wait in seconds
        (None: as long as it takes), past it `WriteQueued` names the operation (the write stays
        queued and will be applied). An operation that fails raises `OperationFailed`.

        `write_id` is the write's idempotency key (at most 128 bytes; default: a new uuid4 per
        call, "" for none): sent again within the server's dedupe window (24 h by default) it
        answers the first write's operation and applies nothing, which is what makes retries
        safe. Reuse it only for the same documents.

        A write larger than one message (`max_message_bytes`) or than the server's
        `max_batch_documents` is sent as several requests, each an operation of its own with
        the write id `f"{write_id}/{i}"`; each is applied whole, in order, but not all at once.
        The result sums them; `operation` is the last one and `consistency_token` its token.

        With replication writes have no operations (`operation` is None): `wait=True` then
        waits, within `timeout`, until this replica has applied the write (a retrieve carrying
        its consistency token), and `progress` is not called."""
        protos = [_document_to_proto(d) for d in documents]
        write_id = _new_write_id() if write_id is None else write_id
        requests = self._split_upsert(collection, protos, write_id)
        responses = [
            self._call("UpsertDocuments", self._stub.UpsertDocuments, request)
            for request in requests
        ]
        return self._written(
            "UpsertDocuments", collection, write_id, responses, wait, progress, timeout
        )

    def upload(
        self,
        collection: str,
        batches: Iterable[Iterable[DocumentLike]],
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Streams batches of documents in one call; each batch (which must fit in one message)
        becomes an operation of its own, with the write id `f"{write_id}/{i}"` (`write_id`:
        default a new uuid4, "" for none). `wait`, `progress` and `timeout` as for `upsert`.
        `upsert` splits a large write by itself; this streams batches the caller cuts (a
        generator is read as it is sent)."""
        write_id = _new_write_id() if write_id is None else write_id
        requests = (
            lathe_pb2.UpsertDocumentsRequest(
                collection=collection,
                documents=[_document_to_proto(d) for d in batch],
                write_id=_part_write_id(write_id, i, 2),
            )
            for i, batch in enumerate(batches)
        )
        response = self._call("UploadDocuments", self._stub.UploadDocuments, requests)
        return self._written(
            "UploadDocuments", collection, write_id, [response], wait, progress, timeout
        )

    def upload_documents(
        self,
        collection: str,
        documents: Iterable[DocumentLike],
        *,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
        batch_seconds: float | None = None,
        first_batch_bytes: int | None = None,
        max_batch_documents: int | None = None,
    ) -> WriteResult:
        """Deprecated alias of `upsert(collection, documents, wait=True, ...)`, kept for callers
        of the former client-side batching: the server now queues a write of any size and
        applies it in parts itself, and `upsert` splits what does not fit in one message.
        `progress` receives an `Operation` (it used to receive an UploadProgress); the sizing
        arguments `batch_seconds`, `first_batch_bytes` and `max_batch_documents` are ignored."""
        if batch_seconds is not None or first_batch_bytes is not None or max_batch_documents is not None:
            warnings.warn(
                "upload_documents' batch sizing is ignored: the server queues writes of any size; "
                "use upsert(..., wait=True)",
                DeprecationWarning,
                stacklevel=2,
            )
        return self.upsert(
            collection, documents, wait=True, write_id=write_id, progress=progress, timeout=timeout
        )

    def delete_documents(
        self,
        collection: str,
        ids: Iterable[str],
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Deletes the documents: queued as an operation like an upsert; `wait`, `write_id`,
        `progress` and `timeout` as for `upsert` (the ids go in one request)."""
        write_id = _new_write_id() if write_id is None else write_id
        request = lathe_pb2.DeleteDocumentsRequest(
            collection=collection, ids=list(ids), write_id=write_id
        )
        response = self._call("DeleteDocuments", self._stub.DeleteDocuments, request)
        return self._written(
            "DeleteDocuments", collection, write_id, [response], wait, progress, timeout
        )

    # -- operations --------------------------------------------------------------------------

    def get_operation(self, operation_id: int) -> Operation:
        """The operation as it stands (NOT_FOUND once ended longer ago than the server keeps
        records, 24 h by default)."""
        request = lathe_pb2.GetOperationRequest(id=operation_id)
        return _operation_from_proto(self._call("GetOperation", self._stub.GetOperation, request))

    def list_operations(self, collection: str, limit: int = 100) -> list[Operation]:
        """The collection's operations, newest first (at most `limit`, 1..=1000)."""
        request = lathe_pb2.ListOperationsRequest(collection=collection, limit=limit)
        response = self._call("ListOperations", self._stub.ListOperations, request)
        return [_operation_from_proto(o) for o in response.operations]

    def wait_operation(
        self,
        operation_id: int,
        timeout: float | None = None,
        progress: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """Waits until the operation ends (APPLIED or FAILED) or `timeout` seconds pass (None:
        until it ends), calling `progress(operation)` after each WaitOperation answer, and
        returns it as it stands then: check its `state` (this raises for neither a failed nor a
        still running operation)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait(operation_id, deadline, progress)

    # -- retrieval ---------------------------------------------------------------------------

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
        `consistency_token` (a write's `WriteResult.consistency_token`, on a single node its
        operation's id) makes the server answer only once that write is visible (read your
        writes without waiting on the write); with replication, once the replica has applied
        it."""
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

    def _call(
        self,
        method: str,
        function: Callable[..., _Result],
        request: Any,
        timeout: float | None | _UseClientTimeout = _CLIENT_TIMEOUT,
    ) -> _Result:
        deadline = self.timeout if isinstance(timeout, _UseClientTimeout) else timeout
        try:
            return function(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as error:
            raise LatheError.from_rpc_error(error, method) from None

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

    def _written(
        self,
        method: str,
        collection: str,
        write_id: str,
        responses: list[lathe_pb2.WriteResponse],
        wait: bool,
        progress: Callable[[Operation], None] | None,
        timeout: float | None,
    ) -> WriteResult:
        """The result of the requests of one write; with `wait`, once every operation they
        queued is applied."""
        operation_ids = tuple(i for r in responses for i in r.operation_ids)
        operation = next(
            (
                _operation_from_proto(r.operation)
                for r in reversed(responses)
                if r.HasField("operation")
            ),
            None,
        )
        documents = sum(r.documents for r in responses)
        token = max((r.consistency_token for r in responses), default=0)
        generation = max((r.generation for r in responses), default=0)
        if wait and not operation_ids and token:
            # With replication there are no operations: the write is in the log at `token`. A
            # retrieve that carries it answers once this replica has applied it.
            generation = self._visible_at(collection, token, timeout)
        if not wait or not operation_ids:
            return WriteResult(
                documents=documents,
                sections=sum(r.sections for r in responses),
                generation=generation,
                consistency_token=token,
                operation=operation,
                operation_ids=operation_ids,
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        applied: list[Operation] = []
        for operation_id in operation_ids:
            ended = self._wait(operation_id, deadline, progress)
            if ended.state is OperationState.FAILED:
                raise OperationFailed(ended, method)
            if ended.state is not OperationState.APPLIED:
                raise WriteQueued(
                    f"operation {ended.id} of collection `{collection}` is still "
                    f"{ended.state.name} after waiting {timeout} s; it stays queued and will be "
                    "applied (wait_operation follows it)",
                    method,
                    operation_id=ended.id,
                    collection=collection,
                    write_id=ended.write_id or write_id,
                    operation=ended,
                    operation_ids=operation_ids,
                )
            applied.append(ended)
        return WriteResult(
            documents=documents,
            sections=sum(o.sections for o in applied),
            generation=max(o.generation for o in applied),
            consistency_token=token,
            operation=applied[-1],
            operation_ids=operation_ids,
        )

    def _visible_at(self, collection: str, token: int, timeout: float | None) -> int:
        """Waits until the write at log position `token` is visible here (replication); the
        generation that shows it."""
        request = lathe_pb2.RetrieveRequest(
            collection=collection,
            query="*",
            top_k=1,
            token_budget=1,
            consistency_token=token,
        )
        return self._call("Retrieve", self._stub.Retrieve, request, timeout=timeout).generation

    def _wait(
        self,
        operation_id: int,
        deadline: float | None,
        progress: Callable[[Operation], None] | None,
    ) -> Operation:
        """WaitOperation in steps of at most WAIT_STEP_SECONDS until the operation ends or
        `deadline` (time.monotonic()) passes; at least one step."""
        while True:
            step = WAIT_STEP_SECONDS
            if deadline is not None:
                step = max(0.0, min(step, deadline - time.monotonic()))
            request = lathe_pb2.WaitOperationRequest(id=operation_id, timeout_ms=int(step * 1000))
            answer = _operation_from_proto(
                self._call(
                    "WaitOperation",
                    self._stub.WaitOperation,
                    request,
                    timeout=step + _WAIT_CALL_SLACK_SECONDS,
                )
            )
            if progress is not None:
                progress(answer)
            if answer.ended or (deadline is not None and time.monotonic() >= deadline):
                return answer


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
