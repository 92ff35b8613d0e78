//! `lathe-replicas`: what replication over NATS JetStream costs and buys, measured on real
//! processes on loopback: a `nats-server -js` and `lathe serve` replicas (children of this tool).
//!
//! 1. **Build**: the dataset (`docs.jsonl`, `--copies` times, each copy's text prefixed with
//!    "Copy k." so that every copy is a new version) is uploaded through replica 0.
//! 2. **Bootstrap**: replicas 1..N start with empty data dirs; time from spawn until each reports
//!    SERVING (caught up), and the catch-up rate in log entries, sections and MB of log per second.
//! 3. **Read throughput**: `--clients` concurrent clients spread round-robin over the first 1, 2,
//!    …, N replicas for `--seconds` each; every request is a result-cache miss (each pass over the
//!    questions raises the budget by one token); QPS and latency percentiles.
//! 4. **Write latency**: `--writes` single-document upserts acknowledged by JetStream (no `wait`),
//!    the same with `wait` (visible on the replica that took it), and, as the baseline, the same
//!    writes with `wait` on a single-node server (no replication) started beside them.
//! 5. **Replication lag** under a sustained write load: one writer upserting batches of 8
//!    documents without `wait` for `--seconds` on replica 0 while the other replicas' lag
//!    (`lathe_replication_lag_seconds`) and distance to the log head (the writer's latest token
//!    minus their applied position) are sampled every 250 ms; then the time they take to catch up
//!    once the writer stops.
//!
//! 6. **Ingest scaling** (`--ingest`, instead of the above): `--replicas` replicas start empty and
//!    ready, the corpus is upserted through replica 0 without `wait`, `--ingest-batch` documents a
//!    call (queued in the work stream; any replica's index worker embeds each write), and the
//!    clock stops once every replica has applied every write: MB of text per second, and CPU
//!    seconds per MB of every process (replicas and nats-server). See `ingest`.
//!
//! Example: `lathe-replicas --dataset ../shared/eval/squad-a --replicas 3 --clients 8 --seconds 20`

mod ingest;
mod measure;
mod processes;
mod report;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use lathe_tools::eval::Dataset;

use crate::measure::{build, read_load, write_latencies, write_load, ReadLoad};
use crate::processes::{nats_binary, NatsProcess, Replica, Spawner};
use crate::report::Report;

#[derive(Parser, Debug)]
#[command(
    name = "lathe-replicas",
    about = "Replication benchmark: bootstrap, reads, writes, lag"
)]
pub(crate) struct Args {
    /// Folder with docs.jsonl and queries.jsonl.
    #[arg(long)]
    pub(crate) dataset: PathBuf,
    /// The dataset's documents are uploaded this many times (copies k > 0 under new ids).
    #[arg(long, default_value_t = 1)]
    pub(crate) copies: usize,
    #[arg(long, default_value = "target/release/lathe")]
    pub(crate) lathe: PathBuf,
    /// nats-server binary (default: on the PATH, else /usr/sbin/nats-server).
    #[arg(long)]
    pub(crate) nats_server: Option<PathBuf>,
    #[arg(long, default_value = "./models")]
    pub(crate) models_dir: PathBuf,
    /// models.dense of every server.
    #[arg(long, default_value = "static")]
    pub(crate) dense: String,
    #[arg(long, default_value_t = 3)]
    pub(crate) replicas: usize,
    #[arg(long, default_value_t = 8)]
    pub(crate) clients: usize,
    /// Seconds per read run and of the write load.
    #[arg(long, default_value_t = 20)]
    pub(crate) seconds: u64,
    /// Single-document upserts per write-latency run.
    #[arg(long, default_value_t = 200)]
    pub(crate) writes: usize,
    #[arg(long, default_value_t = 1024)]
    pub(crate) budget: u32,
    /// Measure the build and the bootstraps only (no reads, writes or lag).
    #[arg(long)]
    pub(crate) bootstrap_only: bool,
    /// Measure ingest scaling only (see the module doc, 6).
    #[arg(long)]
    pub(crate) ingest: bool,
    /// With `--ingest`: replica i is kept to CPU i (modulo the CPUs there are).
    #[arg(long)]
    pub(crate) pin: bool,
    /// Documents per upsert of `--ingest`.
    #[arg(long, default_value_t = 2)]
    pub(crate) ingest_batch: usize,
    /// Where the report (results.md) is written.
    #[arg(long, default_value = "bench-out/replicas")]
    pub(crate) out: PathBuf,
}

pub(crate) const COLLECTION: &str = "bench";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work = tempfile::tempdir().context("a work folder")?;
    let dataset = Dataset::load(&args.dataset)?;
    let mut report = Report::default();
    let nats = NatsProcess::start(&nats_binary(&args)?, work.path())?;
    let spawner = Spawner {
        lathe: args.lathe.clone(),
        models_dir: args.models_dir.clone(),
        dense: args.dense.clone(),
    };
    if args.ingest {
        let run = ingest::ingest_scaling(&args, &dataset, &spawner, &nats, work.path()).await?;
        let text = format!(
            "| replicas | documents | MB of text | seconds | MB/s | CPU s per MB |\n|---|---|---|---|---|---|\n{}\n",
            run.render()
        );
        println!("{text}");
        std::fs::create_dir_all(&args.out)?;
        std::fs::write(args.out.join("ingest.md"), text)?;
        return Ok(());
    }
    let mut replicas = vec![
        spawner
            .replica(&work.path().join("r0"), Some(&nats.url))
            .await?,
    ];
    replicas[0].until_ready(Duration::from_secs(600)).await?;
    build(&args, &dataset, &mut replicas[0], &mut report).await?;
    report.stream = nats.stream_state().await?;
    for i in 1..args.replicas {
        let replica = spawner
            .replica(&work.path().join(format!("r{i}")), Some(&nats.url))
            .await?;
        let started = replica.spawned_at();
        replica.until_ready(Duration::from_secs(3600)).await?;
        report.bootstraps.push(started.elapsed());
        replicas.push(replica);
    }
    if !args.bootstrap_only {
        measure_load(
            &args,
            &dataset,
            &spawner,
            work.path(),
            &mut replicas,
            &mut report,
        )
        .await?;
    }
    let text = report.render(&args);
    println!("{text}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("results.md"), text)?;
    Ok(())
}

/// Reads over 1..=N replicas, write latencies, and the lag under sustained writes.
async fn measure_load(
    args: &Args,
    dataset: &Dataset,
    spawner: &Spawner,
    work: &Path,
    replicas: &mut [Replica],
    report: &mut Report,
) -> anyhow::Result<()> {
    // Shared by the runs, so that no run asks a (question, budget) pair an earlier one asked.
    let asked = Arc::new(AtomicU64::new(0));
    for n in 1..=replicas.len() {
        let addresses: Vec<String> = replicas[..n]
            .iter()
            .map(|r| r.address().to_string())
            .collect();
        let load = ReadLoad {
            dataset,
            clients: args.clients,
            seconds: args.seconds,
            budget: args.budget,
            asked: Arc::clone(&asked),
        };
        report.reads.push((n, read_load(&addresses, load).await?));
    }
    write_latencies(args, spawner, work, &mut replicas[0], report).await?;
    report.lag = write_load(args, replicas).await?;
    Ok(())
}
