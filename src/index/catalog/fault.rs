//! Why a collection cannot serve, found when the catalog opens it: a [`Fault`] names the file
//! and the cause, and the catalog keeps such a collection listed as a [`CollectionEntry::Faulted`]
//! beside the ready ones. Also how the cause is found: the index metadata checked before tantivy
//! opens the index, and the segment file that fails its footer checksum named after tantivy
//! failed without naming one.
//!
//! [`CollectionEntry::Faulted`]: super::entry::CollectionEntry::Faulted

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::LatheError;

/// The longest cause a fault keeps: tantivy quotes a whole garbled meta.json in its message.
pub(super) const MAX_CAUSE_CHARS: usize = 400;
/// tantivy's index metadata; an index without it is not an index.
pub(super) const META_FILE: &str = "meta.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Its own files are missing, truncated or garbled.
    Damaged,
    /// Something it needs outside its folder (its tokenizer file) is missing or unreadable; its
    /// own data is intact.
    Offline,
}

/// Why a collection cannot serve: which file, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub path: PathBuf,
    pub cause: String,
}

impl Fault {
    pub fn damaged(path: impl Into<PathBuf>, cause: impl fmt::Display) -> Self {
        Self::new(FaultKind::Damaged, path, cause)
    }

    pub fn offline(path: impl Into<PathBuf>, cause: impl fmt::Display) -> Self {
        Self::new(FaultKind::Offline, path, cause)
    }

    /// `path` could not be read: OFFLINE when the server may not read it (the data is intact as
    /// far as anyone can tell, and the fix is a permission), else DAMAGED.
    pub fn unreadable(path: impl Into<PathBuf>, error: &std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::PermissionDenied {
            Self::offline(path, permission_denied(error))
        } else {
            Self::damaged(path, error)
        }
    }

    fn new(kind: FaultKind, path: impl Into<PathBuf>, cause: impl fmt::Display) -> Self {
        Self {
            kind,
            path: path.into(),
            cause: bounded(&cause.to_string()),
        }
    }

    /// What a call to the collection `name` answers.
    pub fn error(&self, name: &str) -> LatheError {
        let (name, path, cause) = (name.to_string(), self.path.clone(), self.cause.clone());
        match self.kind {
            FaultKind::Damaged => LatheError::CollectionDamaged {
                name,
                documents: Vec::new(),
                path,
                cause,
            },
            FaultKind::Offline => LatheError::CollectionOffline { name, path, cause },
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.cause)
    }
}

/// The cause of a read the filesystem refused, with the fix.
fn permission_denied(error: &std::io::Error) -> String {
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    format!(
        "{error}: the server (user id {uid}) may not read it; give that user read and write \
         access to the collection's folder (chown or chmod), then restart"
    )
}

/// A file or folder of an index folder (tantivy's, or the dense one) the server may not read,
/// if any: a permission is not damage.
fn find_unreadable(index_dir: &Path) -> Option<Fault> {
    let listing = match std::fs::read_dir(index_dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            return Some(Fault::unreadable(index_dir, &error));
        }
        Err(_) => return None,
    };
    listing.flatten().find_map(|entry| {
        let path = entry.path();
        let opened = if path.is_dir() {
            std::fs::read_dir(&path).map(drop)
        } else {
            std::fs::File::open(&path).map(drop)
        };
        match opened {
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
                Some(Fault::unreadable(&path, &error))
            }
            _ => None,
        }
    })
}

/// The index metadata must be there and be JSON before tantivy is asked to open the index.
pub(super) fn check_index_meta(index_dir: &Path) -> Result<(), Fault> {
    let path = index_dir.join(META_FILE);
    let bytes = std::fs::read(&path).map_err(|error| Fault::unreadable(&path, &error))?;
    if bytes.is_empty() {
        return Err(Fault::damaged(&path, "the file is empty"));
    }
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .map(|_| ())
        .map_err(|error| Fault::damaged(&path, format!("not valid JSON: {error}")))
}

/// Names the file that made opening the index fail. tantivy's errors do not always name it: the
/// files of the live segments are checked against the checksums in their footers.
pub(super) fn diagnose_index(index_dir: &Path, error: &LatheError) -> Fault {
    // The dense index beside it (`<collection>/dense/`) is opened with it.
    let dense_dir = index_dir
        .parent()
        .map(|collection| collection.join("dense"));
    let unreadable = std::iter::once(index_dir)
        .chain(dense_dir.as_deref())
        .find_map(find_unreadable);
    if let Some(fault) = unreadable {
        return fault;
    }
    let opening = format!("opening the index failed: {error}");
    let Ok(index) = tantivy::Index::open_in_dir(index_dir) else {
        return Fault::damaged(index_dir, opening);
    };
    let segment_ids: Vec<String> = index
        .searchable_segment_ids()
        .map(|ids| ids.iter().map(|id| id.uuid_string()).collect())
        .unwrap_or_default();
    let Ok(listing) = std::fs::read_dir(index_dir) else {
        return Fault::damaged(index_dir, opening);
    };
    let mut segment_files: Vec<PathBuf> = listing
        .filter_map(|item| item.ok().map(|item| PathBuf::from(item.file_name())))
        .filter(|file| {
            let name = file.to_string_lossy();
            segment_ids.iter().any(|id| name.starts_with(id.as_str()))
        })
        .collect();
    segment_files.sort();
    for file in segment_files {
        let cause = match index.directory().validate_checksum(&file) {
            Ok(true) => continue,
            Ok(false) => {
                "its contents do not match the checksum in its footer (truncated or altered)"
                    .to_string()
            }
            Err(tantivy::directory::error::OpenReadError::IoError { io_error, .. }) => {
                format!("its footer cannot be read (truncated or altered): {io_error}")
            }
            Err(read_error) => format!("unreadable: {read_error}"),
        };
        return Fault::damaged(index_dir.join(file), cause);
    }
    Fault::damaged(index_dir, opening)
}

/// `text`, cut to [`MAX_CAUSE_CHARS`] characters.
fn bounded(text: &str) -> String {
    if text.chars().count() <= MAX_CAUSE_CHARS {
        return text.to_string();
    }
    let mut kept: String = text.chars().take(MAX_CAUSE_CHARS).collect();
    kept.push('…');
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_causes_are_cut() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(MAX_CAUSE_CHARS + 10);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), MAX_CAUSE_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
