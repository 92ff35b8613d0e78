//! `--ingest`: how ingest throughput grows with replicas. Every replica starts empty and ready;
//! the corpus is upserted through replica 0 without `wait`, `--ingest-batch` documents a call (a
//! write is queued in the work stream and embedded by whichever replica's index worker takes it);
//! the clock stops once every replica answers a Retrieve carrying the last write's token (every
//! write applied everywhere). Reported: MB of document text per second, and the CPU seconds of
//! every process (the replicas and nats-server) per MB. With `--pin`, replica i is kept to CPU
//! i (modulo the CPUs): a core per replica, as replicas on machines of their own would have.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use lathe_tools::eval::Dataset;
use lathe_tools::proc_status::cpu_seconds;
use lathe_tools::proto;

use crate::measure::{corpus, create, stats};
use crate::processes::{NatsProcess, Replica, Spawner};
use crate::{Args, COLLECTION};

pub(crate) struct IngestRun {
    pub(crate) replicas: usize,
    pub(crate) pinned: bool,
    pub(crate) documents: usize,
    pub(crate) text_bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) cpu_seconds: f64,
}

impl IngestRun {
    pub(crate) fn render(&self) -> String {
        let mb = self.text_bytes as f64 / 1e6;
        format!(
            "| {}{} | {} | {:.2} | {:.1} | {:.3} | {:.1} |",
            self.replicas,
            if self.pinned { ", a core each" } else { "" },
            self.documents,
            mb,
            self.seconds,
            mb / self.seconds,
            self.cpu_seconds / mb
        )
    }
}

pub(crate) async fn ingest_scaling(
    args: &Args,
    dataset: &Dataset,
    spawner: &Spawner,
    nats: &NatsProcess,
    work: &Path,
) -> anyhow::Result<IngestRun> {
    let mut replicas: Vec<Replica> = Vec::new();
    for i in 0..args.replicas {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let core = args.pin.then_some(i % cores);
        let replica = spawner
            .replica_on(&work.join(format!("r{i}")), Some(&nats.url), core)
            .await?;
        replica.until_ready(Duration::from_secs(600)).await?;
        replicas.push(replica);
    }
    create(&mut replicas[0].client).await?;
    let documents = corpus(dataset, args.copies);
    let (count, text_bytes) = (
        documents.len(),
        documents.iter().map(|d| d.text.len() as u64).sum(),
    );
    let mut pids: Vec<u32> = replicas.iter().map(Replica::pid).collect();
    pids.push(nats.pid());
    let cpu_before: f64 = pids
        .iter()
        .map(|&pid| cpu_seconds(pid))
        .sum::<anyhow::Result<f64>>()?;
    let started = Instant::now();
    let mut token = 0;
    let mut documents = documents.into_iter().peekable();
    while documents.peek().is_some() {
        let batch: Vec<proto::Document> =
            documents.by_ref().take(args.ingest_batch.max(1)).collect();
        let reply = replicas[0]
            .client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: COLLECTION.into(),
                documents: batch,
                wait: false,
                write_id: String::new(),
            })
            .await
            .context("upsert")?
            .into_inner();
        token = token.max(reply.consistency_token);
    }
    let acknowledged = started.elapsed();
    for replica in &mut replicas {
        replica
            .client
            .retrieve(proto::RetrieveRequest {
                collection: COLLECTION.into(),
                query: "the last write".into(),
                token_budget: 64,
                consistency_token: token,
                ..Default::default()
            })
            .await
            .context("a read at the last token")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after: f64 = pids
        .iter()
        .map(|&pid| cpu_seconds(pid))
        .sum::<anyhow::Result<f64>>()?;
    let stats = stats(&mut replicas[0].client).await?;
    anyhow::ensure!(
        stats.documents == count as u64,
        "{} documents applied of {count}",
        stats.documents
    );
    eprintln!(
        "{} replicas: {count} documents acknowledged in {:.2} s, applied everywhere in {seconds:.1} s",
        args.replicas,
        acknowledged.as_secs_f64()
    );
    Ok(IngestRun {
        replicas: args.replicas,
        pinned: args.pin,
        documents: count,
        text_bytes,
        seconds,
        cpu_seconds: cpu_after - cpu_before,
    })
}
