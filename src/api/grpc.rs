//! Thin gRPC handlers: admit (concurrency limit, API key, metrics) → convert → call the service →
//! convert back.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{Access, ApiKeys};
use super::convert;
use super::proto;
use super::proto::lathe_server::Lathe;
use super::status::oversized_to_resource_exhausted;
use crate::error::LatheError;
use crate::service::LatheApi;
use crate::telemetry::Metrics;

pub struct GrpcAdapter<S> {
    service: Arc<S>,
    /// Requests in flight; beyond the limit, requests are shed rather than queued.
    in_flight: Arc<Semaphore>,
    max_concurrent: usize,
    default_top_k: u32,
    keys: Option<Arc<ApiKeys>>,
    metrics: Arc<Metrics>,
}

/// One admitted call: holds its concurrency permit and records its outcome when it ends.
struct Call {
    rpc: &'static str,
    started: Instant,
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
    finished: bool,
}

impl Call {
    fn finish<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.record(code);
        self.finished = true;
        result
    }

    fn record(&self, code: tonic::Code) {
        self.metrics
            .requests
            .with_label_values(&[self.rpc, code_label(code)])
            .inc();
        self.metrics
            .request_seconds
            .with_label_values(&[self.rpc])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
        if !self.finished {
            // The client went away (or its deadline passed) while the call was being served.
            self.record(tonic::Code::Cancelled);
        }
    }
}

fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

impl<S: LatheApi> GrpcAdapter<S> {
    pub fn new(
        service: Arc<S>,
        max_concurrent: usize,
        default_top_k: u32,
        keys: Option<Arc<ApiKeys>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            service,
            in_flight: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            default_top_k,
            keys,
            metrics,
        }
    }

    /// Checks the API key and the concurrency limit; the returned call records the outcome.
    fn admit(
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
            keys.check(metadata, access, rpc).map_err(rejected)?;
        }
        let permit = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| {
                rejected(LatheError::Overloaded(format!(
                    "{} requests in flight (server.max_concurrent_requests); retry with backoff",
                    self.max_concurrent
                )))
            })?;
        self.metrics.in_flight.inc();
        Ok(Call {
            rpc,
            started: Instant::now(),
            metrics: Arc::clone(&self.metrics),
            _permit: permit,
            finished: false,
        })
    }
}

#[tonic::async_trait]
impl<S: LatheApi> Lathe for GrpcAdapter<S> {
    async fn create_collection(
        &self,
        request: Request<proto::CreateCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        let call = self.admit("CreateCollection", Access::Write, request.metadata())?;
        let result = async move {
            let proto::CreateCollectionRequest { name, settings } = request.into_inner();
            let settings = convert::settings_from_proto(settings)?;
            let info = self.service.create_collection(name, settings).await?;
            Ok(Response::new(info.into()))
        }
        .await;
        call.finish(result)
    }

    async fn list_collections(
        &self,
        _request: Request<proto::ListCollectionsRequest>,
    ) -> Result<Response<proto::ListCollectionsResponse>, Status> {
        let call = self.admit("ListCollections", Access::Read, _request.metadata())?;
        let result = async move {
            let collections = self.service.list_collections().await?;
            Ok(Response::new(proto::ListCollectionsResponse {
                collections: collections.into_iter().map(Into::into).collect(),
            }))
        }
        .await;
        call.finish(result)
    }

    async fn get_collection(
        &self,
        request: Request<proto::GetCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        let call = self.admit("GetCollection", Access::Read, request.metadata())?;
        let result = async move {
            let proto::GetCollectionRequest { name } = request.into_inner();
            Ok(Response::new(
                self.service.get_collection(&name).await?.into(),
            ))
        }
        .await;
        call.finish(result)
    }

    async fn delete_collection(
        &self,
        request: Request<proto::DeleteCollectionRequest>,
    ) -> Result<Response<proto::DeleteCollectionResponse>, Status> {
        let call = self.admit("DeleteCollection", Access::Write, request.metadata())?;
        let result = async move {
            let proto::DeleteCollectionRequest { name } = request.into_inner();
            self.service.delete_collection(&name).await?;
            Ok(Response::new(proto::DeleteCollectionResponse {}))
        }
        .await;
        call.finish(result)
    }

    async fn upsert_documents(
        &self,
        request: Request<proto::UpsertDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let call = self.admit("UpsertDocuments", Access::Write, request.metadata())?;
        let result = async move {
            let proto::UpsertDocumentsRequest {
                collection,
                documents,
                wait,
            } = request.into_inner();
            let documents = convert::documents_from_proto(documents)?;
            let outcome = self
                .service
                .upsert_documents(&collection, documents, wait)
                .await?;
            Ok(Response::new(outcome.into()))
        }
        .await;
        call.finish(result)
    }

    async fn delete_documents(
        &self,
        request: Request<proto::DeleteDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let call = self.admit("DeleteDocuments", Access::Write, request.metadata())?;
        let result = async move {
            let proto::DeleteDocumentsRequest {
                collection,
                ids,
                wait,
            } = request.into_inner();
            let outcome = self
                .service
                .delete_documents(&collection, ids, wait)
                .await?;
            Ok(Response::new(outcome.into()))
        }
        .await;
        call.finish(result)
    }

    async fn upload_documents(
        &self,
        request: Request<Streaming<proto::UpsertDocumentsRequest>>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let call = self.admit("UploadDocuments", Access::Write, request.metadata())?;
        let result = async move {
            let mut stream = request.into_inner();
            let mut collection_name: Option<String> = None;
            let mut wait = false;
            let mut total = proto::WriteResponse::default();
            while let Some(message) = stream
                .message()
                .await
                .map_err(oversized_to_resource_exhausted)?
            {
                let proto::UpsertDocumentsRequest {
                    collection,
                    documents,
                    wait: wait_here,
                } = message;
                match &collection_name {
                    None => collection_name = Some(collection.clone()),
                    Some(first) if *first != collection => {
                        return Err(LatheError::invalid(
                            "collection",
                            format!("every message of one upload must name the same collection: `{first}` then `{collection}`"),
                        )
                        .into())
                    }
                    Some(_) => {}
                }
                wait |= wait_here;
                let documents = convert::documents_from_proto(documents)?;
                let outcome = self
                    .service
                    .upsert_documents(&collection, documents, false)
                    .await?;
                total.documents += outcome.documents;
                total.sections += outcome.sections;
            }
            if let (Some(collection), true) = (collection_name, wait) {
                total.generation = self.service.sync(&collection).await?;
            }
            Ok(Response::new(total))
        }
        .await;
        call.finish(result)
    }

    async fn retrieve(
        &self,
        request: Request<proto::RetrieveRequest>,
    ) -> Result<Response<proto::RetrieveResponse>, Status> {
        let call = self.admit("Retrieve", Access::Read, request.metadata())?;
        let result = async move {
            let query =
                convert::retrieve_query_from_proto(request.into_inner(), self.default_top_k)?;
            let result = self.service.retrieve(query).await?;
            Ok(Response::new(result.into()))
        }
        .await;
        call.finish(result)
    }
}
