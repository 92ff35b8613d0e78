//! A real `nats-server` with JetStream for the replication tests: started on a loopback port with
//! its store in a folder of the test's, killed with SIGKILL and restarted on the same port and
//! store, stopped when dropped. The binary is `$LATHE_TEST_NATS_SERVER`, else `nats-server` on
//! the PATH or in /usr/sbin (Debian's package, which `.ci/run` installs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nats {
    child: Option<Child>,
    pub port: u16,
    store: PathBuf,
    config: Option<PathBuf>,
}

pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LATHE_TEST_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file())
        .expect("nats-server is not installed: `apt-get install nats-server` (.ci/run installs it), or set LATHE_TEST_NATS_SERVER")
}

impl Nats {
    /// JetStream on a free loopback port, its store under `dir`; `max_payload` (bytes) replaces
    /// the server's 1 MiB default when given.
    pub fn start(dir: &Path, max_payload: Option<usize>) -> Self {
        let port = super::binary::free_local_address()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("a port");
        let config = max_payload.map(|bytes| {
            let path = dir.join("nats.conf");
            std::fs::write(&path, format!("max_payload: {bytes}\n")).expect("write nats.conf");
            path
        });
        let mut nats = Self {
            child: None,
            port,
            store: dir.join("nats-store"),
            config,
        };
        nats.restart();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port and store and waits until it is ready.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server is already running");
        let mut command = Command::new(nats_server_binary());
        command
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store);
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nats-server");
        let lines = super::binary::log_lines(child.stderr.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("Server is ready") => break,
                Ok(line) => seen.push(line),
                Err(error) => panic!(
                    "nats-server did not get ready ({error}):\n{}",
                    seen.join("\n")
                ),
            }
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        self.child = Some(child);
    }

    /// The running server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("nats-server is running").id()
    }

    /// Removes the store (the server must be stopped): the next start begins empty.
    pub fn wipe_store(&self) {
        assert!(self.child.is_none(), "stop nats-server first");
        std::fs::remove_dir_all(&self.store).expect("remove the store");
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three (or more) `nats-server -js` nodes on loopback routed into one JetStream cluster, each
/// with its own store under the test's folder; nodes are named `n0`, `n1`, … (the names
/// JetStream reports as a stream's leader).
pub struct NatsCluster {
    nodes: Vec<Option<Child>>,
    client_ports: Vec<u16>,
}

impl NatsCluster {
    /// Starts `size` routed nodes and waits until each says it is ready.
    pub fn start(dir: &Path, size: usize) -> Self {
        let port = || -> u16 {
            super::binary::free_local_address()
                .rsplit(':')
                .next()
                .and_then(|port| port.parse().ok())
                .expect("a port")
        };
        let client_ports: Vec<u16> = (0..size).map(|_| port()).collect();
        let cluster_ports: Vec<u16> = (0..size).map(|_| port()).collect();
        let routes: Vec<String> = cluster_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let mut children = Vec::new();
        for node in 0..size {
            let store = dir.join(format!("nats-n{node}"));
            let config = dir.join(format!("nats-n{node}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: n{node}\nlisten: 127.0.0.1:{}\n\
                     jetstream {{ store_dir: \"{}\" }}\n\
                     cluster {{ name: lathe-test\n listen: 127.0.0.1:{}\n routes: [{}] }}\n",
                    client_ports[node],
                    store.display(),
                    cluster_ports[node],
                    routes.join(", ")
                ),
            )
            .expect("write the node's config");
            let mut child = Command::new(nats_server_binary())
                .arg("-c")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn nats-server");
            let lines = super::binary::log_lines(child.stderr.take().unwrap());
            std::thread::spawn(move || while lines.recv().is_ok() {});
            children.push(Some(child));
        }
        Self {
            nodes: children,
            client_ports,
        }
    }

    /// Every node's client URL, comma-separated (as `replication.nats_url` takes them).
    pub fn url(&self) -> String {
        self.client_ports
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILL node `name` (`n0`, `n1`, …), and wait until it is gone.
    pub fn kill(&mut self, name: &str) {
        let node: usize = name
            .strip_prefix('n')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no node {name}"));
        if let Some(mut child) = self.nodes[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
