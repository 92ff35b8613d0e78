//! Thin gRPC handlers: admit → convert → call the service → convert back.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::proto;
use super::proto::lathe_server::Lathe;
use super::status::oversized_to_resource_exhausted;
use crate::error::LatheError;
use crate::service::LatheApi;

pub struct GrpcAdapter<S> {
    service: Arc<S>,
    /// Requests in flight; beyond the limit, requests are shed rather than queued.
    in_flight: Arc<Semaphore>,
    max_concurrent: usize,
    default_top_k: u32,
}

impl<S: LatheApi> GrpcAdapter<S> {
    pub fn new(service: Arc<S>, max_concurrent: usize, default_top_k: u32) -> Self {
        Self {
            service,
            in_flight: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            default_top_k,
        }
    }

    fn admit(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| {
                Status::from(LatheError::Overloaded(format!(
                    "{} requests in flight (server.max_concurrent_requests); retry with backoff",
                    self.max_concurrent
                )))
            })
    }
}

#[tonic::async_trait]
impl<S: LatheApi> Lathe for GrpcAdapter<S> {
    async fn create_collection(
        &self,
        request: Request<proto::CreateCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        let _permit = self.admit()?;
        let proto::CreateCollectionRequest { name, settings } = request.into_inner();
        let settings = convert::settings_from_proto(settings)?;
        let info = self.service.create_collection(name, settings).await?;
        Ok(Response::new(info.into()))
    }

    async fn list_collections(
        &self,
        _request: Request<proto::ListCollectionsRequest>,
    ) -> Result<Response<proto::ListCollectionsResponse>, Status> {
        let _permit = self.admit()?;
        let collections = self.service.list_collections().await?;
        Ok(Response::new(proto::ListCollectionsResponse {
            collections: collections.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_collection(
        &self,
        request: Request<proto::GetCollectionRequest>,
    ) -> Result<Response<proto::CollectionInfo>, Status> {
        let _permit = self.admit()?;
        let proto::GetCollectionRequest { name } = request.into_inner();
        Ok(Response::new(
            self.service.get_collection(&name).await?.into(),
        ))
    }

    async fn delete_collection(
        &self,
        request: Request<proto::DeleteCollectionRequest>,
    ) -> Result<Response<proto::DeleteCollectionResponse>, Status> {
        let _permit = self.admit()?;
        let proto::DeleteCollectionRequest { name } = request.into_inner();
        self.service.delete_collection(&name).await?;
        Ok(Response::new(proto::DeleteCollectionResponse {}))
    }

    async fn upsert_documents(
        &self,
        request: Request<proto::UpsertDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let _permit = self.admit()?;
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

    async fn delete_documents(
        &self,
        request: Request<proto::DeleteDocumentsRequest>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let _permit = self.admit()?;
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

    async fn upload_documents(
        &self,
        request: Request<Streaming<proto::UpsertDocumentsRequest>>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let _permit = self.admit()?;
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

    async fn retrieve(
        &self,
        request: Request<proto::RetrieveRequest>,
    ) -> Result<Response<proto::RetrieveResponse>, Status> {
        let _permit = self.admit()?;
        let query = convert::retrieve_query_from_proto(request.into_inner(), self.default_top_k)?;
        let result = self.service.retrieve(query).await?;
        Ok(Response::new(result.into()))
    }
}
