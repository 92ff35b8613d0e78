//! What went wrong when a collection's files could not be written. Tantivy reports a full disk
//! as "An IO error occurred", a read-only filesystem as "Failed to acquire Lockfile", and wraps
//! the operating system's error in half a dozen variants, some with the file's path; this finds
//! the `io::Error` at the root and turns it into [`LatheError::Storage`], which names the
//! collection, the file (or the index folder) and the cause, and maps to a status a client can
//! act on. [`IndexDirectory`] lets a collection on a read-only filesystem still be opened and
//! read.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::directory::error::{
    DeleteError, LockError, OpenDirectoryError, OpenReadError, OpenWriteError,
};
use tantivy::directory::{
    Directory, DirectoryLock, FileHandle, FileSlice, Lock, MmapDirectory, META_LOCK,
};
use tantivy::TantivyError;

use super::store_reads::{is_doc_store, DocStoreHandle};
use crate::error::{LatheError, StorageFault};

/// Tantivy's index writer lock, the first file a writer opens for writing.
const WRITER_LOCK_FILE: &str = ".tantivy-writer.lock";

/// `error`, met while writing the index in `folder` of `collection`, as a storage error when an
/// I/O error is at its root; other errors are returned as they are.
pub fn write_error(collection: &str, folder: &Path, error: TantivyError) -> LatheError {
    let Some((io_error, file)) = io_root(&error) else {
        return LatheError::Index(error);
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
/// [`IndexDirectory`] changes only how the meta lock is taken, `VerifiedDirectory` only how
/// files are opened and deleted.
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

        fn atomic_read(
            &self,
            path: &std::path::Path,
        ) -> Result<Vec<u8>, tantivy::directory::error::OpenReadError> {
            self.inner.atomic_read(path)
        }

        fn atomic_write(&self, path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
            self.inner.atomic_write(path, data)
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
#[derive(Clone, Debug)]
pub struct IndexDirectory {
    inner: MmapDirectory,
    root: PathBuf,
}

impl IndexDirectory {
    pub fn open(path: &Path) -> Result<Self, OpenDirectoryError> {
        Ok(Self {
            inner: MmapDirectory::open(path)?,
            root: path.to_path_buf(),
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
    fn errors_without_an_io_root_stay_index_errors() {
        let error = write_error(
            "docs",
            Path::new("/d"),
            TantivyError::InvalidArgument("x".into()),
        );
        assert!(matches!(error, LatheError::Index(_)), "{error:?}");
    }
}
