//! The client side, shared by `lathe ingest`/`query`/`eval`, the benchmark programs and the
//! integration tests: connecting a tonic client, parsing the names a user types for proto enums,
//! uploading in batches. Nothing here knows the service: it speaks only the gRPC API.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use lathe_text::chunk::Strategy;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::proto;
use crate::proto::lathe_client::LatheClient;
use crate::server_process::loopback_serve_command;

/// The largest message a client sends or accepts by default: the server's default limit.
pub const DEFAULT_CLIENT_MESSAGE_BYTES: usize = 64 << 20;

/// The client every tool uses: a channel whose calls carry `authorization: Bearer <key>` when
/// an API key is given.
pub type Client = LatheClient<InterceptedService<Channel, ApiKey>>;

/// The environment variable a tool takes its API key from (a flag would show in `ps`).
pub const API_KEY_VARIABLE: &str = "LATHE_API_KEY";
/// The PEM file of the CA that signed a TLS server's certificate.
pub const CA_CERT_VARIABLE: &str = "LATHE_CA_CERT";
/// The PEM certificate a client presents to a server that asks for one (mutual TLS).
pub const TLS_CERT_VARIABLE: &str = "LATHE_TLS_CERT";
/// The PEM private key of that certificate.
pub const TLS_KEY_VARIABLE: &str = "LATHE_TLS_KEY";

/// How a client reaches a secured server: its API key, the CA it trusts and, for mutual TLS,
/// the identity it presents. The options of every client subcommand (global, so they may follow
/// a nested subcommand: `lathe snapshot list --tls-ca ca.pem`); each falls back to its
/// environment variable, which the benchmark programs read through [`ConnectArgs::from_env`].
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    /// API key, sent as `authorization: Bearer KEY` (prefer the variable: a flag shows in `ps`).
    #[arg(long, env = API_KEY_VARIABLE, hide_env_values = true, global = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// PEM file of the CA that signed the server's certificate; connects over TLS (a `host:port`
    /// address becomes `https://host:port`).
    #[arg(long, env = CA_CERT_VARIABLE, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate this client presents to a server that requires one (mutual TLS; with
    /// --tls-key).
    #[arg(long, env = TLS_CERT_VARIABLE, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = TLS_KEY_VARIABLE, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must hold, when the address does not (e.g. an IP
    /// address, or a tunnel's local port).
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

impl ConnectArgs {
    /// The settings the environment gives (`LATHE_API_KEY`, `LATHE_CA_CERT`, `LATHE_TLS_CERT`,
    /// `LATHE_TLS_KEY`), for tools without these flags.
    pub fn from_env() -> Self {
        let variable = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        Self {
            api_key: std::env::var(API_KEY_VARIABLE).ok(),
            tls_ca: variable(CA_CERT_VARIABLE).map(PathBuf::from),
            tls_cert: variable(TLS_CERT_VARIABLE).map(PathBuf::from),
            tls_key: variable(TLS_KEY_VARIABLE).map(PathBuf::from),
            tls_domain: None,
        }
    }

    /// Whether any TLS setting is given (then a bare `host:port` is reached over TLS).
    fn wants_tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_key.is_some()
    }

    /// The URI `address` names: `host:port` becomes `https://` when a TLS setting is given,
    /// else `http://`; a full URI stays as it is, but `http://` with TLS settings is refused
    /// (they would be ignored, and an API key sent in the clear).
    fn endpoint_uri(&self, address: &str) -> anyhow::Result<String> {
        if address.starts_with("https://") {
            return Ok(address.to_string());
        }
        if address.starts_with("http://") {
            anyhow::ensure!(
                !self.wants_tls(),
                "{address} is plaintext, but --tls-ca, --tls-cert or --tls-key (or {CA_CERT_VARIABLE}, {TLS_CERT_VARIABLE}, {TLS_KEY_VARIABLE}) is set: use https:// or leave them out"
            );
            return Ok(address.to_string());
        }
        let scheme = if self.wants_tls() { "https" } else { "http" };
        Ok(format!("{scheme}://{address}"))
    }

    /// The TLS settings of an `https://` endpoint: the CA to trust, the name to expect, the
    /// identity to present.
    fn tls_config(&self, endpoint: &str) -> anyhow::Result<ClientTlsConfig> {
        let Some(ca) = &self.tls_ca else {
            anyhow::bail!("{endpoint}: give --tls-ca (or set {CA_CERT_VARIABLE}) to the PEM file of the CA that signed the server's certificate");
        };
        let read = |path: &Path, what: &str| {
            std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(
            ca,
            "the CA certificate (--tls-ca)",
        )?));
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let identity = Identity::from_pem(
                    read(cert, "the client certificate (--tls-cert)")?,
                    read(key, "the client key (--tls-key)")?,
                );
                tls = tls.identity(identity);
            }
            (None, None) => {}
            _ => anyhow::bail!("mutual TLS needs both --tls-cert and --tls-key (or {TLS_CERT_VARIABLE} and {TLS_KEY_VARIABLE})"),
        }
        if let Some(domain) = &self.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(tls)
    }

    /// A channel to `address` (see [`Self::endpoint_uri`]), connected.
    pub async fn channel(&self, address: &str) -> anyhow::Result<Channel> {
        let endpoint = self.endpoint_uri(address)?;
        let mut builder = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .with_context(|| format!("invalid address {endpoint}"))?;
        if endpoint.starts_with("https://") {
            builder = builder
                .tls_config(self.tls_config(&endpoint)?)
                .context("TLS settings")?;
        }
        builder
            .connect()
            .await
            .with_context(|| format!("connecting to {endpoint}"))
    }

    /// The interceptor that adds the API key, if one is given, to every call.
    pub fn api_key(&self) -> anyhow::Result<ApiKey> {
        match self.api_key.as_deref() {
            Some(key) if !key.is_empty() => {
                let value = format!("Bearer {key}").parse().with_context(|| {
                    format!(
                        "the API key (--api-key or {API_KEY_VARIABLE}) is not a valid header value"
                    )
                })?;
                Ok(ApiKey(Some(value)))
            }
            _ => Ok(ApiKey(None)),
        }
    }

    /// A Lathe client of `address` that sends and accepts messages up to `message_bytes`.
    pub async fn connect_with_message_limit(
        &self,
        address: &str,
        message_bytes: usize,
    ) -> anyhow::Result<Client> {
        let channel = self.channel(address).await?;
        Ok(LatheClient::with_interceptor(channel, self.api_key()?)
            .max_decoding_message_size(message_bytes)
            .max_encoding_message_size(message_bytes))
    }

    /// A Lathe client of `address` with messages as large as the server's default limit.
    pub async fn connect(&self, address: &str) -> anyhow::Result<Client> {
        self.connect_with_message_limit(address, DEFAULT_CLIENT_MESSAGE_BYTES)
            .await
    }
}

/// Adds the API key, if any, to every call.
#[derive(Clone)]
pub struct ApiKey(Option<MetadataValue<Ascii>>);

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

/// Connects a gRPC client with messages as large as the server's default limit, with the
/// settings of the environment ([`ConnectArgs::from_env`]). `address` is `host:port` or a full
/// `http://`/`https://` URI.
pub async fn connect(address: &str) -> anyhow::Result<Client> {
    ConnectArgs::from_env().connect(address).await
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
    fn a_tls_setting_makes_a_bare_address_https_and_refuses_plaintext() {
        let plain = ConnectArgs::default();
        assert_eq!(plain.endpoint_uri("h:1").unwrap(), "http://h:1");
        assert_eq!(plain.endpoint_uri("https://h:1").unwrap(), "https://h:1");
        let tls = ConnectArgs {
            tls_ca: Some(PathBuf::from("ca.pem")),
            ..Default::default()
        };
        assert_eq!(tls.endpoint_uri("h:1").unwrap(), "https://h:1");
        assert_eq!(tls.endpoint_uri("https://h:1").unwrap(), "https://h:1");
        let message = tls.endpoint_uri("http://h:1").unwrap_err().to_string();
        assert!(message.contains("http://h:1 is plaintext"), "{message}");
        let message = plain.tls_config("https://h:1").unwrap_err().to_string();
        assert!(
            message.contains("give --tls-ca (or set LATHE_CA_CERT)"),
            "{message}"
        );
    }

    #[test]
    fn an_empty_api_key_sends_none_and_a_bad_one_is_named() {
        let none = ConnectArgs {
            api_key: Some(String::new()),
            ..Default::default()
        };
        assert!(none.api_key().unwrap().0.is_none());
        let some = ConnectArgs {
            api_key: Some("k".into()),
            ..Default::default()
        };
        assert_eq!(some.api_key().unwrap().0.unwrap(), "Bearer k");
        let bad = ConnectArgs {
            api_key: Some("line\nbreak".into()),
            ..Default::default()
        };
        let message = bad.api_key().err().unwrap().to_string();
        assert!(message.contains("--api-key or LATHE_API_KEY"), "{message}");
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
