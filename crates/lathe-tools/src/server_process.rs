//! A `lathe serve` process a tool starts for itself: "start a server here unless `--addr` names
//! one" (`lathe eval`, `lathe-load`: a temporary data folder), and the servers the benchmark
//! programs start, stop and kill on data folders of their own (`lathe-bench`, `lathe-replicas`).
//! The tools reach the server only through its gRPC API, so the server they start is the real
//! binary in a process of its own, on a port-0 loopback listener; the listening address is read
//! from its JSON log line `lathe serving`. One implementation for all of them: spawning, reading
//! the log, waiting to serve, SIGTERM and SIGKILL.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Log lines kept to explain a server that stopped.
const LOG_TAIL_LINES: usize = 20;

/// How long a started server may take to serve and to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patience {
    /// From spawning to the `lathe serving` line: the server loads its models and opens every
    /// collection first.
    pub serve: Duration,
    /// From SIGTERM to the exit: it drains, commits and closes.
    pub stop: Duration,
}

impl Default for Patience {
    /// Two minutes each: enough for the models and a small data folder.
    fn default() -> Self {
        Self {
            serve: Duration::from_secs(120),
            stop: Duration::from_secs(120),
        }
    }
}

/// The `lathe` binary a tool runs: `$LATHE_BIN`, else this program when it is `lathe`, else the
/// `lathe` beside it (cargo puts the workspace's binaries in one folder; a test binary sits one
/// folder below, in `deps/`).
pub fn lathe_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("LATHE_BIN") {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe().context("locating this program")?;
    if me.file_stem().is_some_and(|stem| stem == "lathe") {
        return Ok(me);
    }
    let beside = me.with_file_name("lathe");
    let above = me
        .parent()
        .and_then(Path::parent)
        .map(|folder| folder.join("lathe"));
    [Some(beside), above]
        .into_iter()
        .flatten()
        .find(|candidate| candidate.is_file())
        .with_context(|| {
            format!(
                "no `lathe` binary beside {}: build it (cargo build) or set LATHE_BIN",
                me.display()
            )
        })
}

/// The `address` field of a JSON log line of `lathe serve` (`lathe serving`, `metrics serving`,
/// …), `None` when the line has none.
pub fn log_address(log_line: &str) -> Option<String> {
    let rest = log_line.split("\"address\":\"").nth(1)?;
    Some(rest.chars().take_while(|c| *c != '"').collect())
}

/// The `address` field of the JSON log line `lathe serving`, `None` for any other line.
pub fn serving_address(log_line: &str) -> Option<String> {
    log_line
        .contains("lathe serving")
        .then(|| log_address(log_line))
        .flatten()
}

/// The command that runs the `lathe` binary at `binary` as a server of its own: a port-0 loopback
/// listener, JSON logs on stderr (piped: the listening address is read from there), stdout
/// dropped, its models from `models_dir`, its data in `data_dir`. Every server a tool starts runs
/// it; callers add their own `LATHE_*` settings before starting it.
pub(crate) fn loopback_serve_command(binary: &Path, models_dir: &Path, data_dir: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--models-dir")
        .arg(models_dir)
        .arg("--data-dir")
        .arg(data_dir)
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    command
}

/// A running `lathe serve` child process, stopped (SIGTERM, then waited for) by [`stop`] or on
/// drop, or killed (SIGKILL) by [`kill`].
///
/// [`stop`]: ServerProcess::stop
/// [`kill`]: ServerProcess::kill
pub struct ServerProcess {
    child: Child,
    address: String,
    spawned_at: Instant,
    stop_limit: Duration,
    log_tail: Arc<Mutex<VecDeque<String>>>,
    // Removed on drop, after the server has stopped; `None` when the caller owns the data folder.
    _temporary_data_dir: Option<tempfile::TempDir>,
}

impl ServerProcess {
    /// Starts `lathe serve` on its defaults with models from `models_dir`, `cpu_threads` pool
    /// threads (0: one per core) and a temporary data folder removed when it stops, and waits
    /// until it serves: what `lathe eval` and `lathe-load` run without `--addr`.
    pub fn start_temporary(models_dir: &Path, cpu_threads: usize) -> anyhow::Result<Self> {
        let tokenizer = models_dir.join("minilm/tokenizer.json");
        if !tokenizer.exists() {
            anyhow::bail!(
                "models missing: {} not found; pass --models-dir or run scripts/fetch-models.sh",
                tokenizer.display()
            );
        }
        let data_dir = tempfile::Builder::new()
            .prefix("lathe-eval-")
            .tempdir()
            .context("creating a temporary data folder")?;
        let mut command = loopback_serve_command(&lathe_binary()?, models_dir, data_dir.path());
        command
            // Its own defaults, not a configuration file meant for another server.
            .env_remove("LATHE_CONFIG")
            .env("LATHE_SERVER__CPU_THREADS", cpu_threads.to_string());
        let mut server = Self::start(command, Patience::default())?;
        server._temporary_data_dir = Some(data_dir);
        Ok(server)
    }

    /// Runs `command` (a `lathe serve` with `--log-format json` and a loopback listener, as
    /// [`crate::client::serve_command`] makes it) and waits until it logs `lathe serving`, at most
    /// `patience.serve`; [`stop`](Self::stop) waits at most `patience.stop`.
    pub fn start(mut command: Command, patience: Patience) -> anyhow::Result<Self> {
        command.stdin(Stdio::null()).stdout(Stdio::null());
        command.stderr(Stdio::piped());
        let spawned_at = Instant::now();
        let mut child = command.spawn().context("starting `lathe serve`")?;
        let stderr = child.stderr.take().context("the server's stderr")?;
        let log_tail = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL_LINES)));
        let addresses = read_log(stderr, Arc::clone(&log_tail));
        let deadline = spawned_at + patience.serve;
        let mut server = Self {
            child,
            address: String::new(),
            spawned_at,
            stop_limit: patience.stop,
            log_tail,
            _temporary_data_dir: None,
        };
        loop {
            match addresses.recv_timeout(Duration::from_millis(100)) {
                Ok(address) => {
                    server.address = address;
                    return Ok(server);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(mpsc::RecvTimeoutError::Timeout) => anyhow::bail!(
                    "the server did not serve within {} s; its last log lines:\n{}",
                    patience.serve.as_secs(),
                    server.log_tail()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.child.wait().context("waiting for the server")?;
                    anyhow::bail!(
                        "the server stopped before it served ({status}); its last log lines:\n{}",
                        server.log_tail()
                    );
                }
            }
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port`, as `connect` takes it.
    pub fn addr(&self) -> &str {
        &self.address
    }

    /// When the process was spawned: what a benchmark times a start or an open from.
    pub fn spawned_at(&self) -> Instant {
        self.spawned_at
    }

    /// `kill -9`: SIGKILL, then reaps the process (a crash, as a benchmark makes one).
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("kill -9 of the server")?;
        self.child.wait().context("waiting for the killed server")?;
        Ok(())
    }

    /// Graceful stop: SIGTERM (drain, commit, close), then waits for the exit; a temporary data
    /// folder is removed after.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.terminate()
    }

    fn terminate(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.child.id()).context("the server's pid")?;
        // SAFETY: `kill` with a child's own pid and SIGTERM has no memory effects in this process.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(std::io::Error::last_os_error()).context("signalling the server");
        }
        let deadline = Instant::now() + self.stop_limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                anyhow::bail!(
                    "the server exited with {status}; its last log lines:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        anyhow::bail!(
            "the server did not stop within {} s",
            self.stop_limit.as_secs()
        )
    }

    fn log_tail(&self) -> String {
        let tail = self.log_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Err(error) = self.terminate() {
            eprintln!("stopping the started server: {error:#}");
        }
    }
}

/// Reads the server's log on a thread of its own (so the pipe never fills), keeps its last lines
/// in `tail`, and sends the address of the `lathe serving` line once.
fn read_log(
    stderr: impl Read + Send + 'static,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sender = Some(sender);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(address) = serving_address(&line) {
                if let Some(sender) = sender.take() {
                    let _ = sender.send(address);
                }
            }
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == LOG_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    });
    receiver
}

/// The server a tool talks to: the one `--addr` names, or a `lathe serve` it started.
pub struct TargetServer {
    /// `host:port` or a URI, as `connect` takes it.
    pub address: String,
    started: Option<ServerProcess>,
}

impl TargetServer {
    /// Uses `address_opt` when given; otherwise starts a server (see
    /// [`ServerProcess::start_temporary`]).
    pub fn given_or_started(
        address_opt: Option<&str>,
        models_dir: &Path,
        cpu_threads: usize,
    ) -> anyhow::Result<Self> {
        if let Some(address) = address_opt {
            return Ok(Self {
                address: address.to_string(),
                started: None,
            });
        }
        eprintln!("starting a server on a loopback port");
        let server = ServerProcess::start_temporary(models_dir, cpu_threads)?;
        Ok(Self {
            address: server.addr().to_string(),
            started: Some(server),
        })
    }

    /// Whether this tool started the server (and so owns its data).
    pub fn is_started_here(&self) -> bool {
        self.started.is_some()
    }

    /// The started server's process id (`None` for a given server).
    pub fn pid(&self) -> Option<u32> {
        self.started.as_ref().map(ServerProcess::pid)
    }

    /// Stops the started server, if there is one; a given server keeps running.
    pub fn stop(self) -> anyhow::Result<()> {
        match self.started {
            Some(server) => server.stop(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_benchmark_servers_serving_line_gives_its_address() {
        let line = r#"{"fields":{"message":"lathe serving","address":"127.0.0.1:4321"}}"#;
        assert_eq!(serving_address(line).as_deref(), Some("127.0.0.1:4321"));
    }

    #[test]
    fn the_serving_line_gives_its_address_and_other_lines_none() {
        let line = r#"{"timestamp":"t","level":"INFO","fields":{"message":"lathe serving","address":"127.0.0.1:40123","tls":false}}"#;
        assert_eq!(serving_address(line).as_deref(), Some("127.0.0.1:40123"));
        let other = r#"{"fields":{"message":"metrics","address":"127.0.0.1:9090"}}"#;
        assert_eq!(serving_address(other), None);
    }
}
