//! `lathe health`: the server's gRPC health check (`grpc.health.v1.Health/Check`) for the
//! Lathe service, printed as its status name; the exit code is 0 only for SERVING, so a probe, a
//! script or a Job can wait on it.

use std::time::Duration;

use anyhow::Context;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The service whose health `lathe health` asks by default: the API itself, which turns SERVING
/// once indexes and models are loaded and NOT_SERVING when the server drains.
pub const LATHE_SERVICE: &str = "lathe.v1.Lathe";

#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    /// The server: `host:port`, or an `http://` or `https://` URI (its gRPC port, or its
    /// plaintext health port, `server.health_listen`).
    #[arg(long, visible_alias = "address", default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// The service to ask about; "" asks about the process as a whole (SERVING as soon as it
    /// listens).
    #[arg(long, default_value = LATHE_SERVICE)]
    pub service: String,
    /// Give up after this many seconds (connecting included), exiting non-zero.
    #[arg(long, default_value_t = 5.0)]
    pub timeout_seconds: f64,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

/// Prints the status (`SERVING`, `NOT_SERVING`, …) on stdout; anything but SERVING is an error,
/// so the process exits non-zero.
pub async fn health(args: HealthArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.timeout_seconds > 0.0 && args.timeout_seconds.is_finite(),
        "--timeout-seconds must be above 0"
    );
    let timeout = Duration::from_secs_f64(args.timeout_seconds);
    let status = tokio::time::timeout(timeout, check(&args))
        .await
        .with_context(|| {
            format!(
                "no answer from {} within {} s",
                args.addr, args.timeout_seconds
            )
        })??;
    let name = status.as_str_name();
    println!("{name}");
    anyhow::ensure!(
        status == ServingStatus::Serving,
        "{} is {name}",
        service_label(&args.service)
    );
    Ok(())
}

/// One Check call: the status the server reports for `args.service`.
async fn check(args: &HealthArgs) -> anyhow::Result<ServingStatus> {
    let channel = args.connect.channel(&args.addr).await?;
    let mut client = HealthClient::with_interceptor(channel, args.connect.api_key()?);
    let response = client
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await
        .with_context(|| format!("checking the health of {}", service_label(&args.service)))?
        .into_inner();
    ServingStatus::try_from(response.status)
        .with_context(|| format!("an unknown serving status {}", response.status))
}

/// `lathe.v1.Lathe`, or `the server` for "".
fn service_label(service: &str) -> &str {
    if service.is_empty() {
        "the server"
    } else {
        service
    }
}
