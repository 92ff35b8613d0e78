//! Helpers for tests that drive the real `lathe serve` binary: start it on a port-0 listener
//! with extra `LATHE_*` variables, read its log, signal it, wait for it.
//!
//! `LATHE_TEST_BIN=/path/to/lathe` runs these tests against another build (e.g. main's release
//! binary, to see a fault test fail before its fix); by default they run this crate's `lathe`.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::{Channel, Endpoint};

use super::models_dir;
use lathe_tools::server_process::log_address;

pub struct Server {
    pub child: Child,
    pub address: String,
    pub metrics_address: String,
    /// The log lines written up to and including "lathe serving".
    pub startup_log: Vec<String>,
    /// Every log line the server writes after those, as it writes it.
    pub log: mpsc::Receiver<String>,
}

pub fn free_local_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().unwrap().to_string()
}

/// The `lathe` binary under test: `LATHE_TEST_BIN`, else this crate's build.
pub fn lathe_binary() -> std::path::PathBuf {
    std::env::var_os("LATHE_TEST_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_lathe")))
}

/// Runs `lathe ingest --collection COLLECTION --addr ADDRESS EXTRA... PATH` to its end, on a
/// blocking thread.
pub async fn lathe_ingest(
    address: impl ToString,
    collection: &str,
    extra: &[&str],
    path: std::path::PathBuf,
) -> std::process::Output {
    let (address, collection) = (address.to_string(), collection.to_string());
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(lathe_binary())
            .args(["ingest", "--collection", &collection, "--addr", &address])
            .args(extra)
            .arg(path)
            .output()
            .expect("run lathe ingest")
    })
    .await
    .expect("the ingest thread")
}

/// A `lathe serve` process that may or may not get to serving.
pub struct Spawned {
    pub child: Child,
    /// Every log line the server writes, as it writes it.
    pub log: mpsc::Receiver<String>,
}

/// Starts `lathe serve` on data_dir with the metrics endpoint on a port it chooses, `variables` on top,
/// and waits until it serves.
pub fn start(data_dir: &std::path::Path, variables: &[(&str, String)]) -> Server {
    start_wrapped(&[], data_dir, variables)
}

/// [`start`], with the binary run by `wrapper` (a program and its arguments, which end with the
/// command to run, e.g. `["prlimit", "--nofile=128:128", "--"]`); the child is the wrapper,
/// which must exec the binary so that its pid is the server's.
pub fn start_wrapped(
    wrapper: &[&str],
    data_dir: &std::path::Path,
    variables: &[(&str, String)],
) -> Server {
    serving(spawn_wrapped(wrapper, data_dir, variables))
}

/// Waits until `spawned` logs that it serves, and what it logged to there.
fn serving(spawned: Spawned) -> Server {
    let Spawned { child, log } = spawned;
    // The server logs its bound address once indexes and models are loaded.
    let mut startup_log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !startup_log
        .last()
        .is_some_and(|line: &String| line.contains("lathe serving"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) => startup_log.push(line),
            Err(error) => panic!(
                "lathe serve did not log `lathe serving` ({error}); its log:\n{}",
                startup_log.join("\n")
            ),
        }
    }
    let serving = startup_log.last().expect("the serving line");
    let address = log_address(serving).expect("address in the serving line");
    // The metrics port is chosen by the server (port 0), so no other process can take it between
    // a test picking it and the server binding it.
    let metrics_address = startup_log
        .iter()
        .find(|line| line.contains("metrics serving"))
        .and_then(|line| log_address(line))
        .unwrap_or_else(|| panic!("no metrics serving line in {startup_log:?}"));
    Server {
        child,
        address,
        metrics_address,
        startup_log,
        log,
    }
}

/// Starts `lathe serve` as `start` does, without waiting for it to serve.
pub fn spawn(data_dir: &std::path::Path, variables: &[(&str, String)]) -> Spawned {
    spawn_wrapped(&[], data_dir, variables)
}

/// [`spawn`], with the binary run by `wrapper` (see [`start_wrapped`]).
pub fn spawn_wrapped(
    wrapper: &[&str],
    data_dir: &std::path::Path,
    variables: &[(&str, String)],
) -> Spawned {
    spawn_from(&lathe_binary(), &models_dir(), wrapper, data_dir, variables)
}

/// [`start_wrapped`] of `binary` with its models in `models` (copies another user can reach).
pub fn start_from(
    binary: &std::path::Path,
    models: &std::path::Path,
    wrapper: &[&str],
    data_dir: &std::path::Path,
    variables: &[(&str, String)],
) -> Server {
    serving(spawn_from(binary, models, wrapper, data_dir, variables))
}

fn spawn_from(
    binary: &std::path::Path,
    models: &std::path::Path,
    wrapper: &[&str],
    data_dir: &std::path::Path,
    variables: &[(&str, String)],
) -> Spawned {
    let mut command = match wrapper.split_first() {
        None => Command::new(binary),
        Some((program, arguments)) => {
            let mut command = Command::new(program);
            command.args(arguments).arg(binary);
            command
        }
    };
    let mut child = command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--models-dir",
        ])
        .arg(models)
        .arg("--data-dir")
        .arg(data_dir)
        .env("LATHE_LOG__FILTER", "info")
        .env("LATHE_STORAGE__WRITER_MEMORY_BYTES", "16000000")
        .env("LATHE_SERVER__CPU_THREADS", "2")
        .env("LATHE_SERVER__METRICS_LISTEN", "127.0.0.1:0")
        .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "600000")
        .envs(
            variables
                .iter()
                .map(|(name, value)| (*name, value.as_str())),
        )
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn lathe serve");
    let log = log_lines(child.stderr.take().unwrap());
    Spawned { child, log }
}

/// Every line `output` (a child's stderr) writes, as it writes it, read on a thread of its own.
pub fn log_lines(output: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (line_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    lines
}

pub fn wait_for_line(log: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(error) => panic!("no log line with `{needle}`: {error}"),
        }
    }
}

pub async fn connect(address: &str) -> LatheClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    LatheClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// The Prometheus endpoint's answer (a plain HTTP/1.0 GET), headers included.
pub fn scrape_metrics(metrics_address: impl std::net::ToSocketAddrs) -> String {
    let mut stream = std::net::TcpStream::connect(metrics_address).expect("metrics connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: lathe\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("metrics response");
    body
}

/// `lathe_requests_in_flight` from the Prometheus endpoint.
pub fn requests_in_flight(metrics_address: impl std::net::ToSocketAddrs) -> i64 {
    let body = scrape_metrics(metrics_address);
    body.lines()
        .find_map(|line| line.strip_prefix("lathe_requests_in_flight "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no lathe_requests_in_flight in\n{body}"))
}

/// SIGTERM and a clean exit (within a minute): every collection committed and closed.
pub fn stop(mut server: Server) {
    sigterm(&server.child);
    let status = wait_for_exit(&mut server.child, Duration::from_secs(60));
    assert!(status.success(), "lathe serve exited with {status}");
}

pub fn sigterm(child: &Child) {
    signal(child.id(), "-TERM");
}

/// Sends `which` (`-STOP`, `-CONT`, `-TERM`) to process `pid`.
pub fn signal(pid: u32, which: &str) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid} failed: {status}");
}

pub fn wait_for_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for lathe") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lathe did not exit within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
