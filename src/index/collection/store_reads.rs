//! Reads of tantivy's doc store (`.store` files) that leave nothing resident in the process.
//!
//! The doc store is most of a collection's bytes (every section's text, sentence ranges and int8
//! sentence vectors: about 19 KB per section of the Debian-docs corpus, 94 % of the index), and
//! a query reads a few dozen of its blocks. Through tantivy's memory map each block read stays
//! mapped and resident, counted in the server's RSS as file pages: after 300 queries at 100k
//! sections, 390 MiB of store pages that the process never needs again. [`DocStoreHandle`] reads
//! a block with `pread` into a buffer instead, so the bytes live in the kernel's page cache (kept
//! or dropped as the machine needs, and shared with nothing in the process) and the buffer goes
//! once tantivy has decompressed it. Bulk reads (a merge stacking whole stores) still go through
//! the map: a copy of a whole store would cost its size in heap at once. The handle holds the
//! file's path, not an open descriptor: each block read opens the file (a few microseconds, a
//! few dozen times a query), so an idle collection keeps no file open (tests/faults_writer.rs).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::directory::{FileHandle, OwnedBytes};
use tantivy::HasLen;

/// Reads at least this long use the memory map (merges); shorter ones (doc-store blocks, about
/// 16 KB, a single huge section's block aside) are read into a buffer.
pub const MAPPED_READ_BYTES: usize = 1 << 20;

/// Whether files named like `path` are read through a [`DocStoreHandle`].
pub fn is_doc_store(path: &Path) -> bool {
    path.extension()
        .is_some_and(|extension| extension == "store")
}

/// A doc-store file: small reads with `pread`, bulk reads through `mapped` (see the module doc).
pub struct DocStoreHandle {
    path: PathBuf,
    len: usize,
    mapped: Arc<dyn FileHandle>,
}

impl std::fmt::Debug for DocStoreHandle {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DocStoreHandle")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DocStoreHandle {
    /// `mapped` is the directory's own handle of the file at `path` (the same file).
    pub fn open(path: &Path, mapped: Arc<dyn FileHandle>) -> io::Result<Self> {
        let len = mapped.len();
        let on_disk = std::fs::metadata(path)?.len();
        if on_disk != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("`{}` holds {on_disk} bytes, its map {len}", path.display()),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            len,
            mapped,
        })
    }
}

impl HasLen for DocStoreHandle {
    fn len(&self) -> usize {
        self.len
    }
}

impl FileHandle for DocStoreHandle {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        if range.start > range.end || range.end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {range:?} of a {}-byte file", self.len),
            ));
        }
        if range.len() >= MAPPED_READ_BYTES {
            return self.mapped.read_bytes(range);
        }
        let mut buffer = vec![0u8; range.len()];
        // The file cannot be opened when a merge's garbage collection deleted it while a searcher
        // still holds its segment, or when the process is out of descriptors: the map stays
        // readable (tantivy relies on that), so read through it rather than fail the query.
        let Ok(file) = File::open(&self.path) else {
            return self.mapped.read_bytes(range);
        };
        file.read_exact_at(&mut buffer, range.start as u64)?;
        Ok(OwnedBytes::new(buffer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tantivy::directory::{Directory, MmapDirectory};

    /// Resident bytes of this process's mapping of `file`; 0 if unmapped.
    fn mapped_resident_bytes(file: &Path) -> u64 {
        super::super::testing::mapped_resident_bytes(file).unwrap_or(0)
    }

    #[test]
    fn small_reads_leave_the_map_cold_and_every_read_returns_the_file_bytes() {
        let folder = tempfile::tempdir().unwrap();
        let contents: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let path = folder.path().join("a.store");
        std::fs::write(&path, &contents).unwrap();
        let directory = MmapDirectory::open(folder.path()).unwrap();
        let mapped = directory.get_file_handle(Path::new("a.store")).unwrap();
        let handle = DocStoreHandle::open(&path, mapped).unwrap();
        assert_eq!(handle.len(), contents.len());
        // Blocks all over the file, as queries read them: none of it resident through the map.
        for start in (0..contents.len() - 20_000).step_by(64 << 10) {
            let bytes = handle.read_bytes(start..start + 16_384).unwrap();
            assert_eq!(bytes.as_slice(), &contents[start..start + 16_384]);
        }
        let resident = mapped_resident_bytes(&path);
        assert!(resident < 1 << 20, "{resident} bytes of the map resident");
        assert!(handle.read_bytes(5..5).unwrap().is_empty());
        // A bulk read (a merge) goes through the map.
        let bulk = handle.read_bytes(0..contents.len()).unwrap();
        assert_eq!(bulk.as_slice(), &contents[..]);
        assert!(mapped_resident_bytes(&path) >= 4 << 20);
        assert!(handle.read_bytes(10..contents.len() + 1).is_err());
    }

    #[test]
    fn a_store_deleted_under_its_handle_is_still_read_through_the_map() {
        let folder = tempfile::tempdir().unwrap();
        let contents: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
        let path = folder.path().join("b.store");
        std::fs::write(&path, &contents).unwrap();
        let directory = MmapDirectory::open(folder.path()).unwrap();
        let mapped = directory.get_file_handle(Path::new("b.store")).unwrap();
        let handle = DocStoreHandle::open(&path, mapped).unwrap();
        std::fs::remove_file(&path).unwrap();
        let bytes = handle.read_bytes(1_000..17_384).unwrap();
        assert_eq!(bytes.as_slice(), &contents[1_000..17_384]);
    }

    #[test]
    fn only_store_files_are_read_this_way() {
        assert!(is_doc_store(Path::new("0f3a.store")));
        assert!(!is_doc_store(Path::new("0f3a.idx")));
        assert!(!is_doc_store(Path::new("meta.json")));
    }
}
