//! Snapshots of collections, taken while they serve, and restores from them.
//!
//! A snapshot is one file, `data_dir/snapshots/<collection>/<collection>-g<generation>-<unix
//! ms>.snapshot` (the format is `archive`'s), written as `.partial-<name>` beside it, synced and
//! renamed into place, so a listed snapshot is always whole. Taking one locks nothing: the
//! collection's latest commit is opened file by file (`CollectionIndex::backup_files`) and
//! streamed into the archive while reads and writes go on.
//!
//! A restore extracts the archive into `data_dir/snapshots/.restoring-<name>-<nanos>`, checks it
//! whole (every file against the manifest), and only then renames the folder into the
//! collections folder, under the same lock as a create: a damaged or truncated snapshot is
//! refused naming its file, and nothing appears. Both kinds of leftover of a crash (`.partial-`,
//! `.restoring-`) are removed at start.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::archive::{extract_archive, write_archive, Header, SnapshotManifest};
use super::folders::{read_settings, sync_dir, write_settings, INDEX_DIR, SETTINGS_FILE};
use super::{Catalog, OpenCollection, StoredSettings};
use crate::error::{LatheError, Result};

pub(super) const SNAPSHOTS_DIR: &str = "snapshots";
const EXTENSION: &str = ".snapshot";
const PARTIAL_PREFIX: &str = ".partial-";
const RESTORING_PREFIX: &str = ".restoring-";
/// Snapshot files are written through a buffer this large.
const WRITE_BUFFER: usize = 1 << 20;

/// One snapshot file, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub collection: String,
    pub name: String,
    pub bytes: u64,
    pub generation: u64,
    pub created_unix_ms: u64,
}

/// A snapshot just taken: its listing and what it holds.
pub struct TakenSnapshot {
    pub info: SnapshotInfo,
    pub files: usize,
}

impl<T> Catalog<T> {
    fn snapshots_root(&self) -> PathBuf {
        self.root.parent().unwrap_or(&self.root).join(SNAPSHOTS_DIR)
    }

    /// Writes a snapshot of the collection's latest commit (see the module doc).
    pub fn create_snapshot(&self, collection: &str) -> Result<TakenSnapshot> {
        let open = self.get(collection)?;
        let settings = serde_json::to_vec_pretty(&open.settings)
            .map_err(|e| LatheError::internal(format!("encoding the settings: {e}")))?;
        let backup = open.index.backup_files()?;
        let created_unix_ms = now_unix_ms();
        let name = format!(
            "{collection}-g{}-{created_unix_ms}{EXTENSION}",
            backup.generation
        );
        let dir = self.snapshots_root().join(collection);
        let io = |what: &str, path: &Path, error: std::io::Error| {
            LatheError::io(format!("{what} {}", path.display()), error)
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        let partial = dir.join(format!("{PARTIAL_PREFIX}{name}"));
        let target = dir.join(&name);
        let header = Header {
            collection,
            settings: &settings,
            created_unix_ms,
        };
        let written = std::fs::File::create_new(&partial)
            .and_then(|file| {
                let mut out = BufWriter::with_capacity(WRITE_BUFFER, file);
                let manifest = write_archive(&mut out, &header, backup)?;
                let file = out.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                Ok((manifest, file.metadata()?.len()))
            })
            .and_then(|written| {
                if target.exists() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "a snapshot of this name was taken in the same millisecond",
                    ));
                }
                std::fs::rename(&partial, &target)?;
                Ok(written)
            });
        let (manifest, bytes) = match written {
            Ok(written) => written,
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                return Err(io("writing the snapshot", &target, error));
            }
        };
        sync_dir(&dir)?;
        Ok(TakenSnapshot {
            info: SnapshotInfo {
                collection: collection.to_string(),
                name,
                bytes,
                generation: manifest.generation,
                created_unix_ms,
            },
            files: manifest.files.len(),
        })
    }

    /// The snapshots of `collection` (all collections' when `None`), newest first within each
    /// collection; a snapshot stays when its collection is deleted.
    pub fn list_snapshots(&self, collection: Option<&str>) -> Result<Vec<SnapshotInfo>> {
        let root = self.snapshots_root();
        let folders: Vec<String> = match collection {
            Some(name) => vec![name.to_string()],
            None => list_names(&root)?
                .into_iter()
                .filter(|name| super::is_valid_collection_name(name))
                .collect(),
        };
        let mut listed = Vec::new();
        for folder in folders {
            let mut found: Vec<SnapshotInfo> = list_names(&root.join(&folder))?
                .into_iter()
                .filter_map(|name| {
                    let (generation, created_unix_ms) = parse_name(&folder, &name)?;
                    let bytes = std::fs::metadata(root.join(&folder).join(&name))
                        .ok()?
                        .len();
                    Some(SnapshotInfo {
                        collection: folder.clone(),
                        name,
                        bytes,
                        generation,
                        created_unix_ms,
                    })
                })
                .collect();
            found.sort_by_key(|info| std::cmp::Reverse(info.created_unix_ms));
            listed.extend(found);
        }
        Ok(listed)
    }

    /// The path of an existing snapshot file, or NOT_FOUND naming it.
    pub fn snapshot_path(&self, collection: &str, name: &str) -> Result<PathBuf> {
        let path = self.snapshots_root().join(collection).join(name);
        if parse_name(collection, name).is_some() && path.is_file() {
            Ok(path)
        } else {
            Err(LatheError::NotFound(format!(
                "snapshot `{name}` of collection `{collection}` not found"
            )))
        }
    }

    pub fn delete_snapshot(&self, collection: &str, name: &str) -> Result<()> {
        let path = self.snapshot_path(collection, name)?;
        std::fs::remove_file(&path)
            .map_err(|e| LatheError::io(format!("removing {}", path.display()), e))?;
        sync_dir(path.parent().unwrap_or(&path))
    }

    /// Creates collection `name` from the snapshot read from `input` (`label` names it in
    /// errors); `attach` builds the service's part from the snapshot's settings. All or
    /// nothing (see the module doc).
    pub fn restore(
        &self,
        name: &str,
        input: impl Read,
        label: &str,
        attach: impl FnOnce(&StoredSettings) -> Result<T>,
    ) -> Result<(Arc<OpenCollection<T>>, SnapshotManifest)> {
        // Checked again when the name is reserved, before the rename; here so as not to read a
        // whole upload for a name already taken.
        self.check_name_free(name)?;
        let root = self.snapshots_root();
        std::fs::create_dir_all(&root)
            .map_err(|e| LatheError::io(format!("creating {}", root.display()), e))?;
        let staging = root.join(format!("{RESTORING_PREFIX}{name}-{}", now_unix_nanos()));
        let prepared = prepare(&staging, input, label).and_then(|(settings, manifest)| {
            let extra = attach(&settings)?;
            Ok((settings, manifest, extra))
        });
        let (settings, manifest, extra) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(error);
            }
        };
        let open = self.adopt(name, &staging, settings, extra);
        let _ = std::fs::remove_dir_all(&staging);
        Ok((open?, manifest))
    }

    /// Publishes a prepared collection folder as `create` publishes the folder it builds.
    fn adopt(
        &self,
        name: &str,
        prepared: &Path,
        settings: StoredSettings,
        extra: T,
    ) -> Result<Arc<OpenCollection<T>>> {
        let reserved = self.reserve(name)?;
        self.publish(&reserved, prepared, settings, extra)
    }
}

/// Extracts the snapshot read from `input` into `staging` (which must not exist) and checks it
/// whole, as a restore does, without making it a collection: for a tool that reads a snapshot
/// outside any data dir (`lathe export`). Returns the manifest and the extracted index folder. A
/// damaged or cut-short snapshot is [`LatheError::SnapshotDamaged`] naming `label` and its file;
/// the caller removes `staging` either way.
pub fn extract_snapshot(
    input: impl Read,
    staging: &Path,
    label: &str,
) -> Result<(SnapshotManifest, PathBuf)> {
    let manifest =
        extract_archive(input, staging).map_err(|refusal| LatheError::SnapshotDamaged {
            snapshot: label.to_string(),
            file: refusal.file,
            cause: refusal.cause,
        })?;
    Ok((manifest, staging.join(INDEX_DIR)))
}

/// Extracts and checks the snapshot into `staging`, and makes it a collection folder of this
/// server: its settings as a collection of this node's own, and tantivy told that the extracted
/// files are its to collect once merged away.
fn prepare(
    staging: &Path,
    input: impl Read,
    label: &str,
) -> Result<(StoredSettings, SnapshotManifest)> {
    let (manifest, index) = extract_snapshot(input, staging, label)?;
    let mut settings = read_settings(staging).map_err(|fault| LatheError::SnapshotDamaged {
        snapshot: label.to_string(),
        file: SETTINGS_FILE.to_string(),
        cause: fault.cause,
    })?;
    // Restored here, it belongs to this node, not to a replicated log it may have come from.
    settings.log_created = None;
    let written = write_settings(staging, &settings).and_then(|()| {
        let names: Vec<String> = list_names(&index)
            .map_err(std::io::Error::other)?
            .into_iter()
            .filter(|name| name != "meta.json")
            .collect();
        let mut managed = serde_json::to_vec(&names)?;
        managed.push(b'\n');
        let mut file = std::fs::File::create(index.join(".managed.json"))?;
        file.write_all(&managed)?;
        file.sync_all()
    });
    written.map_err(|e| LatheError::io(format!("preparing {}", staging.display()), e))?;
    Ok((settings, manifest))
}

/// Removes what a crash left of a snapshot being written or a restore being prepared.
pub(super) fn remove_snapshot_leftovers(data_dir: &Path) {
    let root = data_dir.join(SNAPSHOTS_DIR);
    let Ok(names) = list_names(&root) else {
        return;
    };
    for name in names {
        let path = root.join(&name);
        if name.starts_with(RESTORING_PREFIX) {
            remove_logged(&path, std::fs::remove_dir_all(&path));
        } else if super::is_valid_collection_name(&name) {
            for file in list_names(&path).unwrap_or_default() {
                if file.starts_with(PARTIAL_PREFIX) && file.ends_with(EXTENSION) {
                    let partial = path.join(file);
                    remove_logged(&partial, std::fs::remove_file(&partial));
                }
            }
        }
    }
}

fn remove_logged(path: &Path, removed: std::io::Result<()>) {
    match removed {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed the leftover of an unfinished snapshot or restore")
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "removing the leftover of an unfinished snapshot or restore failed")
        }
    }
}

/// The generation and creation time a snapshot's name holds, if it is one of `collection`'s.
fn parse_name(collection: &str, name: &str) -> Option<(u64, u64)> {
    let rest = name
        .strip_prefix(collection)?
        .strip_prefix("-g")?
        .strip_suffix(EXTENSION)?;
    let (generation, created) = rest.split_once('-')?;
    Some((generation.parse().ok()?, created.parse().ok()?))
}

/// The names in a folder (none when it does not exist).
fn list_names(dir: &Path) -> Result<Vec<String>> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(LatheError::io(format!("listing {}", dir.display()), error)),
    };
    let mut names = Vec::new();
    for item in listing {
        let item = item.map_err(|e| LatheError::io(format!("listing {}", dir.display()), e))?;
        if let Ok(name) = item.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

fn now_unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open_catalog, record, settings};
    use super::*;
    use crate::index::collection::WriteOp;

    fn written(catalog: &Catalog<()>, name: &str, texts: &[&str]) {
        catalog.create(name, settings(), ()).unwrap();
        let index = &catalog.get(name).unwrap().index;
        let ops = texts
            .iter()
            .enumerate()
            .map(|(i, text)| WriteOp::Upsert(record(&format!("d{i}"), text)))
            .collect();
        let done = index.write(ops, true).unwrap().unwrap();
        done.blocking_recv().unwrap().unwrap();
    }

    #[test]
    fn a_restore_gives_the_commit_and_a_crash_leaves_nothing_listed_or_created() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        written(&catalog, "docs", &["lathes turn wood", "mills cut metal"]);
        let taken = catalog.create_snapshot("docs").unwrap();
        let path = catalog.snapshot_path("docs", &taken.info.name).unwrap();
        let (restored, manifest) = catalog
            .restore("copy", std::fs::File::open(&path).unwrap(), "test", |_| {
                Ok(())
            })
            .unwrap();
        assert_eq!(manifest.generation, taken.info.generation);
        assert_eq!(restored.index.snapshot().generation, taken.info.generation);
        assert_eq!(restored.index.stats().unwrap().documents, 2);
        // A name taken (by a collection) refuses the restore before reading it.
        let refused = catalog.restore("docs", std::fs::File::open(&path).unwrap(), "test", |_| {
            Ok(())
        });
        assert!(matches!(refused, Err(LatheError::CollectionExists { .. })));
        catalog.shutdown();
        drop((catalog, restored));

        // What a kill -9 leaves: a snapshot half written, a restore half extracted.
        let root = dir.path().join(SNAPSHOTS_DIR);
        let partial = root
            .join("docs")
            .join(format!("{PARTIAL_PREFIX}docs-g9-1{EXTENSION}"));
        std::fs::write(&partial, b"half").unwrap();
        let restoring = root.join(format!("{RESTORING_PREFIX}other-1"));
        std::fs::create_dir_all(restoring.join(INDEX_DIR)).unwrap();
        let kept = root.join("docs").join("notes.txt");
        std::fs::write(&kept, b"an operator's").unwrap();
        let catalog = open_catalog(dir.path());
        assert!(!partial.exists() && !restoring.exists() && kept.exists());
        let listed = catalog.list_snapshots(None).unwrap();
        assert_eq!(listed, [taken.info]);
        let names: Vec<String> = catalog
            .entries()
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(names, ["copy", "docs"]);
        catalog.shutdown();
    }
}
