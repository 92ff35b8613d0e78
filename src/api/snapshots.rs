//! The snapshot calls. Taking a snapshot and restoring one read or write a whole collection, so
//! neither runs under the server's request timeout (only under the client's deadline, and a
//! snapshot once started is finished even if the client stops waiting). The download streams the
//! file in 1 MiB messages; a restore's streamed bytes reach the blocking restore through a
//! bounded channel, so an upload is never held in memory.

use std::io::Read;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::auth::Access;
use super::grpc::GrpcAdapter;
use super::proto;
use super::status::oversized_to_resource_exhausted;
use crate::error::LatheError;
use crate::service::{Restored, SnapshotInfo};

/// Bytes per download message.
const CHUNK_BYTES: usize = 1 << 20;
/// Messages buffered between the network and the file, each way.
const CHANNEL_MESSAGES: usize = 8;

pub(super) type DownloadStream = ReceiverStream<Result<proto::SnapshotChunk, Status>>;

impl GrpcAdapter {
    pub(super) async fn create_snapshot_call(
        &self,
        request: Request<proto::CreateSnapshotRequest>,
    ) -> Result<Response<proto::SnapshotInfo>, Status> {
        let call = self.admit("CreateSnapshot", Access::Write, request.metadata())?;
        let proto::CreateSnapshotRequest { collection } = request.into_inner();
        let result = self.service.create_snapshot(&collection).await;
        call.finish(
            result
                .map(|info| Response::new(info_to_proto(info)))
                .map_err(Status::from),
        )
    }

    pub(super) async fn list_snapshots_call(
        &self,
        request: Request<proto::ListSnapshotsRequest>,
    ) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        self.unary(
            "ListSnapshots",
            Access::Read,
            request,
            |proto::ListSnapshotsRequest { collection }| async move {
                let snapshots = self.service.list_snapshots(&collection).await?;
                Ok(proto::ListSnapshotsResponse {
                    snapshots: snapshots.into_iter().map(info_to_proto).collect(),
                })
            },
        )
        .await
    }

    pub(super) async fn delete_snapshot_call(
        &self,
        request: Request<proto::DeleteSnapshotRequest>,
    ) -> Result<Response<proto::DeleteSnapshotResponse>, Status> {
        self.unary(
            "DeleteSnapshot",
            Access::Write,
            request,
            |proto::DeleteSnapshotRequest { collection, name }| async move {
                self.service.delete_snapshot(&collection, &name).await?;
                Ok(proto::DeleteSnapshotResponse {})
            },
        )
        .await
    }

    pub(super) async fn download_snapshot_call(
        &self,
        request: Request<proto::DownloadSnapshotRequest>,
    ) -> Result<Response<DownloadStream>, Status> {
        let (stream, _) = self.download(request).await?;
        Ok(Response::new(stream))
    }

    /// The snapshot file's bytes as a stream of messages, and its length (the HTTP port's
    /// `Content-Length`).
    pub(super) async fn download(
        &self,
        request: Request<proto::DownloadSnapshotRequest>,
    ) -> Result<(DownloadStream, u64), Status> {
        let call = self.admit("DownloadSnapshot", Access::Read, request.metadata())?;
        let proto::DownloadSnapshotRequest { collection, name } = request.into_inner();
        let opened = self.service.open_snapshot(&collection, &name).await;
        let (mut file, length) = call.finish(opened.map_err(Status::from))?;
        let (sender, receiver) = mpsc::channel(CHANNEL_MESSAGES);
        tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0; CHUNK_BYTES];
            loop {
                let message = match read_full(&mut file, &mut buffer) {
                    Ok(0) => return,
                    Ok(read) => Ok(proto::SnapshotChunk {
                        data: buffer[..read].to_vec(),
                    }),
                    Err(error) => Err(Status::from(LatheError::io(
                        format!("reading snapshot {name}"),
                        error,
                    ))),
                };
                let failed = message.is_err();
                if sender.blocking_send(message).is_err() || failed {
                    return;
                }
            }
        });
        Ok((ReceiverStream::new(receiver), length))
    }

    pub(super) async fn restore_snapshot_call(
        &self,
        request: Request<Streaming<proto::RestoreSnapshotRequest>>,
    ) -> Result<Response<proto::RestoreSnapshotResponse>, Status> {
        let (metadata, _, messages) = request.into_parts();
        let messages = messages.map(|message| message.map_err(oversized_to_resource_exhausted));
        self.restore_from(&metadata, messages).await
    }

    /// The restore of `messages`, as gRPC's stream or the HTTP port's body brings them,
    /// admitted with `metadata`.
    pub(super) async fn restore_from(
        &self,
        metadata: &MetadataMap,
        messages: impl Stream<Item = Result<proto::RestoreSnapshotRequest, Status>>,
    ) -> Result<Response<proto::RestoreSnapshotResponse>, Status> {
        let call = self.admit("RestoreSnapshot", Access::Write, metadata)?;
        let result = self.restore(messages).await;
        call.finish(result.map(|restored| Response::new(restored_to_proto(restored))))
    }

    async fn restore(
        &self,
        messages: impl Stream<Item = Result<proto::RestoreSnapshotRequest, Status>>,
    ) -> Result<Restored, Status> {
        let mut stream = std::pin::pin!(messages);
        let Some(first) = stream.next().await.transpose()? else {
            return Err(LatheError::invalid("collection", "the call sent no message").into());
        };
        let proto::RestoreSnapshotRequest {
            collection,
            snapshot_collection,
            snapshot_name,
            data,
        } = first;
        if !snapshot_name.is_empty() {
            let (file, _) = self
                .service
                .open_snapshot(&snapshot_collection, &snapshot_name)
                .await?;
            if !data.is_empty() || stream.next().await.transpose()?.is_some() {
                return Err(LatheError::invalid(
                    "data",
                    "must be empty when snapshot_name names a snapshot this server keeps",
                )
                .into());
            }
            let restoring =
                self.service
                    .restore_snapshot(collection, snapshot_name, Box::new(file));
            return Ok(restoring.await?);
        }
        let (sender, receiver) = mpsc::channel(CHANNEL_MESSAGES);
        let reader = ChannelReader {
            receiver,
            current: Vec::new(),
            position: 0,
        };
        let label = "the uploaded snapshot".to_string();
        let restoring = self
            .service
            .restore_snapshot(collection, label, Box::new(reader));
        let feeding = async move {
            let mut data = data;
            loop {
                if !data.is_empty() && sender.send(Ok(data)).await.is_err() {
                    return; // The restore ended (refused): the rest is not needed.
                }
                match stream.next().await.transpose() {
                    Ok(Some(message)) => data = message.data,
                    Ok(None) => return,
                    Err(status) => {
                        let broken = std::io::Error::other(status.message().to_string());
                        let _ = sender.send(Err(broken)).await;
                        return;
                    }
                }
            }
        };
        let (restored, ()) = tokio::join!(restoring, feeding);
        Ok(restored?)
    }
}

/// Fills `buffer` as far as the file goes; 0 at its end.
fn read_full(file: &mut std::fs::File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..])? {
            0 => break,
            read => filled += read,
        }
    }
    Ok(filled)
}

/// The streamed bytes as a blocking reader; the end of the call's stream is its end.
struct ChannelReader {
    receiver: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    current: Vec<u8>,
    position: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.position == self.current.len() {
            match self.receiver.blocking_recv() {
                Some(next) => {
                    self.current = next?;
                    self.position = 0;
                }
                None => return Ok(0),
            }
        }
        let read = buf.len().min(self.current.len() - self.position);
        buf[..read].copy_from_slice(&self.current[self.position..self.position + read]);
        self.position += read;
        Ok(read)
    }
}

fn info_to_proto(info: SnapshotInfo) -> proto::SnapshotInfo {
    proto::SnapshotInfo {
        collection: info.collection,
        name: info.name,
        bytes: info.bytes,
        generation: info.generation,
        created_unix_ms: info.created_unix_ms,
    }
}

fn restored_to_proto(restored: Restored) -> proto::RestoreSnapshotResponse {
    proto::RestoreSnapshotResponse {
        collection: Some(restored.collection.into()),
        source_collection: restored.source_collection,
        generation: restored.generation,
        files: restored.files,
        bytes: restored.bytes,
    }
}
