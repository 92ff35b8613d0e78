//! What went wrong when a collection's files could not be written. Tantivy reports a full disk
//! as "An IO error occurred", a read-only filesystem as "Failed to acquire Lockfile", and wraps
//! the operating system's error in half a dozen variants, some with the file's path; this finds
//! the `io::Error` at the root and turns it into [`LatheError::Storage`], which names the
//! collection, the file (or the index folder) and the cause, and maps to a status a client can
//! act on. [`IndexDirectory`] lets a collection on a read-only filesystem still be opened and
//! read.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tantivy::directory::error::{
    DeleteError, LockError, OpenDirectoryError, OpenReadError, OpenWriteError,
};
use tantivy::directory::{
    Directory, DirectoryLock, FileHandle, FileSlice, Lock, MmapDirectory, META_LOCK,
};
use tantivy::TantivyError;

use super::managed_list::ManagedList;
use super::store_reads::{is_doc_store, DocStoreHandle};
use crate::error::{LatheError, StorageFault};

/// Tantivy's index writer lock, the first file a writer opens for writing.
const WRITER_LOCK_FILE: &str = ".tantivy-writer.lock";

/// `error`, met while writing the index in `folder` of `collection`, as a storage error when an
/// I/O error is at its root; other errors are returned as they are.
pub fn write_error(collection: &str, folder: &Path, error: TantivyError) -> LatheError {
    let Some((io_error, file)) = io_root(&error) else {
        return match os_error_in_message(&error) {
            Some(io_error) => io_write_error(collection, folder, &io_error),
            None => LatheError::Index(error),
        };
    };
    LatheError::Storage {
        collection: collection.to_string(),
        path: match file {
            Some(file) => folder.join(file),
            None => folder.to_path_buf(),
        },
        fault: StorageFault::of(io_error),
        cause: io_error.to_string(),
    }
}

/// The same for a plain `io::Error` on `path`.
pub fn io_write_error(collection: &str, path: &Path, error: &io::Error) -> LatheError {
    LatheError::Storage {
        collection: collection.to_string(),
        path: path.to_path_buf(),
        fault: StorageFault::of(error),
        cause: error.to_string(),
    }
}

/// The `Directory` methods that a directory wrapping another (its `inner`) hands on unchanged:
/// [`IndexDirectory`] changes how the meta lock is taken and how `.managed.json` is written,
/// `VerifiedDirectory` how files are opened and deleted.
macro_rules! forward_unchanged_directory_methods {
    () => {
        fn exists(
            &self,
            path: &std::path::Path,
        ) -> Result<bool, tantivy::directory::error::OpenReadError> {
            self.inner.exists(path)
        }

        fn open_write(
            &self,
            path: &std::path::Path,
        ) -> Result<tantivy::directory::WritePtr, tantivy::directory::error::OpenWriteError> {
            self.inner.open_write(path)
        }

        fn sync_directory(&self) -> std::io::Result<()> {
            self.inner.sync_directory()
        }

        fn watch(
            &self,
            watch_callback: tantivy::directory::WatchCallback,
        ) -> tantivy::Result<tantivy::directory::WatchHandle> {
            self.inner.watch(watch_callback)
        }
    };
}
pub(super) use forward_unchanged_directory_methods;

/// A collection's index folder as tantivy sees it: an `MmapDirectory` whose meta lock is skipped
/// on a read-only filesystem. Tantivy's reader takes that lock (by creating `.tantivy-meta.lock`)
/// only so that a writer's garbage collection cannot delete segment files while it opens them;
/// nothing deletes files from a read-only filesystem, so the collection opens and serves reads,
/// and only writes fail (with the cause, see [`write_error`]). Doc-store files are handed out as
/// [`DocStoreHandle`]s, whose block reads leave nothing mapped (see `store_reads`).
/// `.managed.json` is written once for each new segment (see [`ManagedList`]), in place of its
/// spare (see [`replace_file`]).
#[derive(Clone, Debug)]
pub struct IndexDirectory {
    inner: MmapDirectory,
    root: PathBuf,
    /// Held while `.managed.json` or its spare is written or read: the spare of one write is the
    /// file a read may have open.
    managed_file: Arc<Mutex<ManagedList>>,
}

/// Tantivy's list of the files it manages, which it rewrites for each file it creates.
const MANAGED_FILE: &str = ".managed.json";

impl IndexDirectory {
    pub fn open(path: &Path) -> Result<Self, OpenDirectoryError> {
        Ok(Self {
            inner: MmapDirectory::open(path)?,
            root: path.to_path_buf(),
            managed_file: Arc::default(),
        })
    }
}

impl Directory for IndexDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        let mapped = self.inner.get_file_handle(path)?;
        if !is_doc_store(path) {
            return Ok(mapped);
        }
        let handle = DocStoreHandle::open(&self.root.join(path), mapped)
            .map_err(|error| OpenReadError::wrap_io_error(error, path.to_path_buf()))?;
        Ok(Arc::new(handle))
    }

    fn open_read(&self, path: &Path) -> Result<FileSlice, OpenReadError> {
        Ok(FileSlice::new(self.get_file_handle(path)?))
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.inner.delete(path)
    }

    forward_unchanged_directory_methods!();

    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        if path != Path::new(MANAGED_FILE) {
            return self.inner.atomic_write(path, data);
        }
        let mut managed = self.managed_file.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.root.join(path);
        managed.replace(&path, data, |data| replace_file(&path, data))
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        let _managed = (path == Path::new(MANAGED_FILE))
            .then(|| self.managed_file.lock().unwrap_or_else(|p| p.into_inner()));
        self.inner.atomic_read(path)
    }

    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        match self.inner.acquire_lock(lock) {
            Err(LockError::IoError(error))
                if lock.filepath == META_LOCK.filepath
                    && error.kind() == io::ErrorKind::ReadOnlyFilesystem =>
            {
                Ok(DirectoryLock::from(Box::new(())))
            }
            result => result,
        }
    }
}

/// Replaces the file `path` with `data`, atomically and durably (once its folder is synced, as
/// after tantivy's own atomic write), without taking a new inode: `data` is written into the
/// file's spare (`<path>.spare`: the version before, or a new file the first time) and synced,
/// and the spare is swapped with `path` by one `renameat2(RENAME_EXCHANGE)`. A crash leaves
/// `path` whole, old or new. Tantivy rewrites `.managed.json` once for each file a commit creates;
/// its own atomic write (a new temporary file renamed over the old one) frees an inode each time,
/// and ext4 without a journal scans past every inode freed in the last 30 s when it allocates
/// one: a server creating many small collections spent a fifth of its CPU in that scan. Where
/// `path` does not exist yet, or the filesystem cannot exchange, the spare is renamed into place.
/// The caller makes sure that no one else writes or reads `path` or its spare meanwhile.
fn replace_file(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut spare = path.as_os_str().to_owned();
    spare.push(".spare");
    let spare = PathBuf::from(spare);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&spare)?;
    file.write_all(data)?;
    file.sync_data()?;
    drop(file);
    match exchange(&spare, path) {
        Err(error)
            if error.kind() == io::ErrorKind::NotFound
                || matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) =>
        {
            std::fs::rename(&spare, path)
        }
        result => result,
    }
}

/// Swaps the directory entries `a` and `b` atomically (both must exist).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = |path: &Path| {
        std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
    };
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let done = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The operating system's error that tantivy turned into text: its segment plugins (the postings,
/// the doc store) report a failed write as `InternalError("No space left on device (os error
/// 28)")`, so the code is read back from the text, the one place it is left.
fn os_error_in_message(error: &TantivyError) -> Option<io::Error> {
    let TantivyError::InternalError(message) = error else {
        return None;
    };
    let (_, code) = message.rsplit_once("(os error ")?;
    let code = code.split_once(')')?.0.parse().ok()?;
    Some(io::Error::from_raw_os_error(code))
}

/// The I/O error inside `error`, with the file it concerns when tantivy says (relative to the
/// index folder, or absolute).
fn io_root(error: &TantivyError) -> Option<(&io::Error, Option<PathBuf>)> {
    Some(match error {
        TantivyError::IoError(io_error) => (io_error.as_ref(), None),
        TantivyError::OpenWriteError(OpenWriteError::IoError { io_error, filepath })
        | TantivyError::OpenReadError(OpenReadError::IoError { io_error, filepath }) => {
            (io_error.as_ref(), Some(filepath.clone()))
        }
        TantivyError::OpenDirectoryError(OpenDirectoryError::IoError {
            io_error,
            directory_path,
        }) => (io_error.as_ref(), Some(directory_path.clone())),
        TantivyError::LockFailure(LockError::IoError(io_error), _) => {
            (io_error.as_ref(), Some(PathBuf::from(WRITER_LOCK_FILE)))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;

    fn os_error(code: i32) -> Arc<io::Error> {
        Arc::new(io::Error::from_raw_os_error(code))
    }

    #[test]
    fn a_full_disk_names_the_file_and_the_cause() {
        let error = TantivyError::OpenWriteError(OpenWriteError::IoError {
            io_error: os_error(28),
            filepath: PathBuf::from("abc.idx"),
        });
        let LatheError::Storage {
            collection,
            path,
            fault,
            cause,
        } = write_error("docs", Path::new("/data/collections/docs/index"), error)
        else {
            panic!("not a storage error");
        };
        assert_eq!(collection, "docs");
        assert_eq!(path, Path::new("/data/collections/docs/index/abc.idx"));
        assert_eq!(fault, StorageFault::Full);
        assert!(cause.contains("No space left on device"), "{cause}");
    }

    #[test]
    fn a_read_only_filesystem_at_the_lock_names_the_lock_file() {
        let error = TantivyError::LockFailure(LockError::IoError(os_error(30)), None);
        let error = write_error("docs", Path::new("/d/index"), error);
        assert!(
            matches!(
                &error,
                LatheError::Storage { path, fault: StorageFault::ReadOnly, .. }
                    if path == Path::new("/d/index/.tantivy-writer.lock")
            ),
            "{error:?}"
        );
    }

    #[test]
    fn permission_errors_and_plain_io_errors_are_classified() {
        for (code, expected) in [
            (1, StorageFault::PermissionDenied),
            (13, StorageFault::PermissionDenied),
            (122, StorageFault::Full),
            (5, StorageFault::Other),
        ] {
            let error = write_error(
                "docs",
                Path::new("/d"),
                TantivyError::IoError(os_error(code)),
            );
            assert!(
                matches!(&error, LatheError::Storage { fault, path, .. } if *fault == expected && path == Path::new("/d")),
                "os error {code}: {error:?}"
            );
        }
    }

    #[test]
    fn an_os_error_that_tantivy_turned_into_text_is_a_storage_error_of_the_folder() {
        let error = write_error(
            "docs",
            Path::new("/d/index"),
            TantivyError::InternalError("No space left on device (os error 28)".into()),
        );
        assert!(
            matches!(&error, LatheError::Storage { fault: StorageFault::Full, path, cause, .. }
                if path == Path::new("/d/index") && cause.contains("No space left")),
            "{error:?}"
        );
        let other = write_error(
            "docs",
            Path::new("/d"),
            TantivyError::InternalError("a bucket of another kind".into()),
        );
        assert!(matches!(other, LatheError::Index(_)), "{other:?}");
    }

    #[test]
    fn errors_without_an_io_root_stay_index_errors() {
        let error = write_error(
            "docs",
            Path::new("/d"),
            TantivyError::InvalidArgument("x".into()),
        );
        assert!(matches!(error, LatheError::Index(_)), "{error:?}");
    }

    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_replaced_file_holds_each_new_content_and_takes_no_new_inode_after_its_second_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(MANAGED_FILE);
        let spare = dir.path().join(".managed.json.spare");
        replace_file(&path, b"first").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        replace_file(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        // The spare holds the version before, whole.
        assert_eq!(std::fs::read(&spare).unwrap(), b"first");
        let inodes = [inode(&path), inode(&spare)];
        for round in 0..6 {
            let content = format!("version {round}");
            replace_file(&path, content.as_bytes()).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), content.as_bytes());
            let mut now = [inode(&path), inode(&spare)];
            now.sort_unstable();
            let mut before = inodes;
            before.sort_unstable();
            assert_eq!(
                now, before,
                "round {round}: the two files swap, no inode is new"
            );
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }

    #[test]
    fn an_index_whose_managed_list_is_written_ahead_commits_merges_collects_and_opens_again() {
        use tantivy::schema::{Schema, TEXT};
        let dir = tempfile::tempdir().unwrap();
        let mut builder = Schema::builder();
        let text = builder.add_text_field("text", TEXT);
        let schema = builder.build();
        let index = tantivy::Index::create(
            IndexDirectory::open(dir.path()).unwrap(),
            schema,
            tantivy::IndexSettings::default(),
        )
        .unwrap();
        let mut writer: tantivy::IndexWriter = index.writer(15_000_000).unwrap();
        writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
        for round in 0..3 {
            writer
                .add_document(tantivy::doc!(text => format!("note {round}")))
                .unwrap();
            writer.commit().unwrap();
        }
        let managed = || -> BTreeSet<String> {
            serde_json::from_slice(&std::fs::read(dir.path().join(MANAGED_FILE)).unwrap()).unwrap()
        };
        let segment_files = || -> BTreeSet<String> {
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .filter(|name| !name.starts_with('.') && name != "meta.json")
                .collect()
        };
        assert!(
            segment_files().is_subset(&managed()),
            "every file is listed"
        );
        let segments = index.searchable_segment_ids().unwrap();
        assert_eq!(segments.len(), 3);
        writer.merge(&segments).wait().unwrap();
        writer.garbage_collect_files().wait().unwrap();
        writer.wait_merging_threads().unwrap();
        let files = segment_files();
        assert_eq!(files.len(), 6, "one segment left: {files:?}");
        assert!(files.is_subset(&managed()));
        drop(index);
        let reopened = tantivy::Index::open(IndexDirectory::open(dir.path()).unwrap()).unwrap();
        assert_eq!(reopened.reader().unwrap().searcher().num_docs(), 3);
        let writer: tantivy::IndexWriter = reopened.writer(15_000_000).unwrap();
        writer.garbage_collect_files().wait().unwrap();
        assert_eq!(segment_files(), files);
        let mut listed = managed();
        listed.remove("meta.json");
        assert_eq!(
            listed, files,
            "the merged segments' names are gone from the list"
        );
    }
}
