//! One server per data dir: an exclusive lock on `data_dir/lathe.lock`, taken before any
//! collection is opened and held until the catalog shuts down.
//!
//! The lock is `flock(2)` (`File::try_lock`): the kernel drops it when the process ends however it
//! ends, kill -9 included, so a crash never leaves a stale lock behind. The file holds the owner's
//! pid and start time so that a refused second server can name the process in its way; the file
//! itself is never removed (removing a lock file races with the next opener, and a stale pid in an
//! unlocked file is harmless: it is only read while the lock is held).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{LatheError, Result};

pub const LOCK_FILE: &str = "lathe.lock";

/// Who holds the lock, as written into the lock file.
#[derive(Debug, Serialize, Deserialize)]
struct Holder {
    pid: u32,
    started: String,
}

/// Held while a server uses the data dir; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the data dir's lock, or says which process holds it.
    pub fn acquire(data_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            LatheError::io(format!("creating the data dir {}", data_dir.display()), e)
        })?;
        let path = data_dir.join(LOCK_FILE);
        // On a read-only filesystem this fails with the path and the cause: the server refuses to
        // start rather than serve collections it could not write.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LatheError::io(format!("opening the lock file {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LatheError::DataDirLocked {
                    data_dir: data_dir.to_path_buf(),
                    lock_file: path,
                    holder: describe_holder(&mut file),
                })
            }
            Err(TryLockError::Error(error)) => {
                // A filesystem without locks: refuse rather than risk two writers on one index.
                return Err(LatheError::io(
                    format!(
                        "locking {} (one server per data dir; the filesystem must support flock)",
                        path.display()
                    ),
                    error,
                ));
            }
        }
        let holder = Holder {
            pid: std::process::id(),
            started: httpdate::fmt_http_date(SystemTime::now()),
        };
        let json = serde_json::to_vec(&holder).map_err(LatheError::internal)?;
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(&json))
            .and_then(|()| file.sync_data())
            .map_err(|e| LatheError::io(format!("writing the lock file {}", path.display()), e))?;
        Ok(Self { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        // Closing the file would release it too; unlocking first makes the moment explicit.
        let _ = self.file.unlock();
    }
}

/// "pid 1234, started Mon, 01 Dec 2025 10:00:00 GMT", or what is known of it.
fn describe_holder(file: &mut File) -> String {
    let mut contents = String::new();
    if file.read_to_string(&mut contents).is_err() {
        return "a process whose pid could not be read".to_string();
    }
    match serde_json::from_str::<Holder>(&contents) {
        Ok(holder) => format!("pid {}, started {}", holder.pid, holder.started),
        // The holder took the lock but has not written its pid yet.
        Err(_) => "a process that has not written its pid yet".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        // flock conflicts between two open file descriptions even within one process.
        let error = DataDirLock::acquire(dir.path()).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, LatheError::DataDirLocked { .. }),
            "{message}"
        );
        assert!(
            message.contains(&dir.path().display().to_string())
                && message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        drop(first);
        // Released on drop: the next server gets it.
        let again = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(again.path(), dir.path().join(LOCK_FILE));
    }

    #[test]
    fn a_stale_lock_file_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(LOCK_FILE),
            br#"{"pid":999999,"started":"long ago"}"#,
        )
        .unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let written = std::fs::read_to_string(lock.path()).unwrap();
        assert!(
            written.contains(&format!("\"pid\":{}", std::process::id())),
            "{written}"
        );
    }
}
