//! Helpers the benchmarks share (each bench target includes this folder as `mod common;`, and
//! uses what it needs of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use lathe::index::CollectionIndex;
use lathe_tools::eval::DatasetDocument;

/// `var` when set, else `default` under the crate root (models, the squad-a dataset).
pub fn manifest_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default))
}

/// The squad-a dataset folder (`LATHE_SQUAD_DIR`, else ../shared/eval/squad-a).
pub fn squad_dir() -> PathBuf {
    manifest_path("LATHE_SQUAD_DIR", "../shared/eval/squad-a")
}

/// The `.txt` documents of the Debian-docs corpus in `LATHE_DEBIAN_DOCS`, sorted, the first
/// `LATHE_BENCH_DOCS` of them when that is set.
pub fn debian_docs_paths() -> Vec<PathBuf> {
    let Ok(folder) = std::env::var("LATHE_DEBIAN_DOCS") else {
        panic!(
            "LATHE_DEBIAN_DOCS is not set: run `scripts/fetch-debian-docs.sh /tmp/lathe-debian-docs` \
             and set LATHE_DEBIAN_DOCS=/tmp/lathe-debian-docs"
        );
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap_or_else(|error| {
            panic!(
                "cannot read LATHE_DEBIAN_DOCS={folder}: {error}; run scripts/fetch-debian-docs.sh"
            )
        })
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    if let Some(limit) = std::env::var("LATHE_BENCH_DOCS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        paths.truncate(limit);
    }
    assert!(
        !paths.is_empty(),
        "no .txt documents in {folder}; run scripts/fetch-debian-docs.sh"
    );
    paths
}

/// Each section of `document` as (byte start, text): the dataset gives sections in chars.
pub fn section_texts(document: &DatasetDocument) -> Vec<(usize, String)> {
    let char_starts: Vec<usize> = document
        .text
        .char_indices()
        .map(|(b, _)| b)
        .chain(std::iter::once(document.text.len()))
        .collect();
    document
        .sections
        .iter()
        .map(|span| {
            let start = char_starts[span.start as usize];
            let end = char_starts[span.end as usize];
            (start, document.text[start..end].to_string())
        })
        .collect()
}

/// Opens the collection index at `path` (an hour's commit interval: benches commit themselves)
/// with `writer_memory` for its writer.
pub fn open_index(path: &Path, writer_memory: usize) -> CollectionIndex {
    CollectionIndex::open_or_create(path, writer_memory, Duration::from_secs(3600), None)
        .expect("open the index")
}
