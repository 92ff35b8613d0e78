//! Criterion benchmarks of what reading a collection's index costs, to compare builds with and
//! without the integrity checks (the same file compiles against both).
//!
//! What it measures, on squad-a (its 24 articles, each paragraph one section) ingested `COPIES`
//! times under distinct ids, lexical only:
//! - `search_top8`: `CollectionIndex::search` of 16 squad-a questions (every 300th), 8 sections
//!   each: BM25 plus reading the 8 stored sections (with the checks: decoding them with bounds and
//!   verifying each section's checksum). Per iteration: all 16 questions.
//! - `read_sections`: `CollectionIndex::document_sections` of 16 articles: a term query on the
//!   document id, then every section of the article read from the doc store (~20 per article; with
//!   the checks, each decoded with bounds and verified). Per iteration: all 16 articles.
//! - `open/warm`: `CollectionIndex::open_or_create` of that index with its files in the page
//!   cache (with the checks: every file's footer CRC32), and `open/cold` with them evicted first
//!   (`dd … oflag=nocache count=0` per file). Throughput is the index's bytes on disk, so
//!   criterion reports MB/s.
//!
//! Run: `cargo bench --bench integrity` (needs the dataset at ../shared/eval/squad-a; override
//! with LATHE_SQUAD_DIR). Quick run: `cargo bench --bench integrity -- --warm-up-time 1
//! --measurement-time 5`.

mod common;

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use lathe::index::section_key;
use lathe::index::{DocumentRecord, SectionRecord, WriteOp};
use lathe::types::Filter;
use lathe_tools::eval::Dataset;

use common::{open_index, section_texts, squad_dir};

const COPIES: usize = 20;
const QUERIES: usize = 16;
const WRITER_MEMORY: usize = 64 << 20;

fn documents(dataset: &Dataset) -> Vec<DocumentRecord> {
    let mut records = Vec::new();
    for copy in 0..COPIES {
        for document in &dataset.documents {
            let doc_id = format!("{}-{copy}", document.doc_id);
            let sections = section_texts(document)
                .into_iter()
                .zip(&document.sections)
                .enumerate()
                .map(|(ordinal, ((start, text), span))| SectionRecord {
                    ordinal: ordinal as u64,
                    heading_path: Vec::new(),
                    sentences: Vec::new(),
                    section_key: section_key(&doc_id, ordinal as u64, 1),
                    text,
                    gap_after: String::new(),
                    byte_start: start as u64,
                    char_start: span.start,
                    sentence_vectors: Vec::new(),
                    section_vector: Vec::new(),
                })
                .collect();
            records.push(DocumentRecord {
                doc_id,
                title: document.title.clone(),
                metadata: Default::default(),
                text_bytes: document.text.len() as u64,
                version: 1,
                sections,
            });
        }
    }
    records
}

fn build_index(path: &Path, dataset: &Dataset) {
    let index = open_index(path, WRITER_MEMORY);
    let ops = documents(dataset)
        .into_iter()
        .map(WriteOp::Upsert)
        .collect();
    let done = index.write(ops, true).expect("write").expect("a receiver");
    done.blocking_recv().expect("writer").expect("commit");
    index.shutdown();
}

fn index_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum()
}

/// Drops `path`'s files from the page cache.
fn evict(path: &Path) {
    for entry in std::fs::read_dir(path).unwrap() {
        let file = entry.unwrap().path();
        let status = std::process::Command::new("dd")
            .arg(format!("of={}", file.display()))
            .args([
                "oflag=nocache",
                "conv=notrunc,fdatasync",
                "count=0",
                "status=none",
            ])
            .status()
            .expect("run dd");
        assert!(status.success(), "dd nocache {}", file.display());
    }
}

fn integrity(c: &mut Criterion) {
    let dataset = Dataset::load(&squad_dir()).expect("squad-a dataset");
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("collections/bench/index");
    build_index(&path, &dataset);
    let bytes = index_bytes(&path);
    println!(
        "index: {} documents, {:.1} MB on disk",
        dataset.documents.len() * COPIES,
        bytes as f64 / 1e6
    );

    let index = open_index(&path, WRITER_MEMORY);
    let questions: Vec<Vec<String>> = dataset
        .queries
        .iter()
        .step_by(300)
        .take(QUERIES)
        .map(|query| index.query_terms(&query.question))
        .collect();
    let filter = Filter::default();
    let mut group = c.benchmark_group("integrity");
    group.bench_function("search_top8", |b| {
        b.iter(|| {
            let snapshot = index.snapshot();
            for terms in &questions {
                let hits = index.search(&snapshot, terms, &filter, 8).expect("search");
                black_box(hits);
            }
        })
    });
    let articles: Vec<String> = dataset
        .documents
        .iter()
        .take(QUERIES)
        .map(|document| format!("{}-0", document.doc_id))
        .collect();
    group.bench_function("read_sections", |b| {
        b.iter(|| {
            for article in &articles {
                black_box(index.document_sections(article).expect("sections"));
            }
        })
    });
    index.shutdown();
    drop(index);

    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(10);
    group.bench_function("open/warm", |b| {
        b.iter(|| {
            open_index(&path, WRITER_MEMORY).shutdown();
        })
    });
    group.bench_function("open/cold", |b| {
        b.iter_batched(
            || evict(&path),
            |()| {
                open_index(&path, WRITER_MEMORY).shutdown();
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, integrity);
criterion_main!(benches);
