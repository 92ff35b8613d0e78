//! Helpers shared by the unit tests of the index's parts: records to write and standalone
//! collections to write them to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::handle::CollectionIndex;
use super::records::{section_key, DocumentRecord, SectionRecord, WriteOp};
use crate::embed::{QuantizedVectors, VectorMatrix};
use crate::error::Result;

/// A one-section document of `text` at version 1, tagged `lang=en`, without vectors; its one
/// section has two sentences: the first seven bytes, and from the ninth on.
pub fn record(doc_id: &str, text: &str) -> DocumentRecord {
    let mut record = document(doc_id, 1, &[text]);
    record.sections[0].heading_path = vec!["Intro".to_string()];
    record.sections[0].sentences = vec![0..7, 8..text.len() as u32];
    record
}

/// A document of one section per text at `version`, tagged `lang=en`, without vectors.
pub fn document(doc_id: &str, version: u64, texts: &[&str]) -> DocumentRecord {
    let mut byte_start = 0;
    let sections = texts
        .iter()
        .enumerate()
        .map(|(ordinal, text)| {
            let ordinal = ordinal as u64;
            let section = SectionRecord {
                ordinal,
                heading_path: Vec::new(),
                text: text.to_string(),
                gap_after: String::new(),
                byte_start,
                char_start: byte_start,
                section_key: section_key(doc_id, ordinal, version),
                sentences: std::iter::once(0..text.len() as u32).collect(),
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            };
            byte_start += text.len() as u64;
            section
        })
        .collect();
    DocumentRecord {
        doc_id: doc_id.to_string(),
        title: doc_id.to_string(),
        metadata: BTreeMap::from([("lang".to_string(), "en".to_string())]),
        text_bytes: texts.iter().map(|text| text.len() as u64).sum(),
        version,
        sections,
    }
}

/// One-row `QuantizedVectors` bytes of `vector`, as the neural stage stores a section vector.
pub fn vector_bytes(vector: &[f32]) -> Vec<u8> {
    let matrix = VectorMatrix::from_values(vector.len(), vector.to_vec()).expect("one row");
    QuantizedVectors::from_matrix(&matrix).to_bytes()
}

/// A standalone index in `path` that commits only when asked (a `wait` write, the shutdown).
pub fn open(path: &Path) -> Result<CollectionIndex> {
    CollectionIndex::open_or_create(path, 15_000_000, Duration::from_secs(3600), None)
}

/// [`open`] with a dense index of `dim`-dimensional section vectors.
pub fn open_dense(path: &Path, dim: usize) -> Result<CollectionIndex> {
    CollectionIndex::open_or_create(path, 15_000_000, Duration::from_secs(3600), Some(dim))
}

/// Writes `ops` and waits until they are durable and visible; the generation that shows them.
pub fn write_and_wait(index: &CollectionIndex, ops: Vec<WriteOp>) -> u64 {
    let done = index.write(ops, true).unwrap().unwrap();
    done.blocking_recv().unwrap().unwrap()
}

/// `collections/<name>/index` of a fresh data dir, holding two committed documents.
pub fn written_collection(data_dir: &Path) -> PathBuf {
    let path = data_dir.join("collections/wiki/index");
    let index = open(&path).unwrap();
    let ops = vec![
        WriteOp::Upsert(record("a", "hazards in their line of sight")),
        WriteOp::Upsert(record("b", "boats in the harbour")),
    ];
    write_and_wait(&index, ops);
    index.shutdown();
    path
}

/// Resident bytes of this process's mapping of `file` (from /proc/self/smaps), if it is mapped.
pub fn mapped_resident_bytes(file: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let wanted = file.canonicalize().unwrap();
    let mut lines = smaps.lines();
    while let Some(line) = lines.next() {
        if !line.ends_with(&*wanted.to_string_lossy()) {
            continue;
        }
        for field in lines.by_ref() {
            if let Some(kib) = field.strip_prefix("Rss:") {
                let kib: u64 = kib.trim().trim_end_matches("kB").trim().parse().unwrap();
                return Some(kib * 1024);
            }
        }
    }
    None
}
