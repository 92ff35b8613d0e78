//! The files of one commit, opened for a backup while the collection serves and takes writes:
//! `meta.json` as read, every file of the segments it lists, and the dense index's manifest with
//! the segment files it lists. Nothing is locked and no writer waits: tantivy's segment files and
//! the dense segments' files are immutable and never renamed, and a file once opened stays
//! readable whatever a later merge or garbage collection removes. A file that is already gone
//! means a newer commit replaced the one read, so the set is taken again from the newer one.
//!
//! The dense files may be newer than the tantivy commit (a seal after it): that is harmless,
//! since an open marks live only the slots of the sections the commit holds and inserts the rest
//! from their stored vectors (see `dense_upkeep`).

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::handle::{dense_dir, CollectionIndex};
use super::writer::CommitPayload;
use crate::error::{LatheError, Result};

/// The folder of the archive that holds the tantivy index, and the dense index's.
pub const BACKUP_INDEX_DIR: &str = "index";
pub const BACKUP_DENSE_DIR: &str = "dense";
const META_FILE: &str = "meta.json";
/// The components every tantivy segment writes (a `.del` file comes on top with deletes).
const SEGMENT_COMPONENTS: [&str; 6] = ["idx", "pos", "term", "store", "fast", "fieldnorm"];
/// Commits that replace the one read before its files are open: past this many tries the
/// backup gives up (each try reads one small file, so only a collection committing many times a
/// millisecond would get there).
const ATTEMPTS: usize = 20;

/// One commit's files, open.
pub struct BackupFiles {
    /// The commit's opstamp: the generation a query of the restored collection reports.
    pub generation: u64,
    /// With replication: the log position the commit holds (0 on a single node).
    pub log_position: u64,
    /// In archive order: `index/meta.json` first, then the segment files, then the dense
    /// manifest and its files.
    pub files: Vec<BackupFile>,
}

/// A file of the backup: its path in the archive (`index/<name>` or `dense/<name>`) and where
/// its bytes come from.
pub struct BackupFile {
    pub archive_path: String,
    pub source: BackupSource,
}

pub enum BackupSource {
    /// A small file read whole (a manifest: what was parsed is exactly what is archived).
    Bytes(Vec<u8>),
    /// An immutable file, open, and its length.
    Open(File, u64),
}

impl BackupSource {
    pub fn len(&self) -> u64 {
        match self {
            Self::Bytes(bytes) => bytes.len() as u64,
            Self::Open(_, len) => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why one try failed.
enum Miss {
    /// A listed file was gone: a newer commit replaced the one read.
    Replaced(PathBuf),
    Failed(LatheError),
}

#[derive(Deserialize)]
struct MetaFile {
    segments: Vec<SegmentMetaFile>,
    opstamp: u64,
    #[serde(default)]
    payload: Option<String>,
}

#[derive(Deserialize)]
struct SegmentMetaFile {
    /// Parsed as a uuid: a name that could be a path never reaches the file system.
    segment_id: tantivy::index::SegmentId,
    #[serde(default)]
    deletes: Option<DeleteMetaFile>,
}

#[derive(Deserialize)]
struct DeleteMetaFile {
    opstamp: u64,
}

impl CollectionIndex {
    /// The files of the collection's latest commit, open (see the module doc).
    pub fn backup_files(&self) -> Result<BackupFiles> {
        let index_dir = self.path();
        let dense = self.dense.is_some().then(|| dense_dir(index_dir));
        let mut last_miss = PathBuf::new();
        for _ in 0..ATTEMPTS {
            match try_backup_files(index_dir, dense.as_deref()) {
                Ok(files) => return Ok(files),
                Err(Miss::Replaced(path)) => last_miss = path,
                Err(Miss::Failed(error)) => return Err(error),
            }
        }
        Err(LatheError::Unavailable(format!(
            "the collection committed {ATTEMPTS} times while its files were being opened (last \
             gone: {}); try the snapshot again",
            last_miss.display()
        )))
    }
}

fn try_backup_files(index_dir: &Path, dense: Option<&Path>) -> Result<BackupFiles, Miss> {
    let meta_path = index_dir.join(META_FILE);
    let meta_bytes = std::fs::read(&meta_path).map_err(|e| failed(&meta_path, e))?;
    let meta: MetaFile = serde_json::from_slice(&meta_bytes).map_err(|error| {
        Miss::Failed(LatheError::internal(format!(
            "{} is not a tantivy meta file: {error}",
            meta_path.display()
        )))
    })?;
    let mut files = vec![BackupFile {
        archive_path: format!("{BACKUP_INDEX_DIR}/{META_FILE}"),
        source: BackupSource::Bytes(meta_bytes),
    }];
    for segment in &meta.segments {
        let id = segment.segment_id.uuid_string();
        let mut names: Vec<String> = SEGMENT_COMPONENTS
            .iter()
            .map(|ext| format!("{id}.{ext}"))
            .collect();
        if let Some(deletes) = &segment.deletes {
            names.push(format!("{id}.{}.del", deletes.opstamp));
        }
        for name in names {
            files.push(open_listed(index_dir, BACKUP_INDEX_DIR, &name)?);
        }
    }
    if let Some(dense) = dense {
        files.extend(dense_files(dense)?);
    }
    Ok(BackupFiles {
        generation: meta.opstamp,
        log_position: CommitPayload::log_position_of(meta.payload.as_deref()),
        files,
    })
}

/// The dense manifest as read and the files it lists; nothing without a manifest (no segment
/// sealed yet: an open inserts every vector from the stored sections).
fn dense_files(dir: &Path) -> Result<Vec<BackupFile>, Miss> {
    let manifest_path = dir.join(crate::dense::MANIFEST_FILE);
    let bytes = match std::fs::read(&manifest_path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(failed(&manifest_path, error)),
    };
    let names = crate::dense::listed_files(&manifest_path, &bytes)
        .map_err(|error| Miss::Failed(LatheError::internal(error.to_string())))?;
    let mut files = vec![BackupFile {
        archive_path: format!("{BACKUP_DENSE_DIR}/{}", crate::dense::MANIFEST_FILE),
        source: BackupSource::Bytes(bytes),
    }];
    for name in names {
        files.push(open_listed(dir, BACKUP_DENSE_DIR, &name)?);
    }
    Ok(files)
}

fn open_listed(dir: &Path, archive_dir: &str, name: &str) -> Result<BackupFile, Miss> {
    let path = dir.join(name);
    let file = File::open(&path).map_err(|e| miss(&path, e))?;
    let len = file.metadata().map_err(|e| failed(&path, e))?.len();
    Ok(BackupFile {
        archive_path: format!("{archive_dir}/{name}"),
        source: BackupSource::Open(file, len),
    })
}

fn miss(path: &Path, error: std::io::Error) -> Miss {
    if error.kind() == std::io::ErrorKind::NotFound {
        Miss::Replaced(path.to_path_buf())
    } else {
        failed(path, error)
    }
}

fn failed(path: &Path, error: std::io::Error) -> Miss {
    Miss::Failed(LatheError::io(format!("reading {}", path.display()), error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::collection::records::WriteOp;
    use crate::index::collection::testing;

    #[test]
    fn a_backup_lists_every_file_of_the_commit_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let index = testing::open(dir.path()).unwrap();
        let upserts = ["alpha", "beta", "gamma"]
            .iter()
            .map(|id| WriteOp::Upsert(testing::record(id, &format!("{id} in the harbour"))))
            .collect();
        testing::write_and_wait(&index, upserts);
        let delete = WriteOp::Delete {
            doc_id: "beta".into(),
        };
        testing::write_and_wait(&index, vec![delete]);
        let backup = index.backup_files().unwrap();
        assert_eq!(backup.generation, index.snapshot().generation);
        assert_eq!(backup.files[0].archive_path, "index/meta.json");
        let listed: std::collections::BTreeSet<String> = backup
            .files
            .iter()
            .map(|file| file.archive_path.clone())
            .collect();
        assert_eq!(listed.len(), backup.files.len(), "no file twice");
        // Every segment file on disk that the commit uses is in the backup, with its length.
        let meta: MetaFile =
            serde_json::from_slice(&std::fs::read(index.path().join(META_FILE)).unwrap()).unwrap();
        for segment in &meta.segments {
            let id = segment.segment_id.uuid_string();
            for item in std::fs::read_dir(index.path()).unwrap() {
                let name = item.unwrap().file_name().into_string().unwrap();
                let current_delete = segment
                    .deletes
                    .as_ref()
                    .is_none_or(|d| name == format!("{id}.{}.del", d.opstamp));
                if name.starts_with(&id) && (!name.ends_with(".del") || current_delete) {
                    assert!(listed.contains(&format!("index/{name}")), "{name} missing");
                }
            }
        }
        assert!(meta.segments.iter().any(|s| s.deletes.is_some()));
        for file in &backup.files {
            if let BackupSource::Open(_, len) = &file.source {
                let name = file.archive_path.strip_prefix("index/").unwrap();
                assert_eq!(
                    *len,
                    std::fs::metadata(index.path().join(name)).unwrap().len()
                );
            }
        }
    }
}
