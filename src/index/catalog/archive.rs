//! The snapshot file: a tar archive of one collection's commit (`collection.json`, `index/…`,
//! `dense/…`), then `snapshot.json` (what it is and each file's length and BLAKE3) and
//! `snapshot.json.blake3` (the manifest's own checksum). The manifest comes last so that a
//! snapshot is written in one pass; a reader extracts into a staging folder, hashing as it goes,
//! and trusts nothing until the manifest at the end has matched every file. A snapshot cut short
//! ends before its manifest, so it is refused whatever file it stops in.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::index::collection::{BackupFiles, BackupSource, BACKUP_DENSE_DIR, BACKUP_INDEX_DIR};

pub(super) const MANIFEST: &str = "snapshot.json";
pub(super) const MANIFEST_CHECKSUM: &str = "snapshot.json.blake3";
pub(super) const SETTINGS: &str = "collection.json";
/// The only format this build writes and reads.
const FORMAT: u32 = 1;
/// A manifest or settings file past this is not one of ours.
const MAX_SMALL_FILE: u64 = 64 << 20;

/// What `snapshot.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotManifest {
    pub format: u32,
    /// The collection the snapshot was taken of.
    pub collection: String,
    /// The commit's generation: what the restored collection's queries report.
    pub generation: u64,
    /// With replication, the log position of the commit (0 on a single node).
    pub log_position: u64,
    pub created_unix_ms: u64,
    /// The version of Lathe that wrote it.
    pub lathe_version: String,
    pub files: Vec<ArchivedFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArchivedFile {
    pub path: String,
    pub bytes: u64,
    pub blake3: String,
}

/// Why an archive cannot be restored: the file of the archive at fault and the cause.
#[derive(Debug)]
pub(super) struct Refusal {
    pub file: String,
    pub cause: String,
}

impl Refusal {
    fn new(file: impl Into<String>, cause: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            cause: cause.into(),
        }
    }
}

/// What is known of a snapshot before its files are written.
pub(super) struct Header<'a> {
    pub collection: &'a str,
    pub settings: &'a [u8],
    pub created_unix_ms: u64,
}

/// Writes the archive of `backup` to `out` and returns its manifest (already written last).
pub(super) fn write_archive(
    out: impl Write,
    header: &Header<'_>,
    backup: BackupFiles,
) -> std::io::Result<SnapshotManifest> {
    let mut builder = tar::Builder::new(out);
    let mtime = header.created_unix_ms / 1000;
    let mut files = Vec::with_capacity(backup.files.len() + 1);
    let small = |bytes: &[u8]| bytes.len() as u64;
    files.push(append(
        &mut builder,
        SETTINGS,
        header.settings,
        small(header.settings),
        mtime,
    )?);
    for file in backup.files {
        let path = &file.archive_path;
        files.push(match file.source {
            BackupSource::Bytes(bytes) => {
                append(&mut builder, path, &bytes[..], small(&bytes), mtime)?
            }
            BackupSource::Open(open, len) => append(&mut builder, path, open, len, mtime)?,
        });
    }
    let manifest = SnapshotManifest {
        format: FORMAT,
        collection: header.collection.to_string(),
        generation: backup.generation,
        log_position: backup.log_position,
        created_unix_ms: header.created_unix_ms,
        lathe_version: env!("CARGO_PKG_VERSION").to_string(),
        files,
    };
    let json = serde_json::to_vec_pretty(&manifest)?;
    append(&mut builder, MANIFEST, &json[..], small(&json), mtime)?;
    let checksum = blake3::hash(&json).to_hex();
    let checksum = checksum.as_bytes();
    append(
        &mut builder,
        MANIFEST_CHECKSUM,
        checksum,
        small(checksum),
        mtime,
    )?;
    builder.into_inner()?.flush()?;
    Ok(manifest)
}

/// Appends one file of `len` bytes, hashing it on the way (streamed: a segment file is never
/// held in memory).
fn append(
    builder: &mut tar::Builder<impl Write>,
    path: &str,
    bytes: impl Read,
    len: u64,
    mtime: u64,
) -> std::io::Result<ArchivedFile> {
    let mut entry = tar::Header::new_gnu();
    entry.set_size(len);
    entry.set_mode(0o644);
    entry.set_mtime(mtime);
    entry.set_entry_type(tar::EntryType::Regular);
    let mut hashing = Hashing::new(bytes.take(len));
    builder.append_data(&mut entry, path, &mut hashing)?;
    if hashing.read != len {
        // The archive is broken from here: the caller removes it.
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{path} ended at {} of its {len} bytes", hashing.read),
        ));
    }
    Ok(ArchivedFile {
        path: path.to_string(),
        bytes: len,
        blake3: hashing.hasher.finalize().to_hex().to_string(),
    })
}

/// Extracts the archive read from `input` into `staging` (which must not exist) and checks it
/// whole: every file against the manifest, the manifest against its checksum. On a refusal the
/// caller removes `staging`; nothing else is written.
pub(super) fn extract_archive(
    input: impl Read,
    staging: &Path,
) -> Result<SnapshotManifest, Refusal> {
    let io = |file: &str, error: std::io::Error| Refusal::new(file, error.to_string());
    std::fs::create_dir(staging).map_err(|e| io(&staging.display().to_string(), e))?;
    let mut archive = tar::Archive::new(input);
    let entries = archive.entries().map_err(|e| io("(the archive)", e))?;
    let mut extracted: Vec<ArchivedFile> = Vec::new();
    let (mut manifest, mut checksum) = (None, None);
    let mut last = String::from("(its start)");
    for entry in entries {
        let mut entry =
            entry.map_err(|e| Refusal::new(format!("after {last}"), header_unreadable(e)))?;
        let path = entry_path(&entry)?;
        if !matches!(entry.header().entry_type(), tar::EntryType::Regular) {
            return Err(Refusal::new(path, "not a regular file"));
        }
        if extracted.iter().any(|file| file.path == path)
            || (path == MANIFEST && manifest.is_some())
            || (path == MANIFEST_CHECKSUM && checksum.is_some())
        {
            return Err(Refusal::new(path, "appears twice"));
        }
        if path == MANIFEST || path == MANIFEST_CHECKSUM {
            let bytes = read_small(&mut entry, &path)?;
            if path == MANIFEST {
                manifest = Some(bytes);
            } else {
                checksum = Some(bytes);
            }
        } else {
            extracted.push(extract_file(&mut entry, &path, staging)?);
        }
        last = path;
    }
    let manifest = check_manifest(manifest, checksum, &last)?;
    for listed in &manifest.files {
        let Some(found) = extracted.iter().find(|file| file.path == listed.path) else {
            return Err(Refusal::new(
                &listed.path,
                "listed in the manifest but not in the archive",
            ));
        };
        if found.bytes != listed.bytes {
            return Err(Refusal::new(
                &listed.path,
                format!(
                    "holds {} bytes; the manifest says {}",
                    found.bytes, listed.bytes
                ),
            ));
        }
        if found.blake3 != listed.blake3 {
            return Err(Refusal::new(&listed.path, "fails its BLAKE3 checksum"));
        }
    }
    if let Some(extra) = extracted.iter().find(|file| !manifest.files.contains(file)) {
        return Err(Refusal::new(
            &extra.path,
            "in the archive but not in its manifest",
        ));
    }
    for dir in [
        staging.join(BACKUP_INDEX_DIR),
        staging.join(BACKUP_DENSE_DIR),
        staging.to_path_buf(),
    ] {
        if dir.is_dir() {
            File::open(&dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| io(&dir.display().to_string(), e))?;
        }
    }
    Ok(manifest)
}

/// The manifest, checked against its checksum and this build's format.
fn check_manifest(
    manifest: Option<Vec<u8>>,
    checksum: Option<Vec<u8>>,
    last: &str,
) -> Result<SnapshotManifest, Refusal> {
    let (Some(manifest), Some(checksum)) = (manifest, checksum) else {
        return Err(Refusal::new(
            MANIFEST,
            format!("missing: the snapshot is cut short (it ends after {last})"),
        ));
    };
    if blake3::hash(&manifest).to_hex().as_bytes() != checksum.trim_ascii() {
        return Err(Refusal::new(MANIFEST, "fails its BLAKE3 checksum"));
    }
    let manifest: SnapshotManifest = serde_json::from_slice(&manifest)
        .map_err(|error| Refusal::new(MANIFEST, format!("not a snapshot manifest: {error}")))?;
    if manifest.format != FORMAT {
        return Err(Refusal::new(
            MANIFEST,
            format!(
                "format {} (written by Lathe {}); this build reads format {FORMAT}",
                manifest.format, manifest.lathe_version
            ),
        ));
    }
    Ok(manifest)
}

/// The entry's path, if it is one a snapshot holds: `collection.json`, the manifest and its
/// checksum, or a plain file name under `index/` or `dense/`. Nothing else is ever written.
fn entry_path(entry: &tar::Entry<'_, impl Read>) -> Result<String, Refusal> {
    let raw = entry.path_bytes();
    let path = String::from_utf8_lossy(&raw).into_owned();
    let plain = |name: &str| {
        !name.is_empty()
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    let allowed = match path.split_once('/') {
        None => [SETTINGS, MANIFEST, MANIFEST_CHECKSUM].contains(&path.as_str()),
        Some((dir, name)) => (dir == BACKUP_INDEX_DIR || dir == BACKUP_DENSE_DIR) && plain(name),
    };
    if allowed {
        Ok(path)
    } else {
        Err(Refusal::new(path, "not a file a Lathe snapshot holds"))
    }
}

fn read_small(entry: &mut tar::Entry<'_, impl Read>, path: &str) -> Result<Vec<u8>, Refusal> {
    if entry.size() > MAX_SMALL_FILE {
        return Err(Refusal::new(
            path,
            format!("{} bytes is too large", entry.size()),
        ));
    }
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry
        .read_to_end(&mut bytes)
        .map_err(|e| Refusal::new(path, cut_short(e)))?;
    Ok(bytes)
}

/// Writes one entry under `staging`, synced, hashing it on the way.
fn extract_file(
    entry: &mut tar::Entry<'_, impl Read>,
    path: &str,
    staging: &Path,
) -> Result<ArchivedFile, Refusal> {
    if path == SETTINGS && entry.size() > MAX_SMALL_FILE {
        return Err(Refusal::new(
            path,
            format!("{} bytes is too large", entry.size()),
        ));
    }
    let target = staging.join(path);
    if let Some(parent) = target.parent() {
        if !parent.exists() {
            std::fs::create_dir(parent).map_err(|e| Refusal::new(path, e.to_string()))?;
        }
    }
    let mut out = File::create_new(&target).map_err(|e| Refusal::new(path, e.to_string()))?;
    let expected = entry.size();
    let mut hashing = Hashing::new(entry);
    let copied =
        std::io::copy(&mut hashing, &mut out).map_err(|e| Refusal::new(path, cut_short(e)))?;
    if copied != expected {
        return Err(Refusal::new(
            path,
            format!("cut short: {copied} of its {expected} bytes are in the snapshot"),
        ));
    }
    out.sync_all()
        .map_err(|e| Refusal::new(path, e.to_string()))?;
    Ok(ArchivedFile {
        path: path.to_string(),
        bytes: copied,
        blake3: hashing.hasher.finalize().to_hex().to_string(),
    })
}

fn cut_short(error: std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        "cut short: the snapshot ends inside it".to_string()
    } else {
        error.to_string()
    }
}

/// Why the tar header after the last entry read could not be read: the snapshot ends inside it
/// (tar reports that as "failed to read entire block", not as an unexpected end) or it is damaged.
fn header_unreadable(error: std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        return cut_short(error);
    }
    format!("cut short or damaged: the next file's tar header cannot be read ({error})")
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hasher: blake3::Hasher,
    read: u64,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: blake3::Hasher::new(),
            read: 0,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.hasher.update(&buf[..read]);
        self.read += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::collection::BackupFile;

    fn backup(files: &[(&str, &[u8])]) -> BackupFiles {
        BackupFiles {
            generation: 7,
            log_position: 0,
            files: files
                .iter()
                .map(|(path, bytes)| BackupFile {
                    archive_path: path.to_string(),
                    source: BackupSource::Bytes(bytes.to_vec()),
                })
                .collect(),
        }
    }

    fn archive_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let header = Header {
            collection: "docs",
            settings: b"{}",
            created_unix_ms: 1_000,
        };
        let mut out = Vec::new();
        write_archive(&mut out, &header, backup(files)).unwrap();
        out
    }

    /// A tar of `entries` as given, with no manifest of ours.
    fn raw_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, bytes) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_entry_type(tar::EntryType::Regular);
            // Written raw: `append_data` itself refuses `..`.
            header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, *bytes).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn extract(bytes: &[u8]) -> (tempfile::TempDir, Result<SnapshotManifest, Refusal>) {
        let dir = tempfile::tempdir().unwrap();
        let extracted = extract_archive(bytes, &dir.path().join("staging"));
        (dir, extracted)
    }

    #[test]
    fn an_archive_extracts_to_the_files_it_was_written_from() {
        let files: [(&str, &[u8]); 3] = [
            ("index/meta.json", b"{\"opstamp\":7}"),
            ("index/abc.store", &[9; 70_000]),
            ("dense/manifest.json", b"{}"),
        ];
        let bytes = archive_of(&files);
        let (dir, extracted) = extract(&bytes);
        let manifest = extracted.unwrap();
        assert_eq!(
            (manifest.collection.as_str(), manifest.generation),
            ("docs", 7)
        );
        assert_eq!(manifest.files.len(), 4, "the settings and three files");
        for (path, content) in files {
            assert_eq!(
                std::fs::read(dir.path().join("staging").join(path)).unwrap(),
                content
            );
        }
    }

    #[test]
    fn every_flipped_byte_of_a_file_or_the_manifest_is_refused() {
        let bytes = archive_of(&[("index/abc.store", &[3; 2_000])]);
        let data_start = {
            let mut archive = tar::Archive::new(&bytes[..]);
            let mut entries = archive.entries().unwrap();
            entries.next(); // collection.json
            entries.next().unwrap().unwrap().raw_file_position() as usize
        };
        for at in [data_start, data_start + 1_999] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x80;
            let refusal = extract(&flipped).1.unwrap_err();
            assert_eq!(refusal.file, "index/abc.store");
            assert!(refusal.cause.contains("checksum"), "{}", refusal.cause);
        }
        let manifest_at = bytes
            .windows(7)
            .rposition(|w| w == b"\"files\"")
            .expect("the manifest's text");
        let mut flipped = bytes.clone();
        flipped[manifest_at + 1] ^= 0x01;
        assert_eq!(extract(&flipped).1.unwrap_err().file, MANIFEST);
    }

    #[test]
    fn an_archive_cut_anywhere_is_refused() {
        let bytes = archive_of(&[("index/a.idx", &[1; 3_000]), ("index/b.idx", &[2; 600])]);
        // Every cut up to the end of the manifest's checksum (the zero blocks after it are
        // tar's end-of-archive marker, which a reader does not need).
        let end_of_checksum = bytes
            .windows(MANIFEST_CHECKSUM.len())
            .rposition(|w| w == MANIFEST_CHECKSUM.as_bytes())
            .unwrap()
            + 512
            + 64;
        for cut in (0..end_of_checksum).step_by(97) {
            let (_dir, extracted) = extract(&bytes[..cut]);
            let Err(refusal) = extracted else {
                panic!("cut at {cut} of {} was accepted", bytes.len());
            };
            assert!(
                refusal.cause.contains("cut short"),
                "cut at {cut}: {}: {}",
                refusal.file,
                refusal.cause
            );
        }
    }

    #[test]
    fn only_the_files_a_snapshot_holds_are_ever_written() {
        for path in [
            "../escape",
            "index/../../escape",
            "/etc/passwd",
            "index/",
            "other/file",
            "index/a/b",
        ] {
            let (dir, extracted) = extract(&raw_tar(&[(path, b"x")]));
            let refusal = extracted.unwrap_err();
            assert_eq!(refusal.file, path);
            assert!(refusal.cause.contains("not a file a Lathe snapshot holds"));
            assert!(!dir.path().join("escape").exists());
        }
        let twice = raw_tar(&[("index/a.idx", b"x"), ("index/a.idx", b"y")]);
        assert_eq!(extract(&twice).1.unwrap_err().cause, "appears twice");
        // Whole but not ours: a tar without a manifest.
        let foreign = raw_tar(&[("index/a.idx", b"x")]);
        assert_eq!(extract(&foreign).1.unwrap_err().file, MANIFEST);
    }
}
