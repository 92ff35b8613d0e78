//! The `lathe` binary: `serve` and `export` (this crate), and the client subcommands `ingest`,
//! `query`, `ops`, `snapshot`, `restore`, `collections`, `alias`, `health` and `eval` (the tools
//! crate, over gRPC).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use lathe::config::{Config, ConfigOverrides, LogFormat};
use lathe::launch;
use lathe_tools::cli;

/// jemalloc: glibc's allocator was a fifth of a lexical ingest's CPU (docs/notebook/benchmarks-notebook.md, "jemalloc, and unseen ASCII words straight to WordPiece").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (its `malloc_conf` string, read once at its start; `_RJEM_MALLOC_CONF` in
/// the environment is applied after it):
/// - freed pages go back to the system within a second, purged by jemalloc's own background
///   thread rather than by the thread that frees, so an idle server keeps what it keeps with glibc;
/// - one arena for all threads. hnsw_rs's loader allocates a temporary of the same size class
///   beside each point's neighbour table and frees the temporaries at the end; segments loaded
///   side by side in arenas of their own leave those holes where no other load can reuse them
///   (docs/notebook/benchmarks-notebook.md, "One allocator arena").
#[cfg(not(target_env = "msvc"))]
#[export_name = "_rjem_malloc_conf"]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8; 70] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1\0";

#[derive(Parser)]
#[command(
    name = "lathe",
    version,
    about = "A gRPC retrieval server for RAG that chunks at query time"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (defaults: 127.0.0.1:50051, ./data, ./models).
    Serve {
        /// TOML configuration file (every key documented in deploy/lathe.toml).
        #[arg(long, env = "LATHE_CONFIG")]
        config: Option<PathBuf>,
        /// Address of the gRPC listener (`server.listen`; port 0: any free port, logged).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Folder of the collections, snapshots and write queue (`storage.data_dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Folder of the model files, as scripts/fetch-models.sh lays it out (`models.dir`).
        #[arg(long)]
        models_dir: Option<PathBuf>,
        /// `text` or `json`.
        #[arg(long, value_parser = parse_log_format)]
        log_format: Option<LogFormat>,
    },
    /// Ingest files or folders into a collection: Markdown, HTML, text, reStructuredText,
    /// CSV/TSV, source code and JSONL files, also gzipped (.gz).
    Ingest(cli::IngestArgs),
    /// Retrieve chunks for a question and print them with scores and offsets.
    Query(cli::QueryArgs),
    /// List a collection's write operations, or follow one (--wait ID) with a progress bar.
    Ops(cli::OpsArgs),
    /// Snapshots of collections, taken while they serve: create (--all, --keep N), list,
    /// delete, download.
    Snapshot(cli::SnapshotArgs),
    /// Create a collection from a snapshot file (uploaded) or one the server keeps (--snapshot).
    Restore(cli::RestoreArgs),
    /// A server's collections: list, get, create, delete.
    Collections(cli::CollectionsArgs),
    /// Aliases, second names for collections: list, create, switch (at once for every reader),
    /// delete.
    Alias(cli::AliasArgs),
    /// Recover a lost replicated write log through one replica: `reseed` (a new log from its
    /// data) or `start-over` (a new, empty log); every replica converges to it.
    Replicas(cli::ReplicasArgs),
    /// Ask the server's health check; prints SERVING or NOT_SERVING, exits 0 only for SERVING.
    Health(cli::HealthArgs),
    /// Evaluate retrieval quality and latency on a dataset (docs.jsonl, queries.jsonl) over gRPC.
    Eval(cli::EvalArgs),
    /// Write a snapshot file's documents as JSONL that `lathe ingest` reads (offline, no server):
    /// how a replicated deployment is seeded from a snapshot.
    Export(lathe::export::ExportArgs),
    /// Recall@10 of a stopped server's dense index against exact search (run by lathe-bench).
    #[command(hide = true)]
    DenseRecall(lathe::dense_recall::DenseRecallArgs),
}

fn parse_log_format(value: &str) -> Result<LogFormat, String> {
    match value {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("`{other}`: expected `text` or `json`")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lathe: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Outlives `block_on`: dropped below while the runtime still runs, it flushes exported spans.
    let mut tracing_guard = None;
    let tracing_slot = &mut tracing_guard;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve {
                config,
                listen,
                data_dir,
                models_dir,
                log_format,
            } => {
                let overrides = ConfigOverrides {
                    listen,
                    data_dir,
                    models_dir,
                    log_format,
                };
                let config = Config::load(config.as_deref(), &overrides)?;
                *tracing_slot = Some(launch::init_tracing(&config.log)?);
                launch::serve(config).await
            }
            Command::Ingest(args) => cli::ingest(args).await,
            Command::Query(args) => cli::query(args).await,
            Command::Ops(args) => cli::ops(args).await,
            Command::Snapshot(args) => cli::snapshot(args).await,
            Command::Restore(args) => cli::restore(args).await,
            Command::Collections(args) => cli::collections(args).await,
            Command::Alias(args) => cli::alias(args).await,
            Command::Health(args) => cli::health(args).await,
            Command::Replicas(args) => cli::replicas(args).await,
            Command::Eval(args) => cli::eval(args).await,
            Command::Export(args) => lathe::export::run(args),
            Command::DenseRecall(args) => lathe::dense_recall::run(args),
        }
    });
    drop(tracing_guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A status the server answered reads as gRPC names it (`NOT_FOUND: …`).
            let causes: Vec<String> = error
                .chain()
                .map(|cause| match cause.downcast_ref::<tonic::Status>() {
                    Some(status) => lathe_tools::client::status_line(status),
                    None => cause.to_string(),
                })
                .collect();
            eprintln!("lathe: {}", causes.join(": "));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand and every argument, hidden ones included, says what it is for in
    /// `lathe help`: a flag added without a doc comment fails here.
    #[test]
    fn every_subcommand_and_argument_has_help() {
        let command = Cli::command();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        collect_missing_help(&command, "lathe", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }

    fn collect_missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for argument in command.get_arguments() {
            let generated = matches!(argument.get_id().as_str(), "help" | "version");
            if !generated && argument.get_help().is_none() && argument.get_long_help().is_none() {
                missing.push(format!("{path} {}", argument.get_id()));
            }
        }
        for subcommand in command.get_subcommands() {
            let sub_path = format!("{path} {}", subcommand.get_name());
            if subcommand.get_about().is_none() && subcommand.get_long_about().is_none() {
                missing.push(sub_path.clone());
            }
            collect_missing_help(subcommand, &sub_path, missing);
        }
    }

    #[test]
    fn the_connection_options_follow_any_client_subcommand() {
        let cli = Cli::try_parse_from([
            "lathe",
            "collections",
            "list",
            "--api-key",
            "k",
            "--tls-ca",
            "ca.pem",
            "--tls-domain",
            "localhost",
        ])
        .expect("parses");
        let Command::Collections(args) = cli.command else {
            panic!("not collections");
        };
        assert_eq!(args.connect.api_key.as_deref(), Some("k"));
        assert_eq!(args.connect.tls_ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(args.connect.tls_domain.as_deref(), Some("localhost"));
    }
}
