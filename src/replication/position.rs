//! Where this replica is in the log: `<data_dir>/replica.json`, written after every applied batch
//! (tmp file, fsync, rename, folder fsync), so a restart resumes after the last batch that was
//! wholly committed. Entries of a batch that some collections had committed before a crash are
//! applied again only where they were not: each collection's commit holds its own position (see
//! `CollectionIndex::log_position`).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{LatheError, Result};

pub const POSITION_FILE: &str = "replica.json";

/// The stream a data dir was applied from, and how far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPosition {
    pub stream: String,
    /// When the stream was created (nanoseconds since the epoch, as JetStream reports it): a
    /// stream deleted and made again is another log, whose positions mean something else.
    pub stream_created_ns: String,
    /// Every entry up to this stream sequence is applied and committed.
    pub applied: u64,
    /// The log's incarnation (the id its first replica wrote into it, see `watch`): a stream
    /// purged, or made again, has none or another. `None` in a file from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(POSITION_FILE)
}

/// The recorded position; `None` for a data dir never applied from a log.
pub fn load(data_dir: &Path) -> Result<Option<ReplicaPosition>> {
    let file = path(data_dir);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            LatheError::Precondition(format!(
                "{} is not a replica position ({e}); move it away to let this replica bootstrap \
                 from the log again (its collections are then applied anew)",
                file.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LatheError::io(format!("reading {}", file.display()), e)),
    }
}

pub fn store(data_dir: &Path, position: &ReplicaPosition) -> Result<()> {
    let file = path(data_dir);
    let staging = data_dir.join(format!(".{POSITION_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut out = std::fs::File::create(&staging)?;
        out.write_all(&serde_json::to_vec_pretty(position)?)?;
        out.sync_all()?;
        std::fs::rename(&staging, &file)?;
        std::fs::File::open(data_dir)?.sync_all()
    };
    write().map_err(|e| LatheError::io(format!("writing {}", file.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_stored_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let position = ReplicaPosition {
            stream: "LATHE".into(),
            stream_created_ns: "1764620000000000000".into(),
            applied: 42,
            incarnation: Some("5f0c".into()),
        };
        store(dir.path(), &position).unwrap();
        store(
            dir.path(),
            &ReplicaPosition {
                applied: 43,
                ..position.clone()
            },
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap().unwrap().applied, 43);
        // A file from before the incarnation was kept reads as none.
        std::fs::write(
            path(dir.path()),
            br#"{"stream":"LATHE","stream_created_ns":"1","applied":7}"#,
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap().unwrap().incarnation, None);
        std::fs::write(path(dir.path()), b"{").unwrap();
        let error = load(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("replica.json") && error.contains("bootstrap"),
            "{error}"
        );
    }
}
