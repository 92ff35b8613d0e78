//! A real Lathe gRPC server in this process, on a port-0 loopback listener with a temporary data
//! folder: what `lathe eval` and `lathe-load` use when no `--addr` is given. Requests still go
//! through tonic, HTTP/2 and the loopback interface.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::api::proto;
use crate::api::proto::lathe_client::LatheClient;
use crate::config::Config;

pub struct InProcessServer {
    pub address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<crate::error::Result<()>>>,
    // Removed on drop, after the server has stopped.
    _data_dir: tempfile::TempDir,
}

impl InProcessServer {
    /// Starts the server with the default configuration, models from `models_dir` and
    /// `cpu_threads` pool threads (0: one per core), and waits until it answers.
    pub async fn start(models_dir: &Path, cpu_threads: usize) -> anyhow::Result<Self> {
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        let address = listener.local_addr().context("reading the bound address")?;
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::api::serve(config, listener, async move {
            let _ = shutdown_rx.await;
        }));
        let server = Self {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
            _data_dir: data_dir,
        };
        server.wait_until_serving().await?;
        Ok(server)
    }

    pub fn addr(&self) -> String {
        self.address.to_string()
    }

    async fn wait_until_serving(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut client) = connect_plain(&self.addr()).await {
                if client
                    .list_collections(proto::ListCollectionsRequest {})
                    .await
                    .is_ok()
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!("the in-process server did not answer within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Graceful stop: drain, commit, close; then the data folder is removed.
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

async fn connect_plain(address: &str) -> anyhow::Result<LatheClient<Channel>> {
    crate::cli::connect(address).await
}
