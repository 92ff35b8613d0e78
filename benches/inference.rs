//! Raw ONNX Runtime throughput of the batches an ingest makes, to set beside the ingest's own
//! throughput (issue 13, item 5: an upload should run at ≥ 0.9× this).
//!
//! It replays what the server does with a `lathe ingest` of a folder of .txt files, one write at
//! a time and with nothing else running: the files in `lathe ingest`'s order (sorted paths), in
//! writes of `--batch` documents, each document sectioned as the server sections it (plain text,
//! the server's default section size, the MiniLM budget tokenizer) and its sentences found, then
//! each write's sections embedded by the server's embed stage (`ingest::embed::embed`, which fills
//! the model's batches across all sections of the write) on a MiniLM opened with the server's
//! settings (defaults and `LATHE_MODELS__*` variables, as `lathe serve` reads them), in late
//! chunking, the default fine mode (`models.fine_mode` is not read). The model's batches are
//! therefore those the server makes for the same writes.
//!
//! It prints the text's MB, the sections, the model's runs, the seconds spent inside ONNX
//! Runtime's runs (`InferenceTotals`, the figure the server publishes as
//! `lathe_inference_seconds_total`) and the embed stage's seconds (tokenizing, batching and
//! pooling around them), and the MB/s of each. The ingest to compare with:
//!
//! ```text
//! INGEST_ARGS="--batch 16 --first-batch-bytes 16777216 --batch-seconds 3600" \
//!     scripts/ingest-throughput.sh target/release/lathe SLICE minilm
//! cargo bench --bench inference -- SLICE 16
//! ```
//!
//! (`--first-batch-bytes` at its maximum and a long `--batch-seconds` keep every write of that
//! ingest at exactly 16 documents; the script prints the server's inference seconds too.)
//! Needs ./models (scripts/fetch-models.sh); LATHE_MODELS_DIR overrides.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use lathe::embed::{Embedder, FineMode, MiniLmConfig, MiniLmEmbedder};
use lathe::ingest::embed::{embed, EmbedIdentity, ReusableVectors};
use lathe::ingest::section::{section, SectionLimits};
use lathe::ingest::sentences::sentences;
use lathe::tokenizer::BudgetTokenizer;
use lathe::types::{DocumentFormat, DocumentInput, DEFAULT_SECTION_TOKENS};

use common::manifest_path;

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench` to every target; the rest are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    let Some(corpus) = args.first().map(PathBuf::from) else {
        anyhow::bail!("usage: cargo bench --bench inference -- CORPUS_DIR [DOCUMENTS_PER_WRITE]");
    };
    let per_write: usize = match args.get(1) {
        Some(value) => value.parse()?,
        None => 16,
    };
    anyhow::ensure!(per_write > 0, "DOCUMENTS_PER_WRITE must be at least 1");
    let models = manifest_path("LATHE_MODELS_DIR", "models");
    // The server's settings: defaults, then LATHE_<SECTION>__<KEY> variables, as `lathe serve`.
    let config = lathe::config::Config::load(None, &Default::default())?;

    let tokenizer = BudgetTokenizer::resolve("minilm", &models)?;
    let mut minilm = MiniLmConfig::from_models_dir(&models);
    minilm.intra_op_threads = config.models.inference_threads;
    minilm.memory_arena = config.models.inference_memory_arena;
    minilm.max_batch_tokens = config.models.inference_batch_tokens;
    let embedder = MiniLmEmbedder::new(minilm)?;
    let limits = SectionLimits {
        section_tokens: DEFAULT_SECTION_TOKENS as usize,
        max_sections: config.limits.max_sections_per_document,
    };
    let identity = EmbedIdentity {
        model: "minilm",
        mode: FineMode::LateChunking,
    };

    let files = text_files(&corpus)?;
    let (mut bytes, mut sections, mut embed_seconds) = (0usize, 0usize, 0.0f64);
    for write in files.chunks(per_write) {
        let mut documents = Vec::with_capacity(write.len());
        for path in write {
            let text = std::fs::read_to_string(path)?;
            bytes += text.len();
            let document = DocumentInput {
                id: path.strip_prefix(&corpus)?.to_string_lossy().into_owned(),
                title: String::new(),
                text,
                format: DocumentFormat::Plain,
                metadata: Default::default(),
                sections: None,
            };
            documents.push(sentences(section(document, limits, &tokenizer)?));
        }
        sections += documents.iter().map(|d| d.sections.len()).sum::<usize>();
        let started = Instant::now();
        embed(
            &embedder,
            identity,
            &mut documents,
            &ReusableVectors::default(),
        )?;
        embed_seconds += started.elapsed().as_secs_f64();
    }
    let totals = embedder.inference_totals().unwrap_or_default();
    let megabytes = bytes as f64 / 1e6;
    println!(
        "{} files, {megabytes:.2} MB, {sections} sections, writes of {per_write} documents: \
         {} model runs ({} sequences, {} padded tokens); inside ONNX Runtime {:.2} s ({:.4} MB/s); \
         embed stage {embed_seconds:.2} s ({:.4} MB/s)",
        files.len(),
        totals.runs,
        totals.sequences,
        totals.padded_tokens,
        totals.seconds,
        megabytes / totals.seconds,
        megabytes / embed_seconds,
    );
    Ok(())
}

/// The .txt files under `root`, sorted by path (the order `lathe ingest` sends them in).
fn text_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(root) {
        let entry = entry?;
        let is_text = entry.path().extension().is_some_and(|e| e == "txt");
        if entry.file_type().is_file() && is_text {
            files.push(entry.into_path());
        }
    }
    files.sort();
    Ok(files)
}
