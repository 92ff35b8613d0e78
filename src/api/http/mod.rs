//! The HTTP/JSON API (`server.http_listen`): every RPC of `lathe.v1.Lathe` at a route under
//! `/v1/` (`routes`; the document upload as newline-delimited JSON, a snapshot file's download
//! and restore as its bytes), `/v1/health`, its messages in the proto3 JSON mapping (serde
//! generated from the proto by `pbjson`, in `lathe-proto`), and the OpenAPI document derived from
//! the proto at `/v1/openapi.json` (`openapi`).
//!
//! A request is not served beside gRPC but through it: its headers become the call's metadata
//! and the generated `Lathe` trait of the same `GrpcAdapter` answers it, so API keys, the
//! concurrency limit, the server's deadline, validation and the status mapping are the gRPC
//! port's own. What tonic does before the adapter is done here the same way: the body is held to
//! `limits.max_message_bytes`, a client's `grpc-timeout` (or `x-lathe-timeout-ms`) is answered
//! with DEADLINE_EXCEEDED as `deadline` does, and TLS uses the same certificate and client CA
//! (`tls`). A status becomes its HTTP code (`status::http_code`) and a JSON body (`json`).

mod json;
mod openapi;
mod routes;

pub use openapi::{HEALTH_PATH, OPENAPI_PATH};

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use http::{header, Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpListener;
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::deadline::parse_grpc_timeout;
use super::grpc::GrpcAdapter;
use super::proto;
use super::proto::lathe_server::Lathe;
use crate::error::{LatheError, Result};
use routes::{Matched, Route, Rpc};

/// What the HTTP port serves with.
pub struct HttpApi {
    pub adapter: Arc<GrpcAdapter>,
    /// The health service's Check, for `/v1/health`.
    pub health: super::health::ReadinessHealth,
    pub max_message_bytes: usize,
}

/// Serves the HTTP/JSON API on `listener` (with TLS when `tls` is set) until `stop` turns true,
/// then finishes the requests in flight; the returned task ends when they are done.
pub fn spawn(
    listener: TcpListener,
    api: HttpApi,
    tls: Option<Arc<super::reload::Reloadable<tokio_rustls::rustls::ServerConfig>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let bound = listener
        .local_addr()
        .map_err(|e| LatheError::io("reading the HTTP listen address", e))?;
    let openapi = Arc::new(openapi::document()?);
    let api = Arc::new(api);
    let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let api = Arc::clone(&api);
        let openapi = Arc::clone(&openapi);
        async move { handle(&api, &openapi, request).await }
    });
    let stopped = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    };
    tracing::info!(http_address = %bound, tls = tls.is_some(), "http serving");
    let served = match tls {
        None => {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|stream| {
                let _ = stream.set_nodelay(true);
            });
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
        Some(config) => {
            let listener = super::tls::TlsListener::new(listener, config);
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
    };
    Ok(tokio::spawn(async move {
        match served.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "http server failed"),
            Err(error) => tracing::error!(%error, "http server task failed"),
        }
    }))
}

/// One HTTP request: the OpenAPI document, or an RPC at its route under the client's deadline.
async fn handle(api: &HttpApi, openapi: &[u8], request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    if parts.method == Method::GET && parts.uri.path() == OPENAPI_PATH {
        return (
            [(header::CONTENT_TYPE, "application/json")],
            openapi.to_vec(),
        )
            .into_response();
    }
    if parts.method == Method::GET && parts.uri.path() == HEALTH_PATH {
        return health(api).await;
    }
    let (route, parameters) = match routes::match_route(&parts.method, parts.uri.path()) {
        Matched::Route(route, parameters) => (route, parameters),
        Matched::WrongMethod(allowed) => return wrong_method(&parts.method, &allowed),
        Matched::NotFound => {
            let status = Status::not_found(format!(
                "no route {} {}; the routes are listed at {OPENAPI_PATH}",
                parts.method,
                parts.uri.path()
            ));
            return json::status_response(&status);
        }
    };
    let mut metadata = MetadataMap::from_headers(parts.headers);
    let client_timeout = client_timeout(&mut metadata);
    let call = dispatch(api, route, parameters, parts.uri.query(), metadata, body);
    let result = match client_timeout {
        None => call.await,
        Some(timeout) => {
            let limit = super::deadline::answer_within(timeout);
            tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(LatheError::DeadlineExceeded {
                    call: format!("/lathe.v1.Lathe/{}", route.rpc.name()),
                    limit: timeout,
                    set_by_client: true,
                }
                .into())
            })
        }
    };
    result.unwrap_or_else(|status| json::status_response(&status))
}

/// `lathe.v1.Lathe`'s health as the health service's Check answers it (open, as that service is):
/// 200 `{"status": "SERVING"}`, or 503 with the status it is in (NOT_SERVING while loading,
/// draining, or a replica lagging).
async fn health(api: &HttpApi) -> Response {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_server::Health;
    let service = <super::LatheService as tonic::server::NamedService>::NAME;
    let request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
        service: service.to_string(),
    });
    match api.health.check(request).await {
        Ok(answer) => {
            let status =
                ServingStatus::try_from(answer.get_ref().status).unwrap_or(ServingStatus::Unknown);
            let code = match status {
                ServingStatus::Serving => StatusCode::OK,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = serde_json::json!({"status": status.as_str_name()});
            let mut response = json::reply(&body);
            *response.status_mut() = code;
            response
        }
        Err(status) => json::status_response(&status),
    }
}

/// The client's timeout: `grpc-timeout` as gRPC writes it, or `x-lathe-timeout-ms`, which is
/// put in the metadata as the `grpc-timeout` the adapter reads.
fn client_timeout(metadata: &mut MetadataMap) -> Option<Duration> {
    let milliseconds = metadata
        .get("x-lathe-timeout-ms")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if let Some(milliseconds) = milliseconds {
        // grpc-timeout holds at most 8 digits.
        let value = if milliseconds < 100_000_000 {
            format!("{milliseconds}m")
        } else {
            format!("{}S", (milliseconds / 1000).min(99_999_999))
        };
        if let Ok(value) = value.parse() {
            metadata.insert("grpc-timeout", value);
        }
    }
    metadata
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// 405 with `Allow`; the body says UNIMPLEMENTED, as grpc-gateway answers.
fn wrong_method(method: &Method, allowed: &[Method]) -> Response {
    let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let status = Status::unimplemented(format!(
        "{method} is not a method of this path; it takes {}",
        names.join(", ")
    ));
    let mut response = json::status_response(&status);
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    if let Ok(value) = names.join(", ").parse() {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// Reads the request message and calls the adapter's method for `route`.
async fn dispatch(
    api: &HttpApi,
    route: &'static Route,
    parameters: Vec<(&'static str, String)>,
    query: Option<&str>,
    metadata: MetadataMap,
    body: Body,
) -> std::result::Result<Response, Status> {
    let adapter = &*api.adapter;
    if route.body == routes::Body::Lines {
        let messages = lines(body, api.max_message_bytes, parameters);
        let reply = adapter.upload(&metadata, messages).await?;
        return Ok(json::reply(reply.get_ref()));
    }
    if route.body == routes::Body::File && !is_json(&metadata) {
        let messages = snapshot_file(body, parameters);
        let reply = adapter.restore_from(&metadata, messages).await?;
        return Ok(json::reply(reply.get_ref()));
    }
    let body = read_body(body, api.max_message_bytes).await?;
    let query = query.filter(|_| route.body == routes::Body::None);
    let object = json::request_object(&body, &parameters, query)?;
    let call = Call { metadata, object };
    match route.rpc {
        Rpc::CreateCollection => call.run(|r| adapter.create_collection(r)).await,
        Rpc::ListCollections => call.run(|r| adapter.list_collections(r)).await,
        Rpc::GetCollection => call.run(|r| adapter.get_collection(r)).await,
        Rpc::DeleteCollection => call.run(|r| adapter.delete_collection(r)).await,
        Rpc::UpsertDocuments => call.run(|r| adapter.upsert_documents(r)).await,
        Rpc::DeleteDocuments => call.run(|r| adapter.delete_documents(r)).await,
        Rpc::GetOperation => call.run(|r| adapter.get_operation(r)).await,
        Rpc::ListOperations => call.run(|r| adapter.list_operations(r)).await,
        Rpc::WaitOperation => call.run(|r| adapter.wait_operation(r)).await,
        Rpc::Retrieve => call.run(|r| adapter.retrieve(r)).await,
        Rpc::CreateAlias => call.run(|r| adapter.create_alias(r)).await,
        Rpc::SwitchAlias => call.run(|r| adapter.switch_alias(r)).await,
        Rpc::DeleteAlias => call.run(|r| adapter.delete_alias(r)).await,
        Rpc::ListAliases => call.run(|r| adapter.list_aliases(r)).await,
        Rpc::CreateSnapshot => call.run(|r| adapter.create_snapshot(r)).await,
        Rpc::ListSnapshots => call.run(|r| adapter.list_snapshots(r)).await,
        Rpc::DeleteSnapshot => call.run(|r| adapter.delete_snapshot(r)).await,
        Rpc::RecoverLog => call.run(|r| adapter.recover_log(r)).await,
        Rpc::DownloadSnapshot => download(adapter, call).await,
        Rpc::RestoreSnapshot => {
            let message = json::decode(call.object)?;
            let messages = futures::stream::iter([Ok(message)]);
            let reply = adapter.restore_from(&call.metadata, messages).await?;
            Ok(json::reply(reply.get_ref()))
        }
        Rpc::UploadDocuments => Err(LatheError::internal("the upload route reads lines").into()),
    }
}

/// Whether the request says its body is JSON (anything else on a file route is the file).
fn is_json(metadata: &MetadataMap) -> bool {
    metadata
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("application/json"))
}

/// A snapshot file's bytes as one `application/octet-stream` body of its length, named as the
/// server keeps it. A read failing midway ends the body short of that length, which an HTTP
/// client reports.
async fn download(adapter: &GrpcAdapter, call: Call) -> std::result::Result<Response, Status> {
    let message: proto::DownloadSnapshotRequest = json::decode(call.object)?;
    let name = message.name.clone();
    let request = tonic::Request::from_parts(call.metadata, tonic::Extensions::default(), message);
    let (chunks, length) = adapter.download(request).await?;
    let bytes = chunks.map(|chunk| {
        chunk
            .map(|chunk| axum::body::Bytes::from(chunk.data))
            .map_err(|status| std::io::Error::other(status.message().to_string()))
    });
    let disposition = format!("attachment; filename=\"{}\"", name.replace('"', ""));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        Body::from_stream(bytes),
    )
        .into_response())
}

/// A restore's body as its messages: the first names the collection (from the path) with the
/// file's first bytes, each next one carries the bytes as they arrive.
fn snapshot_file(
    body: Body,
    parameters: Vec<(&'static str, String)>,
) -> impl Stream<Item = std::result::Result<proto::RestoreSnapshotRequest, Status>> {
    let collection = parameters
        .into_iter()
        .find(|(name, _)| *name == "collection")
        .map(|(_, value)| value)
        .unwrap_or_default();
    let first = proto::RestoreSnapshotRequest {
        collection,
        ..Default::default()
    };
    let chunks = body.into_data_stream().map(|chunk| {
        chunk
            .map(|data| proto::RestoreSnapshotRequest {
                data: data.to_vec(),
                ..Default::default()
            })
            .map_err(|error| Status::cancelled(format!("reading the request body: {error}")))
    });
    futures::stream::iter([Ok(first)]).chain(chunks)
}

/// A unary call's metadata and its message's JSON.
struct Call {
    metadata: MetadataMap,
    object: serde_json::Map<String, serde_json::Value>,
}

impl Call {
    /// Decodes the message, calls `method` with it and the metadata, and writes its reply.
    async fn run<Message, Reply, Method, Answer>(
        self,
        method: Method,
    ) -> std::result::Result<Response, Status>
    where
        Message: DeserializeOwned,
        Reply: Serialize,
        Method: FnOnce(tonic::Request<Message>) -> Answer,
        Answer: std::future::Future<Output = std::result::Result<tonic::Response<Reply>, Status>>,
    {
        let message = json::decode(self.object)?;
        let request =
            tonic::Request::from_parts(self.metadata, tonic::Extensions::default(), message);
        let reply = method(request).await?;
        Ok(json::reply(reply.get_ref()))
    }
}

/// The whole body, refused with RESOURCE_EXHAUSTED past `limit` bytes (the gRPC port's message
/// limit; a message's JSON is longer than its protobuf encoding).
async fn read_body(body: Body, limit: usize) -> std::result::Result<axum::body::Bytes, Status> {
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let error = error.into_inner();
        if error.is::<http_body_util::LengthLimitError>() {
            too_large(limit).into()
        } else {
            Status::cancelled(format!("reading the request body: {error}"))
        }
    })
}

fn too_large(limit: usize) -> LatheError {
    LatheError::TooLarge {
        what: "the request body (limits.max_message_bytes)".to_string(),
        size: limit as u64 + 1,
        limit: limit as u64,
    }
}

/// An upload's body as its messages: newline-delimited JSON, one `UpsertDocumentsRequest` per
/// line (blank lines skipped), each line held to `limit` bytes; read as it arrives, so each
/// message is written before the next is read, as on the gRPC stream.
fn lines(
    body: Body,
    limit: usize,
    parameters: Vec<(&'static str, String)>,
) -> impl Stream<Item = std::result::Result<proto::UpsertDocumentsRequest, Status>> {
    struct Reading {
        chunks: axum::body::BodyDataStream,
        buffer: Vec<u8>,
        ended: bool,
        line: usize,
    }
    let reading = Reading {
        chunks: body.into_data_stream(),
        buffer: Vec::new(),
        ended: false,
        line: 0,
    };
    futures::stream::unfold(Some(reading), move |state| {
        let parameters = parameters.clone();
        async move {
            let mut reading = state?;
            loop {
                let newline = reading.buffer.iter().position(|&byte| byte == b'\n');
                let line: Vec<u8> = match newline {
                    Some(end) => reading.buffer.drain(..=end).collect(),
                    None if reading.ended => std::mem::take(&mut reading.buffer),
                    None if reading.buffer.len() > limit => {
                        return Some((Err(too_large(limit).into()), None));
                    }
                    None => {
                        match reading.chunks.next().await {
                            Some(Ok(chunk)) => reading.buffer.extend_from_slice(&chunk),
                            Some(Err(error)) => {
                                let status =
                                    Status::cancelled(format!("reading the request body: {error}"));
                                return Some((Err(status), None));
                            }
                            None => reading.ended = true,
                        }
                        continue;
                    }
                };
                reading.line += 1;
                if line.len() > limit.saturating_add(1) {
                    return Some((Err(too_large(limit).into()), None));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    if reading.ended && reading.buffer.is_empty() {
                        return None;
                    }
                    continue;
                }
                let message = json::request_object(&line, &parameters, None)
                    .and_then(json::decode)
                    .map_err(|status| {
                        Status::new(
                            status.code(),
                            format!("line {}: {}", reading.line, status.message()),
                        )
                    });
                let next = message.is_ok().then_some(reading);
                return Some((message, next));
            }
        }
    })
}
