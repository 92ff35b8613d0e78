//! `lathe replicas reseed` and `lathe replicas start-over`: an operator's recovery of a lost
//! write log (README, "Replicas"), through `RecoverLog` on one replica. A re-seed makes the new
//! log from that replica's data; a start over leaves it empty. Either way every replica whose data
//! came from the lost log then drops it and applies the new log from its start; this waits until
//! the replica asked is SERVING again (`--no-wait`: return at once).

use std::time::{Duration, Instant};

use anyhow::Context;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::proto;

#[derive(clap::Args, Debug)]
pub struct ReplicasArgs {
    #[command(subcommand)]
    pub action: ReplicasAction,
    /// The replica asked: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, global = true, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// The stream's name (`replication.stream`), to confirm: the log of every replica is replaced.
    #[arg(long, global = true, default_value = "")]
    pub stream: String,
    /// Return once the new log is written, without waiting for the replica to serve it.
    #[arg(long, global = true)]
    pub no_wait: bool,
    /// Longest wait for the replica to be SERVING again, in seconds.
    #[arg(long, global = true, default_value_t = 600)]
    pub wait_seconds: u64,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

#[derive(clap::Subcommand, Debug, Clone, Copy)]
pub enum ReplicasAction {
    /// Make a new log from this replica's data (every collection, document and alias; nothing is
    /// embedded again); every replica then converges to it.
    Reseed,
    /// Make a new, empty log; every replica then drops what the lost log made on it.
    StartOver,
}

pub async fn replicas(args: ReplicasArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.stream.is_empty(),
        "--stream must name the stream (replication.stream, `LATHE` by default) to confirm: the log of every replica is replaced"
    );
    let recovery = match args.action {
        ReplicasAction::Reseed => proto::Recovery::Reseed,
        ReplicasAction::StartOver => proto::Recovery::StartOver,
    };
    let mut client = args.connect.connect(&args.addr).await?;
    let started = Instant::now();
    let recovered = client
        .recover_log(proto::RecoverLogRequest {
            recovery: recovery.into(),
            confirm_stream: args.stream.clone(),
        })
        .await?
        .into_inner();
    println!(
        "new log {} at position {}: {} collections, {} documents, {} aliases ({:.1} s)",
        recovered.incarnation,
        recovered.log_position,
        recovered.collections,
        recovered.documents,
        recovered.aliases,
        started.elapsed().as_secs_f64()
    );
    for skipped in &recovered.skipped {
        eprintln!("not in the new log (could not be read here): {skipped}");
    }
    if args.no_wait {
        return Ok(());
    }
    let channel = args.connect.channel(&args.addr).await?;
    let mut health = HealthClient::with_interceptor(channel, args.connect.api_key()?);
    let limit = Duration::from_secs(args.wait_seconds);
    loop {
        let status = health
            .check(HealthCheckRequest {
                service: super::health::LATHE_SERVICE.to_string(),
            })
            .await
            .context("checking the replica's health")?
            .into_inner()
            .status;
        if status == ServingStatus::Serving as i32 {
            println!(
                "{} serves the new log ({:.1} s)",
                args.addr,
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "{} is not SERVING the new log after {} s",
            args.addr,
            args.wait_seconds
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
