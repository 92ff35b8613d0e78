//! Sealed segments on disk: `seg-<id>.flat` (the segment's [`FlatGraph`], see `flat_file`) and
//! `seg-<id>.keys` (the key of each slot, u64 little-endian), listed with their CRC32s in
//! `manifest.json`, which is replaced atomically (written to a temporary file, synced, renamed,
//! the folder synced). A segment of a format-3 manifest is hnsw_rs's own dump instead
//! (`seg-<id>.hnsw.graph`, `seg-<id>.hnsw.data`): it is read by hnsw_rs and flattened, and goes
//! when a merge takes it. A segment is trusted only when the manifest lists it and its files
//! match their checksums; anything else in the folder is the leftover of an interrupted seal or
//! merge.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::flat::FlatGraph;
use super::flat_file;
use super::segment::{graph_dim, Segment, SegmentGraph, Walk};
use super::DenseError;

pub const MANIFEST_FILE: &str = "manifest.json";
/// 4: segments written as flat graphs. 3 (hnsw_rs's dumps of int8 codes) is still read, its
/// segments loaded through hnsw_rs; 2 held half floats, 1 `f32`: their segments are rebuilt
/// from the stored vectors, once.
pub const MANIFEST_VERSION: u32 = 4;
/// The oldest manifest whose segments are read as they are.
const OLDEST_READ_VERSION: u32 = 3;
const SEGMENT_PREFIX: &str = "seg-";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub dim: usize,
    pub segments: Vec<SegmentEntry>,
}

/// One sealed segment as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentEntry {
    pub id: u64,
    /// `seg-<id>`; for hnsw_rs's dump (format 3), its basename: the graph and data files are
    /// `<basename>.hnsw.{graph,data}`.
    pub basename: String,
    /// Slots, live or dead when sealed.
    pub vectors: usize,
    pub files: Vec<FileEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

impl SegmentEntry {
    pub fn file_names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|file| file.name.as_str())
    }

    /// Whether the segment is written as a flat graph (else it is hnsw_rs's dump, format 3).
    fn is_flat(&self) -> bool {
        self.file_names().any(|name| name == flat_name(self.id))
    }
}

/// The flat graph file of segment `id`.
fn flat_name(id: u64) -> String {
    format!("{SEGMENT_PREFIX}{id}.flat")
}

/// The manifest in `dir`, or `None` when there is none yet.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, DenseError> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(DenseError::io(&path, error)),
    };
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|error| DenseError::corrupt(&path, error.to_string()))?;
    if manifest.version < OLDEST_READ_VERSION {
        return Err(DenseError::Outdated {
            path,
            version: manifest.version,
        });
    }
    if manifest.version > MANIFEST_VERSION {
        return Err(DenseError::corrupt(
            &path,
            format!(
                "manifest version {} is newer than this build's {MANIFEST_VERSION}",
                manifest.version
            ),
        ));
    }
    for entry in &manifest.segments {
        check_names(entry).map_err(|reason| DenseError::corrupt(&path, reason))?;
    }
    Ok(Some(manifest))
}

/// The files a manifest (its bytes as read) lists, each checked against the jail rule of
/// [`check_names`]: what a backup of the folder copies beside the manifest.
pub fn listed_files(path: &Path, bytes: &[u8]) -> Result<Vec<String>, DenseError> {
    let manifest: Manifest = serde_json::from_slice(bytes)
        .map_err(|error| DenseError::corrupt(path, error.to_string()))?;
    let mut names = Vec::new();
    for entry in &manifest.segments {
        check_names(entry).map_err(|reason| DenseError::corrupt(path, reason))?;
        names.extend(entry.file_names().map(str::to_string));
    }
    Ok(names)
}

/// The folder is a jail: a manifest entry may name only the files a seal or merge of its
/// segment writes (see [`segment_file_id`]), never a path, so that verifying or removing them
/// cannot touch any other file.
fn check_names(entry: &SegmentEntry) -> Result<(), String> {
    let id = entry.id;
    if segment_file_id(&format!("{}.hnsw.graph", entry.basename)) != Some(id) {
        return Err(format!(
            "segment {id}'s basename `{}` is not one of its own",
            entry.basename
        ));
    }
    let keys = format!("{SEGMENT_PREFIX}{id}.keys");
    let mut wanted = if entry.is_flat() {
        vec![flat_name(id), keys]
    } else {
        vec![
            format!("{}.hnsw.graph", entry.basename),
            format!("{}.hnsw.data", entry.basename),
            keys,
        ]
    };
    let mut named: Vec<&str> = entry.file_names().collect();
    wanted.sort();
    named.sort_unstable();
    if named != wanted {
        return Err(format!(
            "segment {id} lists the files {named:?}; only {wanted:?} may be listed"
        ));
    }
    Ok(())
}

/// The segment id of a file a seal or merge writes, `None` for any other name: `seg-<id>.keys`,
/// and hnsw_rs's `<basename>.hnsw.graph` / `<basename>.hnsw.data`, whose basename is
/// `seg-<id>`, or `seg-<id>-<n>` when hnsw_rs made it unique beside a mapped dump.
pub fn segment_file_id(name: &str) -> Option<u64> {
    fn number(digits: &str) -> Option<u64> {
        let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        plain.then(|| digits.parse().ok()).flatten()
    }
    let rest = name.strip_prefix(SEGMENT_PREFIX)?;
    if let Some(id) = rest
        .strip_suffix(".keys")
        .or_else(|| rest.strip_suffix(".flat"))
    {
        return number(id);
    }
    let basename = rest
        .strip_suffix(".hnsw.graph")
        .or_else(|| rest.strip_suffix(".hnsw.data"))?;
    match basename.split_once('-') {
        Some((id, unique)) => number(unique).and_then(|_| number(id)),
        None => number(basename),
    }
}

/// Replaces the manifest in `dir` atomically and durably.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), DenseError> {
    let path = dir.join(MANIFEST_FILE);
    let temporary = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(manifest)
        .map_err(|error| DenseError::io(&path, error.to_string()))?;
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&temporary)?;
        file.write_all(&json)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        sync_dir(dir)
    };
    write().map_err(|error| DenseError::io(&path, error))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `segment` (all its handed-out slots) to `dir` as its flat graph and its keys, and
/// returns its manifest entry; the files are synced, not yet listed.
pub fn dump_segment(dir: &Path, segment: &Segment) -> Result<SegmentEntry, DenseError> {
    // Not `create_dir_all`: a collection folder that is gone (deleted) must stay gone.
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(DenseError::io(dir, error))
        }
        _ => {}
    }
    let id = segment.id;
    let keys = segment.keys();
    let flat_path = dir.join(flat_name(id));
    let write_flat = |flat: &FlatGraph| -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(File::create(&flat_path)?);
        flat_file::write(flat, &mut out)?;
        out.into_inner()
            .map_err(|error| error.into_error())?
            .sync_all()
    };
    let written = match &segment.walk {
        Walk::Flat(flat) => write_flat(flat),
        Walk::Hnsw(graph) => {
            write_flat(&FlatGraph::from_graph(graph, keys.len(), graph_dim(graph)))
        }
    };
    written.map_err(|error| DenseError::io(&flat_path, error))?;
    let keys_name = format!("{SEGMENT_PREFIX}{id}.keys");
    let mut bytes = Vec::with_capacity(8 * (keys.len() + 1));
    bytes.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for key in &keys {
        bytes.extend_from_slice(&key.to_le_bytes());
    }
    let keys_path = dir.join(&keys_name);
    let write_keys = || -> std::io::Result<()> {
        let mut file = File::create(&keys_path)?;
        file.write_all(&bytes)?;
        file.sync_all()
    };
    write_keys().map_err(|error| DenseError::io(&keys_path, error))?;
    let mut files = Vec::new();
    for name in [flat_name(id), keys_name] {
        let (bytes, crc32) = checksum(&dir.join(&name))?;
        files.push(FileEntry { name, bytes, crc32 });
    }
    sync_dir(dir).map_err(|error| DenseError::io(dir, error))?;
    Ok(SegmentEntry {
        id,
        basename: format!("{SEGMENT_PREFIX}{id}"),
        vectors: keys.len(),
        files,
    })
}

/// Loads the segment `entry` lists, after checking every file against its checksum; every slot
/// starts dead (the caller marks the live ones).
pub fn load_segment(dir: &Path, entry: &SegmentEntry, dim: usize) -> Result<Segment, DenseError> {
    for file in &entry.files {
        let path = dir.join(&file.name);
        let (bytes, crc32) = checksum(&path)?;
        if (bytes, crc32) != (file.bytes, file.crc32) {
            return Err(DenseError::corrupt(
                &path,
                format!(
                    "{bytes} bytes with CRC32 {crc32:08x}, the manifest says {} bytes with {:08x}",
                    file.bytes, file.crc32
                ),
            ));
        }
    }
    load_segment_unverified(dir, entry, dim)
}

/// [`load_segment`] without checking the files against their checksums: for a segment this
/// process has just written, whose checksums [`dump_segment`] computed from the same bytes.
pub fn load_segment_unverified(
    dir: &Path,
    entry: &SegmentEntry,
    dim: usize,
) -> Result<Segment, DenseError> {
    let keys_path = dir.join(format!("{SEGMENT_PREFIX}{}.keys", entry.id));
    let keys = read_keys(&keys_path)?;
    if keys.len() != entry.vectors {
        return Err(DenseError::corrupt(
            &keys_path,
            format!("{} keys, the manifest says {}", keys.len(), entry.vectors),
        ));
    }
    let segment = if entry.is_flat() {
        let path = dir.join(flat_name(entry.id));
        let bytes = std::fs::read(&path).map_err(|error| DenseError::io(&path, error))?;
        let flat = flat_file::read(&bytes).map_err(|why| DenseError::corrupt(&path, why))?;
        if flat.slots() != keys.len() {
            return Err(DenseError::corrupt(
                &path,
                format!("{} slots, its keys {}", flat.slots(), keys.len()),
            ));
        }
        check_dim(dim, flat.dim())?;
        Segment::with_flat(entry.id, flat, keys)
    } else {
        // The checksums make a malformed dump (on which hnsw_rs may panic) unlikely.
        let graph = SegmentGraph::load_mapped(dir, &entry.basename)
            .map_err(|error| DenseError::corrupt(dir, error.to_string()))?;
        check_dim(dim, graph_dim(&graph))?;
        Segment::with_graph(entry.id, graph, keys, true)
    };
    segment.mark_persisted();
    Ok(segment)
}

/// A segment of vectors of `got` dimensions (0: none) in an index of `expected`.
fn check_dim(expected: usize, got: usize) -> Result<(), DenseError> {
    if got != 0 && got != expected {
        return Err(DenseError::DimensionMismatch { expected, got });
    }
    Ok(())
}

/// Removes the files of segments the manifest does not list (and a stray temporary manifest),
/// each logged; a file of any other name is left where it is, with a warning.
pub fn remove_unlisted(dir: &Path, manifest: &Manifest) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    let listed: std::collections::HashSet<&str> = manifest
        .segments
        .iter()
        .flat_map(|segment| segment.file_names())
        .collect();
    for entry in listing.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if listed.contains(name.as_str()) || name == MANIFEST_FILE {
            continue;
        }
        if segment_file_id(&name).is_some() || name == format!("{MANIFEST_FILE}.tmp") {
            tracing::info!(path = %entry.path().display(), "removing the leftover of an interrupted seal or merge");
            remove_file(&entry.path());
        } else {
            // Not a name the index writes: someone else's file, left as it is.
            tracing::warn!(path = %entry.path().display(), "a file the dense index did not write is in its folder; it is left as it is");
        }
    }
}

pub fn remove_segment_files(dir: &Path, entry: &SegmentEntry) {
    for name in entry.file_names() {
        remove_file(&dir.join(name));
    }
}

fn remove_file(path: &PathBuf) {
    if let Err(error) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "could not remove a dense segment file");
    }
}

fn read_keys(path: &Path) -> Result<Vec<u64>, DenseError> {
    let bytes = std::fs::read(path).map_err(|error| DenseError::io(path, error))?;
    let Some((count, body)) = bytes.split_first_chunk::<8>() else {
        return Err(DenseError::corrupt(path, "shorter than its header"));
    };
    let count = u64::from_le_bytes(*count);
    if body.len() as u64 != count.saturating_mul(8) {
        return Err(DenseError::corrupt(
            path,
            format!("{} bytes do not hold {count} keys", body.len()),
        ));
    }
    Ok(body
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])))
        .collect())
}

/// The length and CRC32 of the file at `path`.
fn checksum(path: &Path) -> Result<(u64, u32), DenseError> {
    let mut file = File::open(path).map_err(|error| DenseError::io(path, error))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|error| DenseError::io(path, error))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        bytes += read as u64;
    }
    Ok((bytes, hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, basename: &str, names: &[&str]) -> SegmentEntry {
        SegmentEntry {
            id,
            basename: basename.to_string(),
            vectors: 1,
            files: names
                .iter()
                .map(|name| FileEntry {
                    name: name.to_string(),
                    bytes: 0,
                    crc32: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn only_the_names_a_seal_writes_are_segment_files() {
        for (name, id) in [
            ("seg-7.keys", Some(7)),
            ("seg-7.flat", Some(7)),
            ("seg-7.hnsw.graph", Some(7)),
            ("seg-12.hnsw.data", Some(12)),
            ("seg-12-4431.hnsw.data", Some(12)),
            ("seg-backup-manifest.json", None),
            ("seg-7.keys.bak", None),
            ("seg-7.flat.tmp", None),
            ("seg-x.flat", None),
            ("seg-.keys", None),
            ("seg-7-.hnsw.graph", None),
            ("seg-7-x.hnsw.graph", None),
            ("seg-+7.keys", None),
            ("seg-../index/meta.json", None),
            ("manifest.json", None),
        ] {
            assert_eq!(segment_file_id(name), id, "{name}");
        }
    }

    #[test]
    fn a_manifest_entry_may_name_only_its_own_files() {
        let own = ["seg-3.hnsw.graph", "seg-3.hnsw.data", "seg-3.keys"];
        assert!(check_names(&entry(3, "seg-3", &own)).is_ok());
        assert!(check_names(&entry(3, "seg-3", &["seg-3.keys", "seg-3.flat"])).is_ok());
        let unique = ["seg-3-17.hnsw.data", "seg-3.keys", "seg-3-17.hnsw.graph"];
        assert!(check_names(&entry(3, "seg-3-17", &unique)).is_ok());
        for (id, basename, names) in [
            (
                3,
                "seg-3",
                &["seg-3.hnsw.graph", "seg-3.hnsw.data", "../index/meta.json"][..],
            ),
            (
                3,
                "seg-3",
                &["seg-3.hnsw.graph", "seg-3.hnsw.data", "/etc/hostname"][..],
            ),
            (
                3,
                "seg-3",
                &["seg-3.hnsw.graph", "seg-3.hnsw.data", "seg-4.keys"][..],
            ),
            (3, "seg-3", &["seg-3.hnsw.graph", "seg-3.hnsw.data"][..]),
            (3, "seg-3", &["seg-3.flat"][..]),
            (3, "seg-3", &["seg-4.flat", "seg-3.keys"][..]),
            (
                3,
                "seg-3",
                &["seg-3.flat", "seg-3.keys", "../meta.json"][..],
            ),
            (
                3,
                "seg-3",
                &["seg-3.flat", "seg-3.keys", "seg-3.hnsw.graph"][..],
            ),
            (
                3,
                "seg-4",
                &["seg-4.hnsw.graph", "seg-4.hnsw.data", "seg-3.keys"][..],
            ),
            (
                3,
                "../seg-3",
                &["../seg-3.hnsw.graph", "../seg-3.hnsw.data", "seg-3.keys"][..],
            ),
        ] {
            let error = check_names(&entry(id, basename, names)).expect_err("refused");
            assert!(error.contains(&format!("segment {id}")), "{error}");
        }
    }

    /// An index a build before flat files wrote (manifest format 3, hnsw_rs's dumps) opens as it
    /// is: each segment read by hnsw_rs and flattened, its vectors found, nothing replayed.
    #[test]
    fn segments_of_hnsw_rs_dumps_still_load() {
        use hnsw_rs::prelude::AnnT;

        use super::super::test_util::{hnsw_graph, random_vectors};

        let dir = tempfile::tempdir().expect("tempdir");
        let vectors = random_vectors(1500, 16, 21);
        let graph = hnsw_graph(&vectors);
        let basename = graph.file_dump(dir.path(), "seg-0").expect("dumps");
        let keys: Vec<u64> = (0..1500u64).map(|slot| 1000 + slot).collect();
        let mut key_bytes = (keys.len() as u64).to_le_bytes().to_vec();
        keys.iter()
            .for_each(|key| key_bytes.extend_from_slice(&key.to_le_bytes()));
        std::fs::write(dir.path().join("seg-0.keys"), key_bytes).expect("keys");
        let files = [
            format!("{basename}.hnsw.graph"),
            format!("{basename}.hnsw.data"),
            "seg-0.keys".into(),
        ]
        .into_iter()
        .map(|name| {
            let (bytes, crc32) = checksum(&dir.path().join(&name)).expect("written");
            FileEntry { name, bytes, crc32 }
        })
        .collect();
        let entry = SegmentEntry {
            id: 0,
            basename,
            vectors: 1500,
            files,
        };
        write_manifest(
            dir.path(),
            &Manifest {
                version: 3,
                dim: 16,
                segments: vec![entry.clone()],
            },
        )
        .expect("manifest");

        let manifest = read_manifest(dir.path())
            .expect("format 3 is read")
            .expect("listed");
        let segment = load_segment(dir.path(), &manifest.segments[0], 16).expect("loads");
        assert!(segment.graph().is_none(), "flattened");
        for slot in (0..1500).step_by(50) {
            segment.set_live(slot);
        }
        let unit = &vectors[700];
        match &segment.walk {
            Walk::Flat(flat) => assert_eq!(flat.search(unit, 16)[0].0, 700),
            Walk::Hnsw(_) => unreachable!("flattened"),
        }
        assert_eq!(segment.key(700), 1700);
    }

    #[test]
    fn a_damaged_hnsw_rs_dump_is_an_error_naming_it_and_no_panic_reaches_the_log() {
        use hnsw_rs::prelude::AnnT;

        use super::super::test_util::{hnsw_graph, random_vectors};

        let dir = tempfile::tempdir().expect("tempdir");
        let graph = hnsw_graph(&random_vectors(1500, 16, 5));
        let basename = graph.file_dump(dir.path(), "seg-7").expect("dumps");
        let graph_file = dir.path().join(format!("{basename}.hnsw.graph"));
        let bytes = std::fs::read(&graph_file).expect("dumped");
        // The links cut short, as a half-copied file: hnsw_rs panics on it rather than failing.
        std::fs::write(&graph_file, &bytes[..bytes.len() / 3]).expect("cut");
        crate::panic_log::install();
        let (loaded, log) = crate::test_log::logged_while(tracing::Level::INFO, || {
            SegmentGraph::load_mapped(dir.path(), &basename)
        });
        let error = loaded
            .err()
            .expect("a damaged dump does not load")
            .to_string();
        assert!(error.contains(&format!("`{basename}`")), "{error}");
        assert!(error.contains("it panicked"), "{error}");
        assert!(!log.contains("panicked"), "{log}");
    }

    #[test]
    fn a_manifest_naming_a_file_outside_its_segments_is_refused_and_nothing_else_is_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("dense");
        std::fs::create_dir(&dir).expect("dense");
        let outside = root.path().join("meta.json");
        std::fs::write(&outside, b"tantivy's").expect("write");
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            dim: 4,
            segments: vec![entry(
                0,
                "seg-0",
                &["seg-0.hnsw.graph", "seg-0.hnsw.data", "../meta.json"],
            )],
        };
        write_manifest(&dir, &manifest).expect("write");
        let error = read_manifest(&dir).expect_err("refused");
        assert!(error.to_string().contains("../meta.json"), "{error}");

        for name in [
            "seg-backup-manifest.json",
            "notes.txt",
            "seg-5.keys",
            "seg-5-3.hnsw.data",
        ] {
            std::fs::write(dir.join(name), b"x").expect("write");
        }
        remove_unlisted(&dir, &Manifest::default());
        assert!(outside.exists());
        assert!(dir.join("seg-backup-manifest.json").exists());
        assert!(dir.join("notes.txt").exists());
        assert!(!dir.join("seg-5.keys").exists());
        assert!(!dir.join("seg-5-3.hnsw.data").exists());
    }
}
