//! One size of the bench: its data dir built (or reused), measured on disk, opened after a clean
//! stop (memory, latency), opened after `kill -9`, and its dense recall measured by
//! `lathe dense-recall`; each step on a `lathe serve` of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use lathe_tools::client::{connect, serve_command};
use lathe_tools::proc_status::{cpu_seconds, resident};
use lathe_tools::server_process::{Patience, ServerProcess};

use crate::grpc::{build_collection, first_retrieve, measure_latency, write_one_more, QueryFeed};
use crate::report::SizeReport;
use crate::Args;
use lathe_tools::scale_corpus::{corpus_queries, SourceDocument};

/// How the bench starts servers: binary, models, dense model and search setting.
pub(crate) struct ServerCommand {
    pub(crate) binary: PathBuf,
    pub(crate) models_dir: PathBuf,
    pub(crate) dense: String,
    pub(crate) ef_search: Option<usize>,
}

/// A large collection takes long to open and to close: an hour for each.
const PATIENCE: Patience = Patience {
    serve: Duration::from_secs(3600),
    stop: Duration::from_secs(3600),
};

impl ServerCommand {
    /// Starts `lathe serve` on `data_dir` and waits until it serves.
    fn start(&self, data_dir: &Path) -> anyhow::Result<ServerProcess> {
        let mut command = serve_command(&self.binary, &self.models_dir, data_dir, &self.dense);
        if let Some(ef_search) = self.ef_search {
            command.env("LATHE_DENSE__EF_SEARCH", ef_search.to_string());
        }
        command
            .env("LATHE_LOG__FILTER", "info")
            // A build streams one long upload: the bench, not the server, bounds it.
            .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "3600000");
        ServerProcess::start(command, PATIENCE)
            .with_context(|| format!("starting {}", self.binary.display()))
    }
}

/// Everything a size's run needs besides its size.
pub(crate) struct Bench {
    pub(crate) args: Args,
    pub(crate) server: ServerCommand,
    pub(crate) corpus: Vec<SourceDocument>,
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) work_dir: PathBuf,
}

const COLLECTION: &str = "bench";

impl Bench {
    pub(crate) fn run_size(&self, target: usize) -> anyhow::Result<SizeReport> {
        let data_dir = self.work_dir.join(format!("size-{target}"));
        let build_record = self.work_dir.join(format!("size-{target}.build.json"));
        let per_run = self.args.queries * 2 + 4;
        let feed = Arc::new(QueryFeed {
            queries: corpus_queries(&self.corpus, per_run.max(self.args.recall_queries)),
            next: AtomicUsize::new(0),
        });
        let mut report = SizeReport {
            target_sections: target,
            ..SizeReport::default()
        };
        let reused = self.args.reuse && data_dir.exists() && build_record.exists();
        if reused {
            eprintln!("size {target}: reusing {}", data_dir.display());
            read_build_record(&build_record, &mut report)?;
        } else {
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir)
                    .with_context(|| format!("removing {}", data_dir.display()))?;
            }
            eprintln!("size {target}: building in {}", data_dir.display());
            self.build(&data_dir, target, &mut report)?;
            write_build_record(&build_record, &report)?;
        }
        report.disk_bytes = disk_bytes(&data_dir.join("collections"));
        eprintln!("size {target}: open after a clean stop, queries");
        self.open_and_query(&data_dir, &feed, &mut report)?;
        eprintln!("size {target}: open after kill -9");
        report.open_killed_seconds = self.open_after_kill(&data_dir, &feed)?;
        if self.args.dense == "static" {
            eprintln!("size {target}: dense recall@10");
            let index_path = data_dir.join("collections").join(COLLECTION).join("index");
            let recall_queries = &feed.queries[..self.args.recall_queries.min(feed.queries.len())];
            report.recall_at_10 = Some(self.dense_recall(&index_path, recall_queries)?);
        }
        if !self.args.keep && !self.args.reuse {
            let _ = std::fs::remove_dir_all(&data_dir);
            let _ = std::fs::remove_file(&build_record);
        }
        Ok(report)
    }

    /// Recall@10 of the stopped server's dense index, measured by `lathe dense-recall` (which
    /// opens the index in its own process) over `queries`.
    fn dense_recall(&self, index_path: &Path, queries: &[String]) -> anyhow::Result<f64> {
        let queries_path = self.work_dir.join("recall-queries.txt");
        std::fs::write(&queries_path, queries.join("\n"))
            .with_context(|| format!("writing {}", queries_path.display()))?;
        let args = &self.args;
        let mut command = Command::new(&self.server.binary);
        command
            .arg("dense-recall")
            .arg("--index")
            .arg(index_path)
            .arg("--models-dir")
            .arg(&args.models_dir)
            .arg("--queries")
            .arg(&queries_path);
        if let Some(ef_search) = args.ef_search {
            command.args(["--ef-search", &ef_search.to_string()]);
        }
        if args.one_graph_recall {
            command.arg("--one-graph");
            let options = [
                ("--one-graph-m", args.one_graph_m.map(|m| m.to_string())),
                (
                    "--one-graph-ef-construction",
                    args.one_graph_ef_construction.map(|ef| ef.to_string()),
                ),
                (
                    "--one-graph-level-scale",
                    args.one_graph_level_scale.map(|scale| scale.to_string()),
                ),
            ];
            for (flag, value) in options {
                if let Some(value) = value {
                    command.args([flag, &value]);
                }
            }
            if !args.one_graph_ef.is_empty() {
                let efs: Vec<String> = args.one_graph_ef.iter().map(usize::to_string).collect();
                command.args(["--one-graph-ef", &efs.join(",")]);
            }
            if args.one_graph_filtered {
                command.arg("--one-graph-filtered");
            }
        }
        let output = command
            .stderr(Stdio::inherit())
            .output()
            .context("running lathe dense-recall")?;
        if !output.status.success() {
            anyhow::bail!("lathe dense-recall failed: {}", output.status);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout
            .trim()
            .parse()
            .with_context(|| format!("lathe dense-recall printed `{}`", stdout.trim()))
    }

    fn build(&self, data_dir: &Path, target: usize, report: &mut SizeReport) -> anyhow::Result<()> {
        let server = self.server.start(data_dir)?;
        let address = server.addr();
        let cpu_before = cpu_seconds(server.pid())?;
        let built = self.runtime.block_on(async {
            let mut client = connect(address).await?;
            build_collection(
                &mut client,
                COLLECTION,
                &self.corpus,
                target,
                self.args.upload_documents,
                self.args.section_tokens,
            )
            .await
        })?;
        report.sections = built.sections;
        report.documents = built.documents;
        report.text_bytes = built.text_bytes;
        report.build_seconds = built.seconds;
        report.build_cpu_seconds = cpu_seconds(server.pid())? - cpu_before;
        server.stop()
    }

    /// Opens after the clean stop of the build, measures memory and latency, stops cleanly.
    fn open_and_query(
        &self,
        data_dir: &Path,
        feed: &Arc<QueryFeed>,
        report: &mut SizeReport,
    ) -> anyhow::Result<()> {
        let server = self.server.start(data_dir)?;
        let address = server.addr();
        let (queries, clients, budget) = (self.args.queries, self.args.clients, self.args.budget);
        self.runtime.block_on(async {
            let (_client, open_seconds) =
                first_retrieve(address, COLLECTION, feed, budget, server.spawned_at()).await?;
            report.open_clean_seconds = open_seconds;
            report.rss_open = resident(Some(server.pid()))?;
            (report.one_client, report.one_client_stages) =
                measure_latency(address, COLLECTION, Arc::clone(feed), queries, 1, budget).await?;
            report.rss_queries = resident(Some(server.pid()))?;
            (report.many_clients, _) = measure_latency(
                address,
                COLLECTION,
                Arc::clone(feed),
                queries,
                clients,
                budget,
            )
            .await?;
            anyhow::Ok(())
        })?;
        server.stop()
    }

    /// Writes one document, kills the server with SIGKILL, and times the next open; stops that
    /// server cleanly.
    fn open_after_kill(&self, data_dir: &Path, feed: &Arc<QueryFeed>) -> anyhow::Result<f64> {
        let mut killed = self.server.start(data_dir)?;
        self.runtime.block_on(async {
            let mut client = connect(killed.addr()).await?;
            write_one_more(&mut client, COLLECTION, &self.corpus).await
        })?;
        killed.kill()?;
        let server = self.server.start(data_dir)?;
        let (_, open_seconds) = self.runtime.block_on(first_retrieve(
            server.addr(),
            COLLECTION,
            feed,
            self.args.budget,
            server.spawned_at(),
        ))?;
        server.stop()?;
        Ok(open_seconds)
    }
}

/// The build's figures, kept beside its data dir for `--reuse`.
fn write_build_record(path: &Path, report: &SizeReport) -> anyhow::Result<()> {
    let record = serde_json::json!({
        "sections": report.sections,
        "documents": report.documents,
        "text_bytes": report.text_bytes,
        "build_seconds": report.build_seconds,
        "build_cpu_seconds": report.build_cpu_seconds,
    });
    std::fs::write(path, record.to_string()).with_context(|| format!("writing {}", path.display()))
}

fn read_build_record(path: &Path, report: &mut SizeReport) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let record: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let number = |name: &str| {
        record[name]
            .as_f64()
            .with_context(|| format!("{} has no `{name}`", path.display()))
    };
    report.sections = number("sections")? as u64;
    report.documents = number("documents")? as u64;
    report.text_bytes = number("text_bytes")? as u64;
    report.build_seconds = number("build_seconds")?;
    report.build_cpu_seconds = number("build_cpu_seconds")?;
    Ok(())
}

/// Bytes of every file under `path`.
fn disk_bytes(path: &Path) -> u64 {
    walkdir::WalkDir::new(path)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}
