"""A typed, synchronous client for the Lathe gRPC API."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lathe_client._proto.lathe.v1 import lathe_pb2, lathe_pb2_grpc
from lathe_client._wire import (
    _recover_log_request,
    _recovered_from_proto,
    _restore_messages,
    _restored_from_proto,
    _snapshot_from_proto,
    _CLIENT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BATCH_DOCUMENTS,
    DEFAULT_MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    DocumentLike,
    PemLike,
    StrategyLike,
    _ClientBase,
    _collection_from_proto,
    _create_collection_request,
    _deadline,
    _new_write_id,
    _not_ready,
    _operation_from_proto,
    _retrieve_from_proto,
    _retrieve_request,
    _serving_status_name,
    _upload_requests,
    _UseClientTimeout,
    _visible_request,
    _wait_over,
    _wait_step,
    _warn_ignored_batch_sizing,
    _Write,
)

# Shared with AsyncLathe in _wire; still importable from here, where they used to live.
from lathe_client._wire import MAX_WRITE_ID_BYTES as MAX_WRITE_ID_BYTES
from lathe_client._wire import WAIT_STEP_SECONDS as WAIT_STEP_SECONDS
from lathe_client._wire import _chunking_from_proto as _chunking_from_proto
from lathe_client._wire import _chunking_to_proto as _chunking_to_proto
from lathe_client._wire import retry_service_config as retry_service_config
from lathe_client.errors import LatheError
from lathe_client.types import (
    Alias,
    Restored,
    Snapshot,
    Chunking,
    CollectionDeleted,
    CollectionInfo,
    Operation,
    Recovered,
    Recovery,
    ResultOrder,
    RetrieveResult,
    WriteResult,
)

_Result = TypeVar("_Result")


class Lathe(_ClientBase):
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
        super().__init__(
            target,
            tls=tls,
            root_certificates=root_certificates,
            server_name=server_name,
            api_key=api_key,
            timeout=timeout,
            max_message_bytes=max_message_bytes,
            max_batch_documents=max_batch_documents,
            max_attempts=max_attempts,
        )
        if self._credentials is not None:
            self._channel = grpc.secure_channel(target, self._credentials, options=self._options)
        else:
            self._channel = grpc.insecure_channel(target, options=self._options)
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
        return _serving_status_name(response)

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
        raise _not_ready(service, timeout, last_error)

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
        request = _create_collection_request(
            name, budget_tokenizer, default_chunking, section_tokens
        )
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

    # -- aliases -----------------------------------------------------------------------------

    def create_alias(self, alias: str, collection: str) -> Alias:
        """Makes `alias` a second name of the collection `collection`: every call taking a
        collection name accepts it. ALREADY_EXISTS when a collection or alias holds the name."""
        request = lathe_pb2.CreateAliasRequest(alias=alias, collection=collection)
        reply = self._call("CreateAlias", self._stub.CreateAlias, request)
        return Alias(alias=reply.alias, collection=reply.collection)

    def switch_alias(self, alias: str, collection: str) -> Alias:
        """Points the existing `alias` at `collection` at once: a retrieve sees the old collection
        or the new one, never an error in between. NOT_FOUND when there is no such alias."""
        request = lathe_pb2.SwitchAliasRequest(alias=alias, collection=collection)
        reply = self._call("SwitchAlias", self._stub.SwitchAlias, request)
        return Alias(alias=reply.alias, collection=reply.collection)

    def delete_alias(self, alias: str) -> None:
        request = lathe_pb2.DeleteAliasRequest(alias=alias)
        self._call("DeleteAlias", self._stub.DeleteAlias, request)

    def list_aliases(self) -> list[Alias]:
        """Every alias, by name."""
        response = self._call(
            "ListAliases", self._stub.ListAliases, lathe_pb2.ListAliasesRequest()
        )
        return [Alias(alias=a.alias, collection=a.collection) for a in response.aliases]

    def recover_log(
        self, recovery: Recovery, confirm_stream: str, *, timeout: float | None = None
    ) -> Recovered:
        """Replicas only, once their write log is lost: a new log re-seeded from this replica's
        data (`Recovery.RESEED`) or empty (`Recovery.START_OVER`); every replica then converges
        to it (README, "Replicas"). `confirm_stream` names the stream (`replication.stream`).
        FAILED_PRECONDITION on a single node or while the log is not lost."""
        request = _recover_log_request(recovery, confirm_stream)
        reply = self._call("RecoverLog", self._stub.RecoverLog, request, timeout)
        return _recovered_from_proto(reply)

    # -- snapshots ---------------------------------------------------------------------------

    def create_snapshot(self, collection: str, *, timeout: float | None = None) -> Snapshot:
        """Snapshots the collection's latest commit while it serves (a collection an alias names,
        for an alias). The file stays on the server; `download_snapshot` copies it. No deadline
        unless `timeout` is given: a large collection takes seconds."""
        request = lathe_pb2.CreateSnapshotRequest(collection=collection)
        reply = self._call("CreateSnapshot", self._stub.CreateSnapshot, request, timeout)
        return _snapshot_from_proto(reply)

    def list_snapshots(self, collection: str = "") -> list[Snapshot]:
        """Snapshots of `collection` (of every collection when empty), newest first."""
        request = lathe_pb2.ListSnapshotsRequest(collection=collection)
        response = self._call("ListSnapshots", self._stub.ListSnapshots, request)
        return [_snapshot_from_proto(s) for s in response.snapshots]

    def delete_snapshot(self, collection: str, name: str) -> None:
        request = lathe_pb2.DeleteSnapshotRequest(collection=collection, name=name)
        self._call("DeleteSnapshot", self._stub.DeleteSnapshot, request)

    def download_snapshot(
        self, collection: str, name: str, path: str, *, timeout: float | None = None
    ) -> int:
        """Writes the snapshot file to `path`; its bytes."""
        request = lathe_pb2.DownloadSnapshotRequest(collection=collection, name=name)
        written = 0
        try:
            chunks = self._stub.DownloadSnapshot(request, timeout=timeout, metadata=self._metadata)
            with open(path, "wb") as out:
                for chunk in chunks:
                    out.write(chunk.data)
                    written += len(chunk.data)
        except grpc.RpcError as error:
            raise LatheError.from_rpc_error(error, "DownloadSnapshot") from None
        return written

    def restore_snapshot(
        self, collection: str, path: str, *, timeout: float | None = None
    ) -> Restored:
        """Creates `collection` from the snapshot file at `path`, uploaded in 1 MiB messages.
        Every file is checked first: a damaged or truncated snapshot raises DATA_LOSS naming its
        file, and nothing is created."""
        reply = self._call(
            "RestoreSnapshot",
            self._stub.RestoreSnapshot,
            _restore_messages(collection, path),
            timeout,
        )
        return _restored_from_proto(reply)

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
        write_id = _new_write_id() if write_id is None else write_id
        requests = self._upsert_requests(collection, documents, write_id)
        responses = [
            self._call("UpsertDocuments", self._stub.UpsertDocuments, request)
            for request in requests
        ]
        return self._written(
            _Write("UpsertDocuments", collection, write_id, responses), wait, progress, timeout
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
        requests = _upload_requests(collection, batches, write_id)
        response = self._call("UploadDocuments", self._stub.UploadDocuments, requests)
        return self._written(
            _Write("UploadDocuments", collection, write_id, [response]), wait, progress, timeout
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
        _warn_ignored_batch_sizing(batch_seconds, first_batch_bytes, max_batch_documents)
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
            _Write("DeleteDocuments", collection, write_id, [response]), wait, progress, timeout
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
        return self._wait(operation_id, _deadline(timeout), progress)

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
        request = _retrieve_request(
            collection,
            query,
            budget=budget,
            top_k=top_k,
            strategy=strategy,
            max_tokens=max_tokens,
            overlap_tokens=overlap_tokens,
            chunking=chunking,
            metadata=metadata,
            doc_ids=doc_ids,
            order=order,
            min_score=min_score,
            max_chunks_per_document=max_chunks_per_document,
            diversity=diversity,
            consistency_token=consistency_token,
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

    def _written(
        self,
        write: _Write,
        wait: bool,
        progress: Callable[[Operation], None] | None,
        timeout: float | None,
    ) -> WriteResult:
        """The result of the requests of one write; with `wait`, once every operation they
        queued is applied."""
        if wait and write.replicated:
            generation = self._visible_at(write.collection, write.consistency_token, timeout)
            return write.answered(generation)
        if not wait or not write.operation_ids:
            return write.answered()
        deadline = _deadline(timeout)
        return write.applied(
            [
                write.check_ended(self._wait(operation_id, deadline, progress), timeout)
                for operation_id in write.operation_ids
            ]
        )

    def _visible_at(self, collection: str, token: int, timeout: float | None) -> int:
        """Waits until the write at log position `token` is visible here (replication); the
        generation that shows it."""
        request = _visible_request(collection, token)
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
            request, call_timeout = _wait_step(operation_id, deadline)
            answer = _operation_from_proto(
                self._call("WaitOperation", self._stub.WaitOperation, request, timeout=call_timeout)
            )
            if progress is not None:
                progress(answer)
            if _wait_over(answer, deadline):
                return answer

