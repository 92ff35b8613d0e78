//! The gRPC edge: generated proto types, conversions, the status mapping, thin handlers, the
//! server with health and reflection, and the HTTP/JSON API through the same handlers (`http`).
//! Proto types and tonic stay in this module.

mod auth;
mod call;
pub mod convert;
mod deadline;
mod grpc;
mod health;
mod http;
mod in_process;
pub(crate) mod incoming;
mod reload;
mod snapshots;
mod status;
mod tls;
mod upload;

pub use in_process::InProcessServer;

/// The generated `lathe.v1` API, shared with the tools (crate `lathe-proto`).
pub use lathe_proto as proto;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::Server;

use crate::config::Config;
use crate::error::{LatheError, Result};
use crate::service::Engine;
use crate::telemetry::Metrics;
use grpc::GrpcAdapter;
use proto::lathe_server::LatheServer;

/// The Lathe gRPC service as served: the adapter over the engine.
type LatheService = LatheServer<GrpcAdapter>;

/// Serves Lathe on `listener` until `shutdown` resolves, then drains in-flight requests for up to
/// `server.drain_timeout_ms`, commits every collection and returns.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let http_listener = match config.server.http_listen.as_str() {
        "" => None,
        address => Some(
            TcpListener::bind(address)
                .await
                .map_err(|e| LatheError::io(format!("binding server.http_listen {address}"), e))?,
        ),
    };
    serve_with_http(config, listener, http_listener, shutdown).await
}

/// [`serve`], with the HTTP/JSON API on `http_listener` when given (already bound, as the
/// in-process server binds a port-0 one).
pub(crate) async fn serve_with_http(
    config: Config,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // The health service is up before the engine: "" (the process) answers SERVING at once, and
    // lathe.v1.Lathe NOT_SERVING until indexes and models are loaded.
    let (health_reporter, health_service, replica_readiness) = health::health();
    health_reporter.set_not_serving::<LatheService>().await;
    // Stops the side servers (health, metrics); dropping it on an early return stops them too.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if !config.server.health_listen.is_empty() {
        spawn_health_server(
            &config.server.health_listen,
            health_service.clone(),
            stop_rx.clone(),
        )
        .await?;
    }

    let metrics = Arc::new(Metrics::new());
    let engine = open_engine(&config, &metrics).await?;
    incoming::check_open_file_room(config.server.max_concurrent_requests);
    engine.start_writes();
    engine.start_replication().await?;
    let adapter = Arc::new(grpc_adapter(&config, &engine, &metrics, &stop_rx)?);
    let lathe = LatheServer::from_arc(Arc::clone(&adapter))
        .max_decoding_message_size(config.limits.max_message_bytes)
        .max_encoding_message_size(config.limits.max_message_bytes);
    // Reflection v1, and v1alpha for the clients that only speak it (Python's grpcio-reflection,
    // grpcurl before 1.8.8, several GUIs): the same descriptors behind both.
    let reflection_error = |e| LatheError::internal(format!("building reflection: {e}"));
    let reflection = reflection_builder().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(reflection_error)?;
    if !config.server.metrics_listen.is_empty() {
        spawn_metrics_server(
            &config.server.metrics_listen,
            (Arc::clone(&engine), Arc::clone(&metrics)),
            health::checker(&health_reporter, &replica_readiness),
            stop_rx.clone(),
        )
        .await?;
    }

    // Read (and checked) before serving: a bad file fails the start, a bad renewal is ignored.
    let reload = Duration::from_millis(config.server.reload_interval_ms);
    let grpc_tls = match config.tls.enabled() {
        true => Some(tls::reloading(&config.tls, b"h2", reload, stop_rx.clone())?),
        false => None,
    };
    let http_tls = match (config.tls.enabled(), &http_listener) {
        (true, Some(_)) => Some(tls::reloading(
            &config.tls,
            b"http/1.1",
            reload,
            stop_rx.clone(),
        )?),
        _ => None,
    };
    // Set when the drain starts: from then on health stays NOT_SERVING.
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    health::report_ready(&engine, &health_reporter, &draining, &replica_readiness).await;
    let address = listener
        .local_addr()
        .map_err(|e| LatheError::io("reading the listen address", e))?;
    tracing::info!(%address, tls = config.tls.enabled(), data_dir = %config.storage.data_dir.display(), "lathe serving");

    let drain = Duration::from_millis(config.server.drain_timeout_ms);
    let (signal, drain_deadline) =
        drain_signals(shutdown, health_reporter.clone(), draining, drain);
    // The HTTP port drains with the gRPC port: it stops accepting when the drain starts, and its
    // requests in flight are waited for with the gRPC ones.
    let (http_stop_tx, http_stop_rx) = tokio::sync::watch::channel(false);
    let signal = async move {
        signal.await;
        let _ = http_stop_tx.send(true);
    };
    let http_server = match http_listener {
        None => None,
        Some(http_listener) => {
            let health = health::checker(&health_reporter, &replica_readiness);
            let api = http::HttpApi {
                adapter,
                health,
                max_message_bytes: config.limits.max_message_bytes,
            };
            Some(http::spawn(http_listener, api, http_tls, http_stop_rx)?)
        }
    };
    // No server-wide timeout: tonic's would cut long client-streaming uploads and answer
    // CANCELLED. Unary calls get `server.request_timeout_ms` (or the client's shorter
    // grpc-timeout) in the adapter; a client's grpc-timeout on any call is answered with
    // DEADLINE_EXCEEDED by `deadline::ClientDeadlineLayer`.
    let router = Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            status::rewrite_oversized_response,
        ))
        .layer(deadline::ClientDeadlineLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(lathe);
    // Our own accept loops: TCP_NODELAY on every socket (`serve_with_incoming` ignores
    // `Server::tcp_nodelay`), a pause instead of a busy loop when the process is out of file
    // descriptors (see `incoming`), and TLS from the files as they are now (see `tls`).
    let server: std::pin::Pin<Box<dyn Future<Output = _> + Send>> = match grpc_tls {
        None => Box::pin(router.serve_with_incoming_shutdown(
            incoming::BackoffIncoming::new(listener, "main"),
            signal,
        )),
        Some(tls) => Box::pin(router.serve_with_incoming_shutdown(
            tls::TlsListener::new(listener, tls).into_incoming(),
            signal,
        )),
    };
    let served = async move {
        let result = server.await;
        if let Some(http_server) = http_server {
            let _ = http_server.await;
        }
        result
    };
    tokio::select! {
        result = served => result.map_err(|e| LatheError::internal(format!("server error: {e}")))?,
        () = drain_deadline => tracing::warn!(drain_ms = drain.as_millis() as u64, "drain time over, closing with requests in flight"),
    }
    health_reporter.set_not_serving::<LatheService>().await;
    let _ = stop_tx.send(true);
    engine.stop_replication().await;
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(|e| LatheError::internal(format!("closing collections: {e}")))?;
    tracing::info!("lathe stopped");
    Ok(())
}

/// Opens the engine (data-dir lock, models, every collection) off the async threads.
async fn open_engine(config: &Config, metrics: &Arc<Metrics>) -> Result<Arc<Engine>> {
    let engine = tokio::task::spawn_blocking({
        let config = config.clone();
        let metrics = Arc::clone(metrics);
        move || Engine::open(config, metrics)
    })
    .await
    .map_err(|e| LatheError::internal(format!("opening the engine: {e}")))??;
    Ok(Arc::new(engine))
}

/// The handlers over `engine`, shared by the gRPC and HTTP ports: API keys, the concurrency
/// limit and deadlines of `config`.
fn grpc_adapter(
    config: &Config,
    engine: &Arc<Engine>,
    metrics: &Arc<Metrics>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<GrpcAdapter> {
    let keys = match config.auth.api_keys_file.as_str() {
        "" => None,
        path => {
            let path = std::path::PathBuf::from(path);
            let interval = Duration::from_millis(config.server.reload_interval_ms);
            let files = vec![path.clone()];
            let load = move || auth::ApiKeys::load(&path);
            Some(reload::watch_files(
                "auth.api_keys_file",
                files,
                interval,
                stop.clone(),
                load,
            )?)
        }
    };
    Ok(GrpcAdapter::new(
        Arc::clone(engine),
        config.server.max_concurrent_requests,
        keys,
        Arc::clone(metrics),
        Duration::from_millis(config.server.request_timeout_ms),
    ))
}

/// The signal the server drains on (`shutdown`, after which health says NOT_SERVING, so probes
/// on the still-open health port see the drain) and a future that resolves `drain` after it.
fn drain_signals(
    shutdown: impl Future<Output = ()> + Send + 'static,
    health_reporter: tonic_health::server::HealthReporter,
    draining: Arc<std::sync::atomic::AtomicBool>,
    drain: Duration,
) -> (
    impl Future<Output = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
) {
    let (drain_started_tx, drain_started_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutdown requested, draining in-flight requests");
        draining.store(true, std::sync::atomic::Ordering::SeqCst);
        health_reporter.set_not_serving::<LatheService>().await;
        let _ = drain_started_tx.send(());
    };
    let drain_deadline = async move {
        if drain_started_rx.await.is_ok() {
            tokio::time::sleep(drain).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    (signal, drain_deadline)
}

/// Serves only `grpc.health.v1.Health`, in plaintext, on its own port: the kubelet's gRPC probe
/// cannot speak TLS. It shares the main server's reporter, so it reports the same statuses.
async fn spawn_health_server(
    address: &str,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| LatheError::io(format!("binding server.health_listen {address}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| LatheError::io("reading the health listen address", e))?;
    tracing::info!(health_address = %bound, "health serving (plaintext)");
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        if let Err(error) = Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                incoming::BackoffIncoming::new(listener, "health"),
                stopped,
            )
            .await
        {
            tracing::error!(%error, "health server failed");
        }
    });
    Ok(())
}

/// Serves `GET /metrics` in the Prometheus text format on its own port.
async fn spawn_metrics_server(
    address: &str,
    (engine, metrics): (Arc<Engine>, Arc<Metrics>),
    health: health::ReadinessHealth,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let health = Arc::new(health);
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| LatheError::io(format!("binding server.metrics_listen {address}"), e))?;
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let engine = Arc::clone(&engine);
            let metrics = Arc::clone(&metrics);
            let health = Arc::clone(&health);
            async move {
                metrics.serving.set(i64::from(health.lathe_serving().await));
                // Collection sizes are read at scrape time; a failed read leaves the last value.
                tokio::task::spawn_blocking(move || {
                    engine.record_collection_metrics();
                    metrics.render()
                })
                .await
                .unwrap_or_default()
            }
        }),
    );
    // The bound address (a port of 0 in the config is chosen here).
    let bound = listener
        .local_addr()
        .map_or_else(|_| address.to_string(), |bound| bound.to_string());
    tracing::info!(address = %bound, "metrics serving");
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(%error, "metrics server failed");
        }
    });
    Ok(())
}

/// The reflection service's descriptors: the API and health.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
