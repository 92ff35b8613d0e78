"""A typed asyncio client for the Lathe gRPC API, on `grpc.aio`.

    from lathe_client import AsyncLathe

    async with AsyncLathe("127.0.0.1:50051") as lathe:
        await lathe.upsert("docs", [Document(id="a.md", text="# Title\\n\\nBody")], wait=True)
        result = await lathe.retrieve("docs", "body", budget=256)

`AsyncLathe` has the methods of `Lathe`, each a coroutine, with the same arguments, results and
errors; both build their requests and read the answers with the same code (`_wire`), and both
channels carry the same retry policy (`retry_service_config`). Create it inside the event loop
that uses it (a `grpc.aio` channel belongs to one loop).
"""

from __future__ import annotations

import asyncio
import time
from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
    TypeVar,
    Union,
)

import grpc
import grpc.aio
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
    _upload_request,
    _upload_requests,
    _UseClientTimeout,
    _visible_request,
    _wait_over,
    _wait_step,
    _warn_ignored_batch_sizing,
    _Write,
)
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
# The batches of `upload`: read as they are sent, from a plain or an async iterable.
BatchesLike = Union[Iterable[Iterable[DocumentLike]], AsyncIterable[Iterable[DocumentLike]]]


class AsyncLathe(_ClientBase):
    """Asyncio client of one Lathe server: `Lathe`'s methods as coroutines.

    >>> async with AsyncLathe("127.0.0.1:50051") as lathe:
    ...     await lathe.create_collection("docs", exist_ok=True)
    ...     await lathe.upsert("docs", [Document(id="a", text="...")], wait=True)
    ...     (await lathe.retrieve("docs", "question", budget=512)).chunks

    The arguments are `Lathe`'s (TLS, API key, per-call `timeout`, message and batch limits,
    `max_attempts` of the retry policy). `progress` callbacks of the writes are plain functions,
    called in the event loop after each WaitOperation answer.
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
            self._channel = grpc.aio.secure_channel(
                target, self._credentials, options=self._options
            )
        else:
            self._channel = grpc.aio.insecure_channel(target, options=self._options)
        self._stub = lathe_pb2_grpc.LatheStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncLathe":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def health(self, service: str = SERVICE_NAME) -> str:
        """The health status name of `service` ("SERVING", "NOT_SERVING", ...)."""
        response = await self._call(
            "Health.Check",
            self._health.Check,
            health_pb2.HealthCheckRequest(service=service),
        )
        return _serving_status_name(response)

    async def wait_until_ready(self, timeout: float = 30.0, service: str = SERVICE_NAME) -> None:
        """Returns once the server reports `service` SERVING; raises LatheError(UNAVAILABLE or
        DEADLINE_EXCEEDED) when it does not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last_error: LatheError | None = None
        while time.monotonic() < deadline:
            try:
                if await self.health(service) == "SERVING":
                    return
            except LatheError as error:
                last_error = error
            await asyncio.sleep(0.05)
        raise _not_ready(service, timeout, last_error)

    # -- collections -------------------------------------------------------------------------

    async def create_collection(
        self,
        name: str,
        *,
        budget_tokenizer: str = "",
        default_chunking: Chunking | None = None,
        section_tokens: int | None = None,
        exist_ok: bool = False,
    ) -> CollectionInfo:
        """As `Lathe.create_collection`: exist_ok=True returns a collection of that name already
        there instead of raising ALREADY_EXISTS."""
        request = _create_collection_request(
            name, budget_tokenizer, default_chunking, section_tokens
        )
        try:
            reply = await self._call("CreateCollection", self._stub.CreateCollection, request)
        except LatheError as error:
            if exist_ok and error.code == grpc.StatusCode.ALREADY_EXISTS:
                return await self.get_collection(name)
            raise
        return _collection_from_proto(reply)

    async def get_collection(self, name: str) -> CollectionInfo:
        request = lathe_pb2.GetCollectionRequest(name=name)
        return _collection_from_proto(
            await self._call("GetCollection", self._stub.GetCollection, request)
        )

    async def list_collections(self) -> list[CollectionInfo]:
        response = await self._call(
            "ListCollections", self._stub.ListCollections, lathe_pb2.ListCollectionsRequest()
        )
        return [_collection_from_proto(info) for info in response.collections]

    async def delete_collection(self, name: str) -> CollectionDeleted:
        """As `Lathe.delete_collection`."""
        request = lathe_pb2.DeleteCollectionRequest(name=name)
        reply = await self._call("DeleteCollection", self._stub.DeleteCollection, request)
        return CollectionDeleted(name=name, consistency_token=reply.consistency_token)

    # -- aliases -----------------------------------------------------------------------------

    async def create_alias(self, alias: str, collection: str) -> Alias:
        """As `Lathe.create_alias`."""
        request = lathe_pb2.CreateAliasRequest(alias=alias, collection=collection)
        reply = await self._call("CreateAlias", self._stub.CreateAlias, request)
        return Alias(alias=reply.alias, collection=reply.collection)

    async def switch_alias(self, alias: str, collection: str) -> Alias:
        """As `Lathe.switch_alias`."""
        request = lathe_pb2.SwitchAliasRequest(alias=alias, collection=collection)
        reply = await self._call("SwitchAlias", self._stub.SwitchAlias, request)
        return Alias(alias=reply.alias, collection=reply.collection)

    async def delete_alias(self, alias: str) -> None:
        request = lathe_pb2.DeleteAliasRequest(alias=alias)
        await self._call("DeleteAlias", self._stub.DeleteAlias, request)

    async def list_aliases(self) -> list[Alias]:
        """As `Lathe.list_aliases`."""
        response = await self._call(
            "ListAliases", self._stub.ListAliases, lathe_pb2.ListAliasesRequest()
        )
        return [Alias(alias=a.alias, collection=a.collection) for a in response.aliases]

    async def recover_log(
        self, recovery: Recovery, confirm_stream: str, *, timeout: float | None = None
    ) -> Recovered:
        """As `Lathe.recover_log`."""
        request = _recover_log_request(recovery, confirm_stream)
        reply = await self._call("RecoverLog", self._stub.RecoverLog, request, timeout)
        return _recovered_from_proto(reply)

    # -- snapshots ---------------------------------------------------------------------------

    async def create_snapshot(self, collection: str, *, timeout: float | None = None) -> Snapshot:
        """As `Lathe.create_snapshot`."""
        request = lathe_pb2.CreateSnapshotRequest(collection=collection)
        reply = await self._call("CreateSnapshot", self._stub.CreateSnapshot, request, timeout)
        return _snapshot_from_proto(reply)

    async def list_snapshots(self, collection: str = "") -> list[Snapshot]:
        """As `Lathe.list_snapshots`."""
        request = lathe_pb2.ListSnapshotsRequest(collection=collection)
        response = await self._call("ListSnapshots", self._stub.ListSnapshots, request)
        return [_snapshot_from_proto(s) for s in response.snapshots]

    async def delete_snapshot(self, collection: str, name: str) -> None:
        """As `Lathe.delete_snapshot`."""
        request = lathe_pb2.DeleteSnapshotRequest(collection=collection, name=name)
        await self._call("DeleteSnapshot", self._stub.DeleteSnapshot, request)

    async def download_snapshot(
        self, collection: str, name: str, path: str, *, timeout: float | None = None
    ) -> int:
        """As `Lathe.download_snapshot`."""
        request = lathe_pb2.DownloadSnapshotRequest(collection=collection, name=name)
        written = 0
        try:
            call = self._stub.DownloadSnapshot(request, timeout=timeout, metadata=self._metadata)
            with open(path, "wb") as out:
                async for chunk in call:
                    out.write(chunk.data)
                    written += len(chunk.data)
        except grpc.RpcError as error:
            raise LatheError.from_rpc_error(error, "DownloadSnapshot") from None
        return written

    async def restore_snapshot(
        self, collection: str, path: str, *, timeout: float | None = None
    ) -> Restored:
        """As `Lathe.restore_snapshot`."""
        reply = await self._call(
            "RestoreSnapshot",
            self._stub.RestoreSnapshot,
            _restore_messages(collection, path),
            timeout,
        )
        return _restored_from_proto(reply)

    # -- documents ---------------------------------------------------------------------------

    async def upsert(
        self,
        collection: str,
        documents: Iterable[DocumentLike],
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """As `Lathe.upsert`: queues the write (split into requests that fit in a message), and
        with `wait=True` returns once it is visible (`WriteQueued` past `timeout`,
        `OperationFailed` when it fails)."""
        write_id = _new_write_id() if write_id is None else write_id
        responses = [
            await self._call("UpsertDocuments", self._stub.UpsertDocuments, request)
            for request in self._upsert_requests(collection, documents, write_id)
        ]
        return await self._written(
            _Write("UpsertDocuments", collection, write_id, responses), wait, progress, timeout
        )

    async def upload(
        self,
        collection: str,
        batches: BatchesLike,
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """As `Lathe.upload`: streams the batches in one call, each an operation with the write
        id `f"{write_id}/{i}"`; `batches` may also be an async iterable (read as it is sent)."""
        write_id = _new_write_id() if write_id is None else write_id
        requests: Any
        if isinstance(batches, AsyncIterable):
            requests = _async_upload_requests(collection, batches, write_id)
        else:
            requests = _upload_requests(collection, batches, write_id)
        response = await self._call("UploadDocuments", self._stub.UploadDocuments, requests)
        return await self._written(
            _Write("UploadDocuments", collection, write_id, [response]), wait, progress, timeout
        )

    async def upload_documents(
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
        """Deprecated alias of `upsert(collection, documents, wait=True, ...)` (see
        `Lathe.upload_documents`); the batch sizing arguments are ignored."""
        _warn_ignored_batch_sizing(batch_seconds, first_batch_bytes, max_batch_documents)
        return await self.upsert(
            collection, documents, wait=True, write_id=write_id, progress=progress, timeout=timeout
        )

    async def delete_documents(
        self,
        collection: str,
        ids: Iterable[str],
        *,
        wait: bool = False,
        write_id: str | None = None,
        progress: Callable[[Operation], None] | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """As `Lathe.delete_documents`: queued as an operation like an upsert."""
        write_id = _new_write_id() if write_id is None else write_id
        request = lathe_pb2.DeleteDocumentsRequest(
            collection=collection, ids=list(ids), write_id=write_id
        )
        response = await self._call("DeleteDocuments", self._stub.DeleteDocuments, request)
        return await self._written(
            _Write("DeleteDocuments", collection, write_id, [response]), wait, progress, timeout
        )

    # -- operations --------------------------------------------------------------------------

    async def get_operation(self, operation_id: int) -> Operation:
        """The operation as it stands (see `Lathe.get_operation`)."""
        request = lathe_pb2.GetOperationRequest(id=operation_id)
        return _operation_from_proto(
            await self._call("GetOperation", self._stub.GetOperation, request)
        )

    async def list_operations(self, collection: str, limit: int = 100) -> list[Operation]:
        """The collection's operations, newest first (at most `limit`, 1..=1000)."""
        request = lathe_pb2.ListOperationsRequest(collection=collection, limit=limit)
        response = await self._call("ListOperations", self._stub.ListOperations, request)
        return [_operation_from_proto(o) for o in response.operations]

    async def wait_operation(
        self,
        operation_id: int,
        timeout: float | None = None,
        progress: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """As `Lathe.wait_operation`: the operation once it ends or `timeout` seconds pass."""
        return await self._wait(operation_id, _deadline(timeout), progress)

    # -- retrieval ---------------------------------------------------------------------------

    async def retrieve(
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
        """As `Lathe.retrieve`: the best chunks for `query` within `budget` tokens."""
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
        return _retrieve_from_proto(await self._call("Retrieve", self._stub.Retrieve, request))

    # -- plumbing ----------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        function: Callable[..., Awaitable[_Result]],
        request: Any,
        timeout: float | None | _UseClientTimeout = _CLIENT_TIMEOUT,
    ) -> _Result:
        deadline = self.timeout if isinstance(timeout, _UseClientTimeout) else timeout
        try:
            return await function(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as error:  # grpc.aio.AioRpcError
            raise LatheError.from_rpc_error(error, method) from None

    async def _written(
        self,
        write: _Write,
        wait: bool,
        progress: Callable[[Operation], None] | None,
        timeout: float | None,
    ) -> WriteResult:
        """The result of the requests of one write; with `wait`, once every operation they
        queued is applied."""
        if wait and write.replicated:
            request = _visible_request(write.collection, write.consistency_token)
            visible = await self._call("Retrieve", self._stub.Retrieve, request, timeout=timeout)
            return write.answered(visible.generation)
        if not wait or not write.operation_ids:
            return write.answered()
        deadline = _deadline(timeout)
        applied = []
        for operation_id in write.operation_ids:
            ended = await self._wait(operation_id, deadline, progress)
            applied.append(write.check_ended(ended, timeout))
        return write.applied(applied)

    async def _wait(
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
                await self._call(
                    "WaitOperation", self._stub.WaitOperation, request, timeout=call_timeout
                )
            )
            if progress is not None:
                progress(answer)
            if _wait_over(answer, deadline):
                return answer


async def _async_upload_requests(
    collection: str, batches: AsyncIterable[Iterable[DocumentLike]], write_id: str
) -> AsyncIterator[lathe_pb2.UpsertDocumentsRequest]:
    """The messages of an upload from an async iterable of batches, made as they are sent."""
    index = 0
    async for batch in batches:
        yield _upload_request(collection, batch, write_id, index)
        index += 1
