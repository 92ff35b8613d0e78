//! The client side, shared by `lathe ingest`/`query`/`eval`, `lathe-load` and the integration
//! tests: connecting a tonic client, parsing the names a user types for proto enums, and a real
//! Lathe server run in this process on a port-0 loopback listener ("start a server here unless
//! `--addr` names one"). Requests to the in-process server still go through tonic, HTTP/2 and the
//! loopback interface. Nothing here knows the service: it speaks only the gRPC API.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::api::proto;
use crate::api::proto::lathe_client::LatheClient;
use crate::config::Config;
use crate::types::Strategy;

/// The largest message a client sends or accepts by default: the server's default limit.
pub const DEFAULT_CLIENT_MESSAGE_BYTES: usize = 64 << 20;

/// How long a started server may take to answer its first call (it loads models and opens every
/// collection before it serves).
const SERVER_START_LIMIT: Duration = Duration::from_secs(60);

/// Connects a gRPC client with messages as large as the server's default limit.
pub async fn connect(address: &str) -> anyhow::Result<LatheClient<Channel>> {
    connect_with_message_limit(address, DEFAULT_CLIENT_MESSAGE_BYTES).await
}

/// Connects a gRPC client that sends and accepts messages up to `message_bytes`. `address` is
/// `host:port` (plaintext) or a full `http://`/`https://` URI.
pub async fn connect_with_message_limit(
    address: &str,
    message_bytes: usize,
) -> anyhow::Result<LatheClient<Channel>> {
    let endpoint = if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .with_context(|| format!("invalid address {endpoint}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok(LatheClient::new(channel)
        .max_decoding_message_size(message_bytes)
        .max_encoding_message_size(message_bytes))
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
    Ok(crate::api::convert::strategy_to_proto(strategy))
}

/// Streams `documents` to `collection` in messages of `batch` documents (at least one) with
/// `wait`, so the answer comes once all of them are searchable: one call, whatever the corpus size
/// (a unary upsert of a whole corpus would outlast its deadline).
pub async fn upload_in_batches(
    client: &mut LatheClient<Channel>,
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

/// A real Lathe server running in this process on a port-0 loopback listener.
pub struct InProcessServer {
    address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<crate::error::Result<()>>>,
    // Removed on drop, after the server has stopped; `None` when the caller owns the data folder.
    _temporary_data_dir: Option<tempfile::TempDir>,
}

impl InProcessServer {
    /// Starts a server with `config` (its listen address is ignored: the server binds a loopback
    /// port) without waiting for it to serve: for servers a plaintext, key-less call cannot reach
    /// (TLS, API keys).
    pub async fn spawn(config: Config) -> anyhow::Result<Self> {
        Self::spawn_in(config, None).await
    }

    /// Starts a server with `config` and waits until a plaintext, key-less call is answered.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        let server = Self::spawn(config).await?;
        server.wait_until_serving().await?;
        Ok(server)
    }

    /// Starts a server with the default configuration, models from `models_dir`, `cpu_threads`
    /// pool threads (0: one per core) and a temporary data folder removed when it stops, and
    /// waits until it answers: what `lathe eval` and `lathe-load` run without `--addr`.
    pub async fn start_temporary(models_dir: &Path, cpu_threads: usize) -> anyhow::Result<Self> {
        let tokenizer = models_dir.join("minilm/tokenizer.json");
        if !tokenizer.exists() {
            anyhow::bail!(
                "models missing: {} not found; pass --models-dir or run scripts/fetch-models.sh",
                tokenizer.display()
            );
        }
        let data_dir = tempfile::Builder::new()
            .prefix("lathe-eval-")
            .tempdir()
            .context("creating a temporary data folder")?;
        let mut config = Config::default();
        config.storage.data_dir = data_dir.path().to_path_buf();
        config.models.dir = models_dir.to_path_buf();
        config.server.cpu_threads = cpu_threads;
        let server = Self::spawn_in(config, Some(data_dir)).await?;
        server.wait_until_serving().await?;
        Ok(server)
    }

    async fn spawn_in(
        config: Config,
        temporary_data_dir: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        let address = listener.local_addr().context("reading the bound address")?;
        let (shutdown, shutdown_received) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::api::serve(config, listener, async move {
            let _ = shutdown_received.await;
        }));
        Ok(Self {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
            _temporary_data_dir: temporary_data_dir,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `host:port`, as `connect` takes it.
    pub fn addr(&self) -> String {
        self.address.to_string()
    }

    /// Waits until a plaintext, key-less ListCollections succeeds; fails at once when the server
    /// has stopped (it could not open), or after a minute.
    async fn wait_until_serving(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + SERVER_START_LIMIT;
        loop {
            if let Ok(mut client) = connect(&self.addr()).await {
                if client
                    .list_collections(proto::ListCollectionsRequest {})
                    .await
                    .is_ok()
                {
                    return Ok(());
                }
            }
            if self.task.as_ref().is_some_and(|task| task.is_finished()) {
                anyhow::bail!("the in-process server stopped before it served");
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the in-process server did not answer within {} s",
                    SERVER_START_LIMIT.as_secs()
                );
            }
            // Polling: the server has no "serving" signal a client in this process could await.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Graceful stop: drain, commit, close; then a temporary data folder is removed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .context("server task panicked")?
                .context("server stopped with an error")?;
        }
        Ok(())
    }
}

/// The server a tool talks to: the one `--addr` names, or one started in this process.
pub struct TargetServer {
    /// `host:port` or a URI, as `connect` takes it.
    pub address: String,
    in_process: Option<InProcessServer>,
}

impl TargetServer {
    /// Uses `address_opt` when given; otherwise starts a server in this process (see
    /// [`InProcessServer::start_temporary`]).
    pub async fn given_or_started(
        address_opt: Option<&str>,
        models_dir: &Path,
        cpu_threads: usize,
    ) -> anyhow::Result<Self> {
        if let Some(address) = address_opt {
            return Ok(Self {
                address: address.to_string(),
                in_process: None,
            });
        }
        eprintln!("starting an in-process server on a loopback port");
        let server = InProcessServer::start_temporary(models_dir, cpu_threads).await?;
        Ok(Self {
            address: server.addr(),
            in_process: Some(server),
        })
    }

    pub fn is_in_process(&self) -> bool {
        self.in_process.is_some()
    }

    /// Stops the in-process server, if there is one; a given server keeps running.
    pub async fn stop(self) -> anyhow::Result<()> {
        match self.in_process {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }
}

/// The command that runs the `lathe` binary at `binary` as a server of its own, as the benchmark
/// programs start one: a port-0 loopback listener, JSON logs on stderr (piped: the listening
/// address is read from there), stdout dropped, its models from `models_dir`, its data in
/// `data_dir`, `models.dense = dense`. Callers add their own `LATHE_*` settings before spawning.
pub fn serve_command(binary: &Path, models_dir: &Path, data_dir: &Path, dense: &str) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--models-dir")
        .arg(models_dir)
        .arg("--data-dir")
        .arg(data_dir)
        .env("LATHE_MODELS__DENSE", dense)
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    command
}

#[cfg(test)]
mod tests {
    use super::*;

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
