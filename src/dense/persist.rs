//! Sealed segments on disk: `seg-<id>.hnsw.graph` and `seg-<id>.hnsw.data` (hnsw_rs's own dump)
//! and `seg-<id>.keys` (the key of each slot, u64 little-endian), listed with their CRC32s in
//! `manifest.json`, which is replaced atomically (written to a temporary file, synced, renamed,
//! the folder synced). A segment is trusted only when the manifest lists it and its files match
//! their checksums; anything else in the folder is the leftover of an interrupted seal or merge.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use hnsw_rs::prelude::AnnT;
use serde::{Deserialize, Serialize};

use super::segment::{Segment, SegmentGraph};
use super::DenseError;

pub const MANIFEST_FILE: &str = "manifest.json";
/// 3: graphs of int8 codes (2 held half floats, 1 `f32`; their segments are rebuilt from the
/// stored vectors, once).
pub const MANIFEST_VERSION: u32 = 3;
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
    /// hnsw_rs's basename: the graph and data files are `<basename>.hnsw.{graph,data}`.
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
    if manifest.version < MANIFEST_VERSION {
        return Err(DenseError::Outdated {
            path,
            version: manifest.version,
        });
    }
    if manifest.version != MANIFEST_VERSION {
        return Err(DenseError::corrupt(
            &path,
            format!(
                "manifest version {} is not {MANIFEST_VERSION}",
                manifest.version
            ),
        ));
    }
    Ok(Some(manifest))
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

/// Writes `segment` (all its handed-out slots) to `dir` and returns its manifest entry; the
/// files are synced, not yet listed.
pub fn dump_segment(dir: &Path, segment: &Segment) -> Result<SegmentEntry, DenseError> {
    std::fs::create_dir_all(dir).map_err(|error| DenseError::io(dir, error))?;
    let wanted = format!("{SEGMENT_PREFIX}{}", segment.id);
    // hnsw_rs panics (rather than failing) when it cannot create its files.
    let dumped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        segment.graph.file_dump(dir, &wanted)
    }));
    let basename = match dumped {
        Ok(Ok(basename)) => basename,
        Ok(Err(error)) => return Err(DenseError::io(dir, error)),
        Err(_) => {
            return Err(DenseError::io(
                dir,
                "hnsw_rs could not create its dump files",
            ))
        }
    };
    let keys_name = format!("{wanted}.keys");
    let keys = segment.keys();
    let mut bytes = Vec::with_capacity(8 * (keys.len() + 1));
    bytes.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for key in &keys {
        bytes.extend_from_slice(&key.to_le_bytes());
    }
    let keys_path = dir.join(&keys_name);
    std::fs::write(&keys_path, &bytes).map_err(|error| DenseError::io(&keys_path, error))?;
    let mut files = Vec::new();
    for name in [
        format!("{basename}.hnsw.graph"),
        format!("{basename}.hnsw.data"),
        keys_name,
    ] {
        let path = dir.join(&name);
        // hnsw_rs flushes but does not sync its files.
        File::open(&path)
            .and_then(|file| file.sync_all())
            .map_err(|error| DenseError::io(&path, error))?;
        let (bytes, crc32) = checksum(&path)?;
        files.push(FileEntry { name, bytes, crc32 });
    }
    sync_dir(dir).map_err(|error| DenseError::io(dir, error))?;
    Ok(SegmentEntry {
        id: segment.id,
        basename,
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
    // The checksums make a malformed dump (on which hnsw_rs may panic) unlikely.
    let graph = SegmentGraph::load_mapped(dir, &entry.basename)
        .map_err(|error| DenseError::corrupt(dir, error.to_string()))?;
    if graph.get_nb_point() > 0 && graph.get_point_indexation().get_data_dimension() != dim {
        return Err(DenseError::DimensionMismatch {
            expected: dim,
            got: graph.get_point_indexation().get_data_dimension(),
        });
    }
    let segment = Segment::with_graph(entry.id, graph, keys, true);
    segment.mark_persisted();
    Ok(segment)
}

/// Removes the files of segments the manifest does not list (and a stray temporary manifest).
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
        let stray = (name.starts_with(SEGMENT_PREFIX) && !listed.contains(name.as_str()))
            || name == format!("{MANIFEST_FILE}.tmp");
        if stray {
            remove_file(&entry.path());
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
