//! Nothing read from a collection's files is trusted until it is verified.
//!
//! Two checks, at two grains:
//! - **Files**: tantivy ends every segment file with a footer holding the CRC32 of its contents
//!   (`tantivy::directory::footer`). [`VerifiedDirectory`] checks that checksum the first time
//!   the process opens a file for reading, before tantivy parses any byte of it, so no damaged
//!   file reaches tantivy's decoders (whose lengths are trusted: a damaged doc store once made
//!   one reserve 21 PB and abort the process). Segment files are immutable and their names are
//!   never reused, so once per file per process suffices: a collection's files are verified when
//!   it opens, and each new segment (commit, merge) when the reader first opens it. The checksum
//!   is computed from plain reads of the file into a bounded buffer, not through tantivy's memory
//!   map: reading every byte through the map would leave the whole index resident in the
//!   process (counted in its RSS as file pages) after every open, while tantivy itself touches
//!   only the pages a query needs.
//! - **Sections**: every stored section carries a BLAKE3 checksum of all it stores
//!   (`section_document::StoredSection`), verified on every read. This is what catches a file changed in
//!   place after it was verified (it is memory-mapped), or a CRC32 collision.
//!
//! What is found goes to the collection's [`Integrity`] record, which the catalog reads through
//! `CollectionIndex::damage`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tantivy::directory::error::{DeleteError, LockError, OpenReadError};
use tantivy::directory::footer::Footer;
use tantivy::directory::{Directory, DirectoryLock, FileHandle, FileSlice, Lock, MmapDirectory};

/// Findings kept word for word; past this only their number grows.
const KEPT_FINDINGS: usize = 16;
/// Distinct findings remembered so that each is logged and counted once; past this a repeated
/// finding is logged and counted again (only a collection damaged in this many places gets there).
const REMEMBERED_FINDINGS: usize = 1024;

/// What this process found wrong with one collection's stored data.
#[derive(Debug)]
pub struct Integrity {
    collection: String,
    findings: Mutex<Findings>,
}

#[derive(Debug, Default)]
struct Findings {
    /// The first findings, in the order found.
    kept: Vec<String>,
    /// Distinct findings (up to `REMEMBERED_FINDINGS`), so that each is logged once.
    seen: HashSet<String>,
    /// Distinct findings, including those no longer kept word for word.
    count: usize,
    /// While the collection opens, findings are not logged: any of them refuses the open, and
    /// the catalog logs that once, naming the file and the cause.
    opening: bool,
}

impl Integrity {
    pub fn new(collection: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            collection: collection.into(),
            findings: Mutex::new(Findings::default()),
        })
    }

    /// An `Integrity` for a collection being opened: its findings are kept but not logged
    /// until [`Integrity::opened`] (a finding refuses the open, which the catalog logs).
    pub fn opening(collection: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            collection: collection.into(),
            findings: Mutex::new(Findings {
                opening: true,
                ..Findings::default()
            }),
        })
    }

    /// The collection opened with nothing found: findings from now on are logged.
    pub fn opened(&self) {
        self.findings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .opening = false;
    }

    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// Records that something stored failed verification; the first time a finding is made it
    /// is logged (a damaged section read by every query would otherwise flood the log).
    pub fn record(&self, finding: String) {
        let mut findings = self.findings.lock().unwrap_or_else(|p| p.into_inner());
        if findings.seen.contains(&finding) {
            return;
        }
        if !findings.opening {
            tracing::error!(collection = %self.collection, %finding, "damaged data found");
        }
        findings.count += 1;
        if findings.seen.len() < REMEMBERED_FINDINGS {
            findings.seen.insert(finding.clone());
        }
        if findings.kept.len() < KEPT_FINDINGS {
            findings.kept.push(finding);
        }
    }

    /// `None` while everything verified so far was intact; else the first finding, and how
    /// many more there were.
    pub fn damage(&self) -> Option<String> {
        let findings = self.findings.lock().unwrap_or_else(|p| p.into_inner());
        let first = findings.kept.first()?;
        Some(match findings.count - 1 {
            0 => first.clone(),
            more => format!("{first} (and {more} more)"),
        })
    }
}

/// A memory-mapped directory that verifies each file's footer checksum before handing it to
/// tantivy (see the module doc). A file that fails is recorded in the collection's
/// [`Integrity`] and refused with an error naming it, every time it is asked for.
#[derive(Clone)]
pub struct VerifiedDirectory<D = MmapDirectory> {
    inner: D,
    /// The folder `inner` holds its files in: checksums are computed from reads of the files
    /// there, not through `inner`'s memory maps (see the module doc).
    root: PathBuf,
    state: Arc<VerifiedState>,
}

struct VerifiedState {
    integrity: Arc<Integrity>,
    /// Files whose checksum matched, in this process.
    verified: Mutex<HashSet<PathBuf>>,
    /// Files whose checksum did not, with why.
    damaged: Mutex<HashMap<PathBuf, String>>,
}

impl<D: fmt::Debug> fmt::Debug for VerifiedDirectory<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifiedDirectory({:?})", self.inner)
    }
}

impl<D: Directory + Clone> VerifiedDirectory<D> {
    /// `inner` reads the files of folder `root`.
    pub fn new(inner: D, root: &Path, integrity: Arc<Integrity>) -> Self {
        Self {
            inner,
            root: root.to_path_buf(),
            state: Arc::new(VerifiedState {
                integrity,
                verified: Mutex::new(HashSet::new()),
                damaged: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The damaged files found so far, with why, by file name.
    pub fn damaged_files(&self) -> Vec<(PathBuf, String)> {
        let damaged = self.state.damaged.lock().unwrap_or_else(|p| p.into_inner());
        let mut files: Vec<_> = damaged
            .iter()
            .map(|(path, why)| (path.clone(), why.clone()))
            .collect();
        files.sort();
        files
    }

    fn refuse(path: &Path, why: &str) -> OpenReadError {
        OpenReadError::wrap_io_error(
            io::Error::new(io::ErrorKind::InvalidData, why.to_string()),
            path.to_path_buf(),
        )
    }
}

impl<D: Directory + Clone> Directory for VerifiedDirectory<D> {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        if let Some(why) = self
            .state
            .damaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
        {
            return Err(Self::refuse(path, why));
        }
        let handle = self.inner.get_file_handle(path)?;
        let verified = self
            .state
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(path);
        if verified {
            return Ok(handle);
        }
        // Outside the locks: a large file takes a while, and two threads verifying the same new
        // file at once only repeat work.
        match verify_footer_checksum(Arc::clone(&handle), &self.root.join(path)) {
            Ok(()) => {
                self.state
                    .verified
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(path.to_path_buf());
                Ok(handle)
            }
            Err(why) => {
                self.state
                    .integrity
                    .record(format!("index file `{}` {why}", path.display()));
                self.state
                    .damaged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(path.to_path_buf(), why.clone());
                Err(Self::refuse(path, &why))
            }
        }
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        // Deleted files are never opened again (names are not reused): forget them.
        self.state
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
        self.inner.delete(path)
    }

    super::storage::forward_unchanged_directory_methods!();

    fn atomic_write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        self.inner.atomic_write(path, data)
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.inner.atomic_read(path)
    }

    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        // The mmap directory's own lock (flock), not the trait's file-exists default.
        self.inner.acquire_lock(lock)
    }
}

/// Bytes read per call while checksumming a file.
const CHECKSUM_READ_BYTES: usize = 1 << 20;

/// Checks a tantivy file's footer checksum: the CRC32 of everything before the footer. The footer
/// is read through `handle` (its last bytes only); the body from `file`, the same file on disk, in
/// reads of [`CHECKSUM_READ_BYTES`], so that checking maps nothing into the process.
fn verify_footer_checksum(handle: Arc<dyn FileHandle>, file: &Path) -> Result<(), String> {
    let file_bytes = handle.len();
    let (footer, body) = Footer::extract_footer(FileSlice::new(handle))
        .map_err(|error| format!("has no readable footer ({error})"))?;
    let crc = crc32_of_prefix(file, body.num_bytes().get_bytes() as usize, file_bytes)
        .map_err(|error| format!("cannot be read ({error})"))?;
    if crc != footer.crc {
        return Err(format!(
            "fails its checksum (its footer says crc32 {:08x}, its contents have {crc:08x})",
            footer.crc
        ));
    }
    Ok(())
}

/// The CRC32 of the first `prefix` bytes of `file`, which must hold `expected_bytes` (the length
/// of the mapped file whose footer was read).
fn crc32_of_prefix(file: &Path, prefix: usize, expected_bytes: usize) -> io::Result<u32> {
    use std::io::Read;
    let mut opened = std::fs::File::open(file)?;
    let on_disk = opened.metadata()?.len();
    if on_disk != expected_bytes as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{on_disk} bytes on disk, {expected_bytes} mapped"),
        ));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; CHECKSUM_READ_BYTES.min(prefix.max(1))];
    let mut left = prefix;
    while left > 0 {
        let wanted = left.min(buffer.len());
        opened.read_exact(&mut buffer[..wanted])?;
        hasher.update(&buffer[..wanted]);
        left -= wanted;
    }
    Ok(hasher.finalize())
}

/// Paces a scrub's reads to `bytes_per_second` (0: unpaced) and stops them once `stop` is set.
pub struct Pace<'a> {
    bytes_per_second: u64,
    started: std::time::Instant,
    read: u64,
    stop: &'a std::sync::atomic::AtomicBool,
}

impl<'a> Pace<'a> {
    pub fn new(bytes_per_second: u64, stop: &'a std::sync::atomic::AtomicBool) -> Self {
        Self {
            bytes_per_second,
            started: std::time::Instant::now(),
            read: 0,
            stop,
        }
    }

    /// Counts `bytes` read, then sleeps until the rate is kept; `false` once told to stop.
    pub fn read(&mut self, bytes: usize) -> bool {
        self.read += bytes as u64;
        if self.bytes_per_second > 0 {
            let due =
                std::time::Duration::from_secs_f64(self.read as f64 / self.bytes_per_second as f64);
            if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(ahead.min(std::time::Duration::from_secs(1)));
            }
        }
        !self.stopped()
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.read
    }
}

/// Re-verifies a tantivy file's footer checksum from plain reads, paced (a scrub): `Ok(false)`
/// when the file is gone (merged away meanwhile) or the scrub was told to stop, `Err` why it
/// fails.
pub fn scrub_tantivy_file(file: &Path, pace: &mut Pace) -> Result<bool, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut opened = match std::fs::File::open(file) {
        Ok(opened) => opened,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(format!("cannot be read ({error})")),
    };
    let unreadable = |error: io::Error| format!("cannot be read ({error})");
    let length = opened.metadata().map_err(unreadable)?.len();
    let tail_bytes = length.min(64 << 10);
    let mut tail = vec![0u8; tail_bytes as usize];
    opened
        .seek(SeekFrom::Start(length - tail_bytes))
        .and_then(|_| opened.read_exact(&mut tail))
        .map_err(unreadable)?;
    let (footer, body) = Footer::extract_footer(FileSlice::from(tail))
        .map_err(|error| format!("has no readable footer ({error})"))?;
    let prefix = length - (tail_bytes - body.num_bytes().get_bytes());
    opened.seek(SeekFrom::Start(0)).map_err(unreadable)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; CHECKSUM_READ_BYTES];
    let mut left = prefix;
    while left > 0 {
        let wanted = left.min(buffer.len() as u64) as usize;
        opened
            .read_exact(&mut buffer[..wanted])
            .map_err(unreadable)?;
        hasher.update(&buffer[..wanted]);
        left -= wanted as u64;
        if !pace.read(wanted) {
            return Ok(false);
        }
    }
    let crc = hasher.finalize();
    if crc != footer.crc {
        return Err(format!(
            "fails its checksum (its footer says crc32 {:08x}, its contents have {crc:08x})",
            footer.crc
        ));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-file index written through tantivy's own footer writer.
    fn written_file(directory: &VerifiedDirectory, name: &str, contents: &[u8]) -> PathBuf {
        use std::io::Write;
        use tantivy::directory::{ManagedDirectory, TerminatingWrite};
        let path = PathBuf::from(name);
        let managed = ManagedDirectory::wrap(Box::new(directory.clone())).unwrap();
        let mut writer = managed.open_write(&path).unwrap();
        writer.write_all(contents).unwrap();
        writer.terminate().unwrap();
        path
    }

    /// A fresh folder, verified for collection `c`.
    fn verified_folder() -> (tempfile::TempDir, Arc<Integrity>, VerifiedDirectory) {
        let folder = tempfile::tempdir().unwrap();
        let integrity = Integrity::new("c");
        let directory = VerifiedDirectory::new(
            MmapDirectory::open(folder.path()).unwrap(),
            folder.path(),
            Arc::clone(&integrity),
        );
        (folder, integrity, directory)
    }

    fn flip(folder: &Path, name: &str, position: usize) {
        let file = folder.join(name);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[position] ^= 0x20;
        std::fs::write(&file, bytes).unwrap();
    }

    #[test]
    fn an_intact_file_is_handed_out_and_verified_once() {
        let (folder, integrity, directory) = verified_folder();
        let path = written_file(&directory, "a.store", b"hazards in their line");
        let handle = directory.get_file_handle(&path).unwrap();
        assert_eq!(
            handle.len(),
            std::fs::metadata(folder.path().join("a.store"))
                .unwrap()
                .len() as usize
        );
        assert!(directory.state.verified.lock().unwrap().contains(&path));
        assert_eq!(integrity.damage(), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn verifying_a_file_reads_it_without_making_its_mapping_resident() {
        let (folder, integrity, directory) = verified_folder();
        let contents: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let path = written_file(&directory, "big.store", &contents);
        let handle = directory.get_file_handle(&path).unwrap();
        assert_eq!(integrity.damage(), None);
        let resident =
            super::super::testing::mapped_resident_bytes(&folder.path().join("big.store"))
                .expect("the handle keeps the file mapped");
        // The footer's page (and the kernel's fault-around) only, not the 8 MiB body.
        assert!(
            resident < 1 << 20,
            "{resident} bytes of the mapping resident"
        );
        // Tantivy's reads still go through the map.
        assert_eq!(handle.read_bytes(0..4).unwrap().as_slice(), &contents[..4]);
    }

    #[test]
    fn a_flipped_byte_is_refused_and_recorded_with_the_file_named() {
        let (folder, integrity, directory) = verified_folder();
        let path = written_file(&directory, "a.store", b"hazards in their line");
        flip(folder.path(), "a.store", 3);
        let error = directory.get_file_handle(&path).unwrap_err().to_string();
        assert!(error.contains("fails its checksum"), "{error}");
        assert!(error.contains("a.store"), "{error}");
        let damage = integrity.damage().unwrap();
        assert!(
            damage.starts_with("index file `a.store` fails its checksum (its footer says crc32"),
            "{damage}"
        );
        // Asked again: refused again, recorded once.
        assert!(directory.get_file_handle(&path).is_err());
        assert_eq!(integrity.damage().unwrap(), damage);
        assert_eq!(directory.damaged_files().len(), 1);
    }

    #[test]
    fn a_damaged_footer_or_a_truncated_file_is_refused() {
        let (folder, integrity, directory) = verified_folder();
        let footer_damaged = written_file(&directory, "a.idx", b"postings");
        let length = std::fs::metadata(folder.path().join("a.idx"))
            .unwrap()
            .len() as usize;
        // The footer's JSON (version and crc) sits just before its 8-byte length and magic.
        flip(folder.path(), "a.idx", length - 12);
        assert!(directory.get_file_handle(&footer_damaged).is_err());
        let truncated = written_file(&directory, "b.term", b"terms");
        std::fs::write(folder.path().join("b.term"), b"ter").unwrap();
        let error = directory
            .get_file_handle(&truncated)
            .unwrap_err()
            .to_string();
        assert!(error.contains("has no readable footer"), "{error}");
        assert_eq!(directory.damaged_files().len(), 2);
        assert!(integrity.damage().unwrap().ends_with("(and 1 more)"));
    }

    #[test]
    fn a_finding_is_recorded_once_and_findings_are_bounded() {
        let integrity = Integrity::new("c");
        integrity.record("document `a`: its stored section fails its checksum".into());
        integrity.record("document `a`: its stored section fails its checksum".into());
        assert_eq!(
            integrity.damage().unwrap(),
            "document `a`: its stored section fails its checksum"
        );
        for i in 0..100 {
            integrity.record(format!("document `{i}`: damaged"));
        }
        integrity.record("document `7`: damaged".into());
        let findings = integrity.findings.lock().unwrap();
        assert_eq!(findings.kept.len(), KEPT_FINDINGS);
        assert_eq!(findings.count, 101);
    }

    #[test]
    fn findings_while_opening_are_kept_for_the_refusal_and_logged_only_once_opened() {
        let integrity = Integrity::opening("c");
        integrity.record("index file `a.idx` fails its checksum".into());
        assert_eq!(
            integrity.damage().unwrap(),
            "index file `a.idx` fails its checksum"
        );
        assert!(integrity.findings.lock().unwrap().opening);
        integrity.opened();
        assert!(!integrity.findings.lock().unwrap().opening);
        assert!(!Integrity::new("c").findings.lock().unwrap().opening);
    }
}
