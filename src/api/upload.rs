//! The streaming upload: each message of the stream is a write of its own (its own operation
//! and its own `write_id`); with `wait` on any message, the answer waits until all of them are
//! visible.

use futures::{Stream, StreamExt};
use tonic::metadata::MetadataMap;
use tonic::{Response, Status};

use super::auth::Access;
use super::convert;
use super::grpc::GrpcAdapter;
use super::proto;
use crate::error::LatheError;
use crate::types::{WriteOptions, WriteOutcome};

impl GrpcAdapter {
    /// The upload of `messages`, as gRPC's stream or the HTTP port's lines bring them (an error
    /// among them ends the upload with it), admitted with `metadata`.
    pub(super) async fn upload(
        &self,
        metadata: &MetadataMap,
        messages: impl Stream<Item = Result<proto::UpsertDocumentsRequest, Status>>,
    ) -> Result<Response<proto::WriteResponse>, Status> {
        let call = self.admit("UploadDocuments", Access::Write, metadata)?;
        let result = async move {
            let mut stream = std::pin::pin!(messages);
            let mut collection_name: Option<String> = None;
            let mut wait = false;
            let mut total = WriteOutcome::default();
            while let Some(message) = stream.next().await.transpose()? {
                let proto::UpsertDocumentsRequest {
                    collection,
                    documents,
                    wait: wait_here,
                    write_id,
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
                let options = WriteOptions {
                    wait: false,
                    write_id,
                    wait_until: None,
                };
                let outcome = self
                    .service
                    .upsert_documents(&collection, documents, options)
                    .await?;
                total.documents += outcome.documents;
                total.sections += outcome.sections;
                total.consistency_token = total.consistency_token.max(outcome.consistency_token);
                total.operation_ids.extend(outcome.operation_ids);
                total.operation = outcome.operation;
            }
            if let (Some(collection), true) = (collection_name, wait) {
                total.generation = self
                    .service
                    .sync(&collection, total.consistency_token)
                    .await?;
                // Each message's write was queued without waiting, so its sections are known
                // only now that all are applied.
                total.sections = 0;
                for id in &total.operation_ids {
                    let operation = self.service.get_operation(*id).await?;
                    total.sections += operation.sections;
                    total.operation = Some(operation);
                }
            }
            Ok(Response::new(total.into()))
        }
        .await;
        call.finish(result)
    }
}
