//! The client side, shared by `lathe ingest`/`query`/`eval`, the benchmark programs and the
//! integration tests: connecting a tonic client, parsing the names a user types for proto enums,
//! uploading in batches. Nothing here knows the service: it speaks only the gRPC API.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use lathe_text::chunk::Strategy;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::proto;
use crate::proto::lathe_client::LatheClient;
use crate::server_process::loopback_serve_command;

/// The largest message a client sends or accepts by default: the server's default limit.
pub const DEFAULT_CLIENT_MESSAGE_BYTES: usize = 64 << 20;

/// The client every tool uses: a channel whose calls carry `authorization: Bearer <key>` when
/// `LATHE_API_KEY` is set.
pub type Client = LatheClient<InterceptedService<Channel, ApiKey>>;

/// The environment variable a tool takes its API key from (a flag would show in `ps`).
pub const API_KEY_VARIABLE: &str = "LATHE_API_KEY";
/// The PEM file of the CA that signed an `https://` server's certificate.
pub const CA_CERT_VARIABLE: &str = "LATHE_CA_CERT";

/// Adds the API key, if any, to every call.
#[derive(Clone)]
pub struct ApiKey(Option<MetadataValue<Ascii>>);

impl ApiKey {
    /// `LATHE_API_KEY`, if set.
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var(API_KEY_VARIABLE) {
            Ok(key) if !key.is_empty() => {
                let value = format!("Bearer {key}")
                    .parse()
                    .with_context(|| format!("{API_KEY_VARIABLE} is not a valid header value"))?;
                Ok(Self(Some(value)))
            }
            _ => Ok(Self(None)),
        }
    }
}

impl tonic::service::Interceptor for ApiKey {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Connects a gRPC client with messages as large as the server's default limit.
pub async fn connect(address: &str) -> anyhow::Result<Client> {
    connect_with_message_limit(address, DEFAULT_CLIENT_MESSAGE_BYTES).await
}

/// Connects a gRPC client that sends and accepts messages up to `message_bytes`. `address` is
/// `host:port` (plaintext) or a full `http://`/`https://` URI; over `https://`, the server's
/// certificate is checked against the CA in `LATHE_CA_CERT`. The API key comes from
/// `LATHE_API_KEY` (see [`ApiKey`]).
pub async fn connect_with_message_limit(
    address: &str,
    message_bytes: usize,
) -> anyhow::Result<Client> {
    let endpoint = if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let mut builder = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .with_context(|| format!("invalid address {endpoint}"))?;
    if endpoint.starts_with("https://") {
        let Some(ca) = std::env::var_os(CA_CERT_VARIABLE) else {
            anyhow::bail!("{endpoint}: set {CA_CERT_VARIABLE} to the PEM file of the CA that signed the server's certificate");
        };
        let pem = std::fs::read(&ca)
            .with_context(|| format!("reading {CA_CERT_VARIABLE} {}", Path::new(&ca).display()))?;
        builder = builder
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .context("TLS settings")?;
    }
    let channel = builder
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok(LatheClient::with_interceptor(channel, ApiKey::from_env()?)
        .max_decoding_message_size(message_bytes)
        .max_encoding_message_size(message_bytes))
}

/// A status as gRPC names it: `NOT_FOUND: <the server's message>`.
pub fn status_line(status: &tonic::Status) -> String {
    format!("{}: {}", code_name(status.code()), status.message())
}

/// A code's gRPC name (`DEADLINE_EXCEEDED`), not Rust's (`DeadlineExceeded`).
pub fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The proto strategy a user names (`fixed`, `sentence`, `recursive`, `structure`, `auto`,
/// `semantic`, `csv`, `code`).
pub fn strategy_from_name(name: &str) -> anyhow::Result<proto::ChunkStrategy> {
    let strategy = Strategy::from_name(&name.to_ascii_lowercase()).ok_or_else(|| {
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
        anyhow::anyhow!(
            "unknown strategy `{name}`: expected one of {}",
            names.join(", ")
        )
    })?;
    let proto_name = format!("CHUNK_STRATEGY_{}", strategy.name().to_ascii_uppercase());
    proto::ChunkStrategy::from_str_name(&proto_name)
        .with_context(|| format!("the API has no strategy {proto_name}"))
}

/// Streams `documents` to `collection` in messages of `batch` documents (at least one) with
/// `wait`, so the answer comes once all of them are searchable: one call, whatever the corpus size
/// (a unary upsert of a whole corpus would outlast its deadline).
pub async fn upload_in_batches(
    client: &mut Client,
    collection: &str,
    documents: Vec<proto::Document>,
    batch: usize,
) -> Result<proto::WriteResponse, tonic::Status> {
    let batch = batch.max(1);
    let mut messages = Vec::with_capacity(documents.len().div_ceil(batch));
    let mut documents = documents.into_iter().peekable();
    while documents.peek().is_some() {
        messages.push(proto::UpsertDocumentsRequest {
            collection: collection.to_string(),
            documents: documents.by_ref().take(batch).collect(),
            wait: true,
            write_id: String::new(),
        });
    }
    let response = client
        .upload_documents(tokio_stream::iter(messages))
        .await?;
    Ok(response.into_inner())
}

/// A collection name no other run of this tool picks: `<prefix>-<pid>-<unix seconds>`.
pub fn unique_collection_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since_epoch| since_epoch.as_secs())
    )
}

/// The command that runs the `lathe` binary at `binary` as a server of its own, as the benchmark
/// programs start one: a port-0 loopback listener, JSON logs on stderr (piped: the listening
/// address is read from there), stdout dropped, its models from `models_dir`, its data in
/// `data_dir`, `models.dense = dense`. Callers add their own `LATHE_*` settings before spawning.
pub fn serve_command(binary: &Path, models_dir: &Path, data_dir: &Path, dense: &str) -> Command {
    let mut command = loopback_serve_command(binary, models_dir, data_dir);
    command.env("LATHE_MODELS__DENSE", dense);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_print_as_grpc_names_them() {
        assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
        assert_eq!(
            code_name(tonic::Code::DeadlineExceeded),
            "DEADLINE_EXCEEDED"
        );
        assert_eq!(code_name(tonic::Code::Ok), "OK");
        assert_eq!(
            status_line(&tonic::Status::resource_exhausted("queue full")),
            "RESOURCE_EXHAUSTED: queue full"
        );
    }

    #[test]
    fn strategy_names_parse_case_insensitively_and_unknown_names_list_the_choices() {
        assert_eq!(
            strategy_from_name("Sentence").unwrap(),
            proto::ChunkStrategy::Sentence
        );
        assert_eq!(
            strategy_from_name("code").unwrap(),
            proto::ChunkStrategy::Code
        );
        let message = strategy_from_name("unspecified").unwrap_err().to_string();
        assert!(
            message.contains("unknown strategy `unspecified`"),
            "{message}"
        );
        let message = strategy_from_name("chapters").unwrap_err().to_string();
        assert!(message.contains("fixed, sentence, recursive"), "{message}");
    }
}
