//! A real Lathe server run in this process on a port-0 loopback listener, for the integration
//! tests: requests still go through tonic, HTTP/2 and the loopback interface. The tools start the
//! `lathe` binary instead (`lathe_tools::server_process`), since they reach the server only over
//! gRPC.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::oneshot;

use super::proto;
use super::proto::lathe_client::LatheClient;
use crate::config::Config;

/// How long a started server may take to answer its first call (it loads models and opens every
/// collection before it serves).
const SERVER_START_LIMIT: Duration = Duration::from_secs(60);

/// A real Lathe server running in this process on a port-0 loopback listener.
pub struct InProcessServer {
    address: SocketAddr,
    http_address: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<crate::error::Result<()>>>,
}

impl InProcessServer {
    /// Starts a server with `config` (its listen addresses are ignored: the server binds a
    /// loopback port, and another for the HTTP/JSON API when `server.http_listen` is set) without
    /// waiting for it to serve: for servers a plaintext, key-less call cannot reach
    /// (TLS, API keys).
    pub async fn spawn(config: Config) -> anyhow::Result<Self> {
        Self::spawn_in(config).await
    }

    /// Starts a server with `config` and waits until a plaintext, key-less call is answered.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        let server = Self::spawn(config).await?;
        server.wait_until_serving().await?;
        Ok(server)
    }

    async fn spawn_in(config: Config) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        let address = listener.local_addr().context("reading the bound address")?;
        let http_listener = match config.server.http_listen.as_str() {
            "" => None,
            _ => Some(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .context("binding a loopback port for HTTP")?,
            ),
        };
        let http_address = match &http_listener {
            None => None,
            Some(listener) => Some(listener.local_addr().context("reading the HTTP address")?),
        };
        let (shutdown, shutdown_received) = oneshot::channel::<()>();
        let shutdown_signal = async move {
            let _ = shutdown_received.await;
        };
        let task = tokio::spawn(super::serve_with_http(
            config,
            listener,
            http_listener,
            shutdown_signal,
        ));
        Ok(Self {
            address,
            http_address,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The HTTP/JSON API's address, when `server.http_listen` was set.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http_address
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
            if let Ok(mut client) = LatheClient::connect(format!("http://{}", self.address)).await {
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

    /// Graceful stop: drain, commit, close.
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
