//! The processes of the benchmark: the `nats-server -js` that holds the write log, and the
//! `lathe serve` replicas (started and stopped through the library's `ServerProcess`), with their
//! readiness and metrics.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::transport::Channel;

use lathe_tools::client::{connect, serve_command};
use lathe_tools::server_process::{Patience, ServerProcess};

use crate::Args;

pub(crate) fn nats_binary(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.nats_server {
        return Ok(path.clone());
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file())
        .context("no nats-server: scripts/install-nats-server.sh, or --nats-server")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) struct NatsProcess {
    child: Child,
    pub(crate) url: String,
}

impl NatsProcess {
    pub(crate) fn start(binary: &Path, dir: &Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.join("nats"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let log = spawn_log_reader(child.stderr.take().context("nats stderr")?);
        wait_for_line(&log, "Server is ready", Duration::from_secs(30))?;
        std::thread::spawn(move || while log.recv().is_ok() {});
        Ok(Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Messages and bytes of the log's stream.
    pub(crate) async fn stream_state(&self) -> anyhow::Result<(u64, u64)> {
        let client = async_nats::connect(&self.url).await?;
        let mut stream = async_nats::jetstream::new(client)
            .get_stream("LATHE")
            .await?;
        let info = stream.info().await?;
        Ok((info.state.messages, info.state.bytes))
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct Spawner {
    pub(crate) lathe: PathBuf,
    pub(crate) models_dir: PathBuf,
    pub(crate) dense: String,
}

/// A `lathe serve` child: its gRPC and metrics addresses.
pub(crate) struct Replica {
    server: ServerProcess,
    metrics: String,
    pub(crate) client: lathe_tools::client::Client,
}

/// A replica catches up on the whole log before it logs `lathe serving`.
const PATIENCE: Patience = Patience {
    serve: Duration::from_secs(600),
    stop: Duration::from_secs(120),
};

impl Spawner {
    /// A replica of the log at `nats` (or a single node without it), once it serves gRPC.
    pub(crate) async fn replica(
        &self,
        data_dir: &Path,
        nats: Option<&str>,
    ) -> anyhow::Result<Replica> {
        self.replica_on(data_dir, nats, None).await
    }

    /// [`Spawner::replica`], its process kept to CPU `core` when one is given.
    pub(crate) async fn replica_on(
        &self,
        data_dir: &Path,
        nats: Option<&str>,
        core: Option<usize>,
    ) -> anyhow::Result<Replica> {
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let mut command = serve_command(&self.lathe, &self.models_dir, data_dir, &self.dense);
        if let Some(core) = core {
            pin(&mut command, core);
        }
        command
            .env("LATHE_LOG__FILTER", "warn,lathe=info")
            .env("LATHE_SERVER__METRICS_LISTEN", &metrics)
            .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "3600000");
        if let Some(url) = nats {
            command.env("LATHE_REPLICATION__NATS_URL", url);
        }
        let lathe = self.lathe.clone();
        let server = tokio::task::spawn_blocking(move || {
            ServerProcess::start(command, PATIENCE)
                .with_context(|| format!("starting {}", lathe.display()))
        })
        .await??;
        let client = connect(server.addr()).await?;
        Ok(Replica {
            server,
            metrics,
            client,
        })
    }
}

impl Replica {
    /// The replica's gRPC address.
    pub(crate) fn address(&self) -> &str {
        self.server.addr()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// When its process was spawned.
    pub(crate) fn spawned_at(&self) -> Instant {
        self.server.spawned_at()
    }

    pub(crate) async fn until_ready(&self, limit: Duration) -> anyhow::Result<()> {
        use tonic_health::pb::health_check_response::ServingStatus;
        let channel = Channel::from_shared(format!("http://{}", self.address()))?
            .connect()
            .await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let deadline = Instant::now() + limit;
        loop {
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "lathe.v1.Lathe".into(),
                })
                .await?
                .into_inner()
                .status;
            if status == ServingStatus::Serving as i32 {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "not ready within {limit:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `name`'s value on the replica's /metrics.
    pub(crate) fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let mut stream = std::net::TcpStream::connect(&self.metrics)?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: lathe\r\n\r\n")?;
        let mut body = String::new();
        stream.read_to_string(&mut body)?;
        let prefix = format!("{name} ");
        body.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse().ok())
            .with_context(|| format!("no {name} on /metrics"))
    }
}

/// Replicas are killed, not stopped: the run is over, and their data goes with the work folder.
impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.server.kill();
    }
}

fn spawn_log_reader(stderr: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    log
}

fn wait_for_line(
    log: &mpsc::Receiver<String>,
    needle: &str,
    limit: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .with_context(|| format!("no `{needle}` in the log within {limit:?}"))?;
        if line.contains(needle) {
            return Ok(line);
        }
    }
}

/// Keeps the command's process to CPU `core` (Linux): every thread it starts, and the thread
/// counts it derives from the CPUs it may use (`available_parallelism` reads the affinity).
fn pin(command: &mut Command, core: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only fills a mask on its stack and makes one
    // system call, both async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
