//! One run of the load (one row of the table): its clients, the writer and the sampler beside
//! them, and what they add up to.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use lathe_tools::client::connect;
use lathe_tools::eval::{percentile, Dataset};
use lathe_tools::proc_status::resident;
use lathe_tools::proto;

use crate::clients::{
    hot_questions, run_client, run_writer, warm_result_cache, ClientStats, ClientWork, Mode,
};
use crate::Args;

/// Latencies and writes of the current sampling interval, shared by the clients and the sampler.
#[derive(Default)]
pub(crate) struct Interval {
    pub(crate) latencies_us: std::sync::Mutex<Vec<u32>>,
    pub(crate) writes: AtomicU64,
}

async fn run_sampler(
    interval: Arc<Interval>,
    every: Duration,
    started: Instant,
    deadline: Instant,
    server_pid: Option<u32>,
) {
    println!("| t s | requests | p50 ms | p99 ms | max ms | writes | RSS MiB |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut next = started + every;
    while next <= deadline + Duration::from_millis(500) {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let mut latencies = std::mem::take(
            &mut *interval
                .latencies_us
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        latencies.sort_unstable();
        let ms = |p: f64| percentile(&latencies, p) as f64 / 1e3;
        println!(
            "| {:.0} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
            started.elapsed().as_secs_f64(),
            latencies.len(),
            ms(50.0),
            ms(99.0),
            latencies.last().map_or(0.0, |&us| us as f64 / 1e3),
            interval.writes.swap(0, Ordering::Relaxed),
            resident(server_pid).map_or("?".to_string(), |memory| format!("{:.0}", memory.total)),
        );
    }
}

pub(crate) struct RunReport {
    pub(crate) mode: Mode,
    pub(crate) clients: usize,
    pub(crate) writer: bool,
    pub(crate) seconds: f64,
    pub(crate) requests: u64,
    pub(crate) ok: u64,
    pub(crate) latencies_us: Vec<u32>,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) cache_hits: u64,
    pub(crate) stages_us: BTreeMap<String, Vec<u32>>,
    pub(crate) writes: u64,
    pub(crate) write_errors: u64,
}

/// What every run shares: the server, the collection, the dataset and its questions.
pub(crate) struct LoadTarget {
    pub(crate) address: String,
    /// The server's process when this tool started it (its memory is sampled).
    pub(crate) server_pid: Option<u32>,
    pub(crate) collection: Arc<str>,
    pub(crate) dataset: Arc<Dataset>,
    /// The dataset's distinct questions.
    pub(crate) questions: Arc<Vec<String>>,
    /// The next request of `miss` runs: one sequence across runs, so none repeats a request.
    pub(crate) miss_counter: Arc<AtomicU64>,
    pub(crate) args: Arc<Args>,
}

/// What one run (one row of the table) is.
#[derive(Clone, Copy)]
pub(crate) struct RunShape {
    pub(crate) mode: Mode,
    pub(crate) clients: usize,
    /// Whether a writer runs beside the clients.
    pub(crate) writer: bool,
    pub(crate) seconds: u64,
}

pub(crate) async fn run(target: &LoadTarget, shape: RunShape) -> anyhow::Result<RunReport> {
    let args = &target.args;
    let hot = Arc::new(hot_questions(args.hot_set, target.questions.len()));
    let mut connections = Vec::with_capacity(shape.clients);
    for _ in 0..shape.clients {
        connections.push(connect(&target.address).await?);
    }
    if shape.mode == Mode::Hit {
        warm_result_cache(&mut connections[0].clone(), target, &hot).await?;
    }
    let counter = match shape.mode {
        Mode::Miss => Arc::clone(&target.miss_counter),
        Mode::Hit | Mode::WarmUp => Arc::new(AtomicU64::new(0)),
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(shape.seconds);
    let interval = (args.sample_every > 0).then(|| Arc::new(Interval::default()));
    let sampler = interval.as_ref().map(|interval| {
        tokio::spawn(run_sampler(
            Arc::clone(interval),
            Duration::from_secs(args.sample_every),
            started,
            deadline,
            target.server_pid,
        ))
    });
    let writer_task = if shape.writer {
        let client = connect(&target.address).await?;
        Some(tokio::spawn(run_writer(
            client,
            Arc::clone(&target.collection),
            Arc::clone(&target.dataset),
            interval.clone(),
            deadline,
        )))
    } else {
        None
    };
    let work = ClientWork {
        mode: shape.mode,
        collection: Arc::clone(&target.collection),
        questions: Arc::clone(&target.questions),
        hot,
        first_request: counter.load(Ordering::Relaxed),
        counter,
        max_requests: args.max_requests,
        budget: args.budget,
        top_k: args.top_k,
        order: if args.order == "position" {
            proto::ResultOrder::Position
        } else {
            proto::ResultOrder::Score
        },
        interval,
        deadline,
        pace: (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate)),
    };
    let tasks: Vec<_> = connections
        .into_iter()
        .map(|client| tokio::spawn(run_client(client, work.clone())))
        .collect();
    let mut report = RunReport::empty(shape);
    for task in tasks {
        report.add(task.await.context("client task panicked")?);
    }
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(writer) = writer_task {
        let (writes, errors) = writer.await.context("writer task panicked")?;
        report.writes = writes;
        report.write_errors = errors;
    }
    if let Some(sampler) = sampler {
        sampler.await.context("sampler task panicked")?;
    }
    report.finish();
    Ok(report)
}

impl RunReport {
    fn empty(shape: RunShape) -> Self {
        Self {
            mode: shape.mode,
            clients: shape.clients,
            writer: shape.writer,
            seconds: 0.0,
            requests: 0,
            ok: 0,
            latencies_us: Vec::new(),
            errors: BTreeMap::new(),
            cache_hits: 0,
            stages_us: BTreeMap::new(),
            writes: 0,
            write_errors: 0,
        }
    }

    fn add(&mut self, stats: ClientStats) {
        self.latencies_us.extend(stats.latencies_us);
        self.cache_hits += stats.cache_hits;
        for (code, count) in stats.errors {
            *self.errors.entry(code).or_default() += count;
        }
        for (stage, micros) in stats.stages_us {
            self.stages_us.entry(stage).or_default().extend(micros);
        }
    }

    /// Counts the requests and sorts the latencies for the percentiles.
    fn finish(&mut self) {
        self.ok = self.latencies_us.len() as u64;
        self.requests = self.ok + self.errors.values().sum::<u64>();
        self.latencies_us.sort_unstable();
        for micros in self.stages_us.values_mut() {
            micros.sort_unstable();
        }
    }
}
