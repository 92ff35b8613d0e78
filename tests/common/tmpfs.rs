//! A tmpfs mounted for one test (mounting needs root, which CI and the development machines
//! have), for storage faults: a small one fills up, a remount makes it read-only or larger.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for one test; unmounted on drop, even when the test panics.
pub struct Tmpfs {
    pub path: PathBuf,
    /// The server using it, killed first when the test panics (it would keep the mount busy).
    pub server_pid: Option<u32>,
}

impl Tmpfs {
    pub fn mount(path: &Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        run(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"],
            path,
        );
        Self {
            path: path.to_path_buf(),
            server_pid: None,
        }
    }

    pub fn remount(&self, mode: &str) {
        run("mount", &["-o", &format!("remount,{mode}")], &self.path);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let (true, Some(pid)) = (std::thread::panicking(), self.server_pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        // Immutable files would survive an unmount of anything but a tmpfs; clear them anyway.
        let _ = Command::new("chattr")
            .arg("-R")
            .arg("-i")
            .arg(&self.path)
            .status();
        let unmounted = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a server killed by a panic may not have exited yet): detach it.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Runs `program ARGS PATH` as root; fails the test with its stderr otherwise.
pub fn run(program: &str, args: &[&str], path: &Path) {
    let output = Command::new(program)
        .args(args)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} {} failed (these tests need root): {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}
