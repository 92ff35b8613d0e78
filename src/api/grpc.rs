//! Thin gRPC handlers: admit (concurrency limit, API key, metrics) → convert → call the service →
//! convert back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Semaphore;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{Access, ApiKeys};
use super::call::{code_label, Call};
use super::convert;
use super::deadline::deadline;
use super::proto;
use super::proto::lathe_server::Lathe;
use super::reload::Reloadable;
use super::status::oversized_to_resource_exhausted;

use crate::error::LatheError;
use crate::service::{Engine, Recovery};
use crate::telemetry::Metrics;
use crate::types::WriteOptions;

pub struct GrpcAdapter {
    pub(super) service: Arc<Engine>,
    /// Requests in flight; beyond the limit, requests are shed rather than queued.
    in_flight: Arc<Semaphore>,
    max_concurrent: usize,
    keys: Option<Arc<Reloadable<ApiKeys>>>,
    metrics: Arc<Metrics>,
    /// Deadline of unary calls whose client sets none (or a longer one).
    request_timeout: Duration,
}

/// What a call that waits keeps of its deadline to write its answer.
const ANSWER_MARGIN: Duration = Duration::from_millis(20);

/// Runs a unary call under its deadline.
async fn within<T>(
    limit: Duration,
    rpc: &str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    use tracing::Instrument;
    // Exported spans are named for the RPC; the log lines keep the short span name.
    #[cfg(feature = "otel")]
    let span = tracing::info_span!(
        "rpc",
        rpc,
        deadline_ms = limit.as_millis() as u64,
        otel.name = format!("lathe.v1.Lathe/{rpc}"),
        otel.kind = "server",
    );
    #[cfg(not(feature = "otel"))]
    let span = tracing::info_span!("rpc", rpc, deadline_ms = limit.as_millis() as u64);
    match tokio::time::timeout(limit, call.instrument(span)).await {
        Ok(result) => result,
        Err(_) => Err(LatheError::DeadlineExceeded {
            call: rpc.to_string(),
            limit,
            set_by_client: false,
        }
        .into()),
    }
}

impl GrpcAdapter {
    pub fn new(
        service: Arc<Engine>,
        max_concurrent: usize,
        keys: Option<Arc<Reloadable<ApiKeys>>>,
        metrics: Arc<Metrics>,
        request_timeout: Duration,
    ) -> Self {
        Self {
            service,
            in_flight: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            keys,
            metrics,
            request_timeout,
        }
    }

    /// Checks the API key and the concurrency limit; the returned call records the outcome.
    pub(super) fn admit(
        &self,
        rpc: &'static str,
        access: Access,
        metadata: &MetadataMap,
    ) -> Result<Call, Status> {
        let rejected = |error: LatheError| {
            let status = Status::from(error);
            self.metrics
                .requests
                .with_label_values(&[rpc, code_label(status.code())])
                .inc();
            status
        };
        if let Some(keys) = &self.keys {
            keys.get().check(metadata, access, rpc).map_err(rejected)?;
        }
        let permit = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| {
                rejected(LatheError::Overloaded(format!(
                    "{} requests in flight (server.max_concurrent_requests); retry with backoff",
                    self.max_concurrent
                )))
            })?;
        Ok(Call::new(rpc, Arc::clone(&self.metrics), permit))
    }

    /// When a call that waits (a write with `wait`, WaitOperation) must stop waiting to answer
    /// before its deadline: the deadline layer's own answer time (see `deadline::answer_within`),
    /// less [`ANSWER_MARGIN`].
    fn wait_until(&self, metadata: &MetadataMap) -> Instant {
        let limit = deadline(metadata, self.request_timeout);
        Instant::now() + super::deadline::answer_within(limit).saturating_sub(ANSWER_MARGIN)
    }

    /// One unary call: admit it (API key, concurrency limit), run `handler` on its message under
    /// the call's deadline, map its error to a status in the one place that does, and record the
    /// outcome. `handler` only builds a future; the conversion and the work run under the
    /// deadline.
    pub(super) async fn unary<Message, Reply, Handler, Work>(
        &self,
        rpc: &'static str,
        access: Access,
        request: Request<Message>,
        handler: Handler,
    ) -> Result<Response<Reply>, Status>
    where
        Handler: FnOnce(Message) -> Work,
        Work: std::future::Future<Output = crate::error::Result<Reply>>,
    {
        let call = self.admit(rpc, access, request.metadata())?;
        let limit = deadline(request.metadata(), self.request_timeout);
        let work = handler(request.into_inner());
        let result = within(limit, rpc, async move {
            work.await.map(Response::new).map_err(Status::from)
        })
        .await;
        call.finish(result)
    }
}

#[tonic::async_trait]
impl Lathe for GrpcAdapter {
    async fn create_collection(
        &self,
        request: Request<proto::CreateCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        self.unary(
            "CreateCollection",
            Access::Write,
            request,
            |proto::CreateCollectionRequest { name, settings }| async move {
                let settings = convert::settings_from_proto(settings)?;
                Ok(self.service.create_collection(name, settings).await?.into())
            },
        )
        .await
    }

    async fn list_collections(
        &self,
        request: Request<proto::ListCollectionsRequest>,
    ) -> Result<Response<proto::ListCollectionsResponse>, Status> {
        self.unary(
            "ListCollections",
            Access::Read,
            request,
            |proto::ListCollectionsRequest {}| async move {
                let collections = self.service.list_collections().await?;
                Ok(proto::ListCollectionsResponse {
                    collections: collections.into_iter().map(Into::into).collect(),
                })
            },
        )
        .await
    }

    async fn get_collection(
        &self,
        request: Request<proto::GetCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        self.unary(
            "GetCollection",
            Access::Read,
            request,
            |proto::GetCollectionRequest { name }| async move {
                Ok(self.service.get_collection(&name).await?.into())
            },
        )
        .await
    }

    async fn delete_collection(
        &self,
        request: Request<proto::DeleteCollectionRequest>,
    ) -> Result<Response<proto::DeleteCollectionResponse>, Status> {
        self.unary(
            "DeleteCollection",
            Access::Write,
            request,
            |proto::DeleteCollectionRequest { name }| async move {
                let consistency_token = self.service.delete_collection(&name).await?;
                Ok(proto::DeleteCollectionResponse { consistency_token })
            },
        )
        .await
    }

    async fn upsert_documents(
        &self,
        request: Request<proto::UpsertDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let wait_until = self.wait_until(request.metadata());
        self.unary(
            "UpsertDocuments",
            Access::Write,
            request,
            |proto::UpsertDocumentsRequest {
                 collection,
                 documents,
                 wait,
                 write_id,
             }| async move {
                let documents = convert::documents_from_proto(documents)?;
                let options = WriteOptions {
                    wait,
                    write_id,
                    wait_until: Some(wait_until),
                };
                let outcome = self
                    .service
                    .upsert_documents(&collection, documents, options)
                    .await?;
                Ok(outcome.into())
            },
        )
        .await
    }

    async fn delete_documents(
        &self,
        request: Request<proto::DeleteDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let wait_until = self.wait_until(request.metadata());
        self.unary(
            "DeleteDocuments",
            Access::Write,
            request,
            |proto::DeleteDocumentsRequest {
                 collection,
                 ids,
                 wait,
                 write_id,
             }| async move {
                let options = WriteOptions {
                    wait,
                    write_id,
                    wait_until: Some(wait_until),
                };
                let outcome = self
                    .service
                    .delete_documents(&collection, ids, options)
                    .await?;
                Ok(outcome.into())
            },
        )
        .await
    }

    /// Each message of the stream is a write of its own (see `upload`).
    async fn upload_documents(
        &self,
        request: Request<Streaming<proto::UpsertDocumentsRequest>>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let (metadata, _, messages) = request.into_parts();
        let messages = messages.map(|message| message.map_err(oversized_to_resource_exhausted));
        self.upload(&metadata, messages).await
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        self.unary(
            "GetOperation",
            Access::Read,
            request,
            |proto::GetOperationRequest { id }| async move {
                Ok(self.service.get_operation(id).await?.into())
            },
        )
        .await
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        self.unary(
            "ListOperations",
            Access::Read,
            request,
            |proto::ListOperationsRequest { collection, limit }| async move {
                let operations = self.service.list_operations(&collection, limit).await?;
                Ok(proto::ListOperationsResponse {
                    operations: operations.into_iter().map(Into::into).collect(),
                })
            },
        )
        .await
    }

    /// Waits within the call's deadline (less the time to answer): at its end the operation is
    /// answered as it stands, not DEADLINE_EXCEEDED.
    async fn wait_operation(
        &self,
        request: Request<proto::WaitOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let wait_until = self.wait_until(request.metadata());
        self.unary(
            "WaitOperation",
            Access::Read,
            request,
            |proto::WaitOperationRequest { id, timeout_ms }| async move {
                let within_deadline = wait_until.saturating_duration_since(Instant::now());
                let timeout = timeout_ms
                    .map(|ms| Duration::from_millis(u64::from(ms)))
                    .map_or(within_deadline, |asked| asked.min(within_deadline));
                Ok(self.service.wait_operation(id, Some(timeout)).await?.into())
            },
        )
        .await
    }

    async fn create_alias(
        &self,
        request: Request<proto::CreateAliasRequest>,
    ) -> Result<Response<proto::Alias>, Status> {
        self.unary(
            "CreateAlias",
            Access::Write,
            request,
            |proto::CreateAliasRequest { alias, collection }| async move {
                Ok(self.service.create_alias(alias, collection).await?.into())
            },
        )
        .await
    }

    async fn switch_alias(
        &self,
        request: Request<proto::SwitchAliasRequest>,
    ) -> Result<Response<proto::Alias>, Status> {
        self.unary(
            "SwitchAlias",
            Access::Write,
            request,
            |proto::SwitchAliasRequest { alias, collection }| async move {
                Ok(self.service.switch_alias(alias, collection).await?.into())
            },
        )
        .await
    }

    async fn delete_alias(
        &self,
        request: Request<proto::DeleteAliasRequest>,
    ) -> Result<Response<proto::DeleteAliasResponse>, Status> {
        self.unary(
            "DeleteAlias",
            Access::Write,
            request,
            |proto::DeleteAliasRequest { alias }| async move {
                self.service.delete_alias(alias).await?;
                Ok(proto::DeleteAliasResponse {})
            },
        )
        .await
    }

    async fn list_aliases(
        &self,
        request: Request<proto::ListAliasesRequest>,
    ) -> Result<Response<proto::ListAliasesResponse>, Status> {
        self.unary(
            "ListAliases",
            Access::Read,
            request,
            |proto::ListAliasesRequest {}| async move {
                let aliases = self.service.list_aliases().await?;
                Ok(proto::ListAliasesResponse {
                    aliases: aliases.into_iter().map(Into::into).collect(),
                })
            },
        )
        .await
    }

    async fn recover_log(
        &self,
        request: Request<proto::RecoverLogRequest>,
    ) -> Result<Response<proto::RecoverLogResponse>, Status> {
        self.unary(
            "RecoverLog",
            Access::Write,
            request,
            |proto::RecoverLogRequest {
                 recovery,
                 confirm_stream,
             }| async move {
                let recovery = match proto::Recovery::try_from(recovery) {
                    Ok(proto::Recovery::Reseed) => Recovery::Reseed,
                    Ok(proto::Recovery::StartOver) => Recovery::StartOver,
                    _ => {
                        return Err(LatheError::invalid(
                            "recovery",
                            "must be RECOVERY_RESEED or RECOVERY_START_OVER",
                        ))
                    }
                };
                let recovered = self.service.recover_log(recovery, &confirm_stream).await?;
                Ok(proto::RecoverLogResponse {
                    incarnation: recovered.incarnation,
                    collections: recovered.collections,
                    documents: recovered.documents,
                    aliases: recovered.aliases,
                    log_position: recovered.position,
                    skipped: recovered.skipped,
                })
            },
        )
        .await
    }

    async fn retrieve(
        &self,
        request: Request<proto::RetrieveRequest>,
    ) -> Result<Response<proto::RetrieveResponse>, Status> {
        self.unary("Retrieve", Access::Read, request, |message| async move {
            let consistency_token = message.consistency_token;
            let query = convert::retrieve_query_from_proto(message)?;
            Ok(self
                .service
                .retrieve(query, consistency_token)
                .await?
                .into())
        })
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<proto::CreateSnapshotRequest>,
    ) -> Result<Response<proto::SnapshotInfo>, Status> {
        self.create_snapshot_call(request).await
    }

    async fn list_snapshots(
        &self,
        request: Request<proto::ListSnapshotsRequest>,
    ) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        self.list_snapshots_call(request).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<proto::DeleteSnapshotRequest>,
    ) -> Result<Response<proto::DeleteSnapshotResponse>, Status> {
        self.delete_snapshot_call(request).await
    }

    type DownloadSnapshotStream = super::snapshots::DownloadStream;

    async fn download_snapshot(
        &self,
        request: Request<proto::DownloadSnapshotRequest>,
    ) -> Result<Response<Self::DownloadSnapshotStream>, Status> {
        self.download_snapshot_call(request).await
    }

    async fn restore_snapshot(
        &self,
        request: Request<Streaming<proto::RestoreSnapshotRequest>>,
    ) -> Result<Response<proto::RestoreSnapshotResponse>, Status> {
        self.restore_snapshot_call(request).await
    }
}
