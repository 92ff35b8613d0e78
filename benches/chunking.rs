//! Chunking throughput on real text, in tokens per second, against a bare tokenization pass and
//! against the `text-splitter` crate as a peer, all measured in the same run.
//!
//! What: sections of the Debian docs corpus (Linux kernel .rst and Python .rst.txt sources, cut
//! into sections of at most 8 KiB at blank lines, like ingest does) chunked at 256 max tokens with
//! the all-MiniLM-L6-v2 tokenizer:
//! - `tokenize`: the bare `tokenizers` encode pass (no special tokens, no padding/truncation);
//! - `tokenize+<strategy>`: encode, build `TokenOffsets`, chunk (what a cache miss costs);
//! - `cut/<strategy>`: chunking alone on precomputed token offsets and sentences (what a section
//!   cache hit costs: the server keeps both per section);
//! - `text-splitter`: `TextSplitter` with the same tokenizer, capacity 256.
//!   After criterion, a summary prints tokens/s of each and its ratio to the bare pass.
//!
//! Run: `scripts/fetch-debian-docs.sh /tmp/lathe-debian-docs` then
//! `LATHE_DEBIAN_DOCS=/tmp/lathe-debian-docs cargo bench --bench chunking`
//! (`LATHE_MINILM_TOKENIZER` overrides the tokenizer path; add `-- --measurement-time 3` for a
//! short run; `LATHE_BENCH_DOCS=N` takes the first N documents).

mod common;

use std::hint::black_box;
use std::ops::Range;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lathe::chunk::{
    chunk_section, chunk_section_with_sentences, sentences, ChunkOptions, ChunkSpan, SemanticInput,
    SemanticThreshold, Strategy, Unit,
};
use lathe::tokens::TokenOffsets;
use tokenizers::Tokenizer;

const MAX_TOKENS: u32 = 256;
const SECTION_BYTES: usize = 8 * 1024;

struct Corpus {
    tokenizer: Tokenizer,
    sections: Vec<String>,
    offsets: Vec<TokenOffsets>,
    sentence_ranges: Vec<Vec<Range<u32>>>,
    similarities: Vec<Vec<f32>>,
    total_tokens: u64,
}

fn load_tokenizer() -> Tokenizer {
    let path = std::env::var("LATHE_MINILM_TOKENIZER").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/models/minilm/tokenizer.json").to_string()
    });
    let mut tokenizer = Tokenizer::from_file(&path)
        .unwrap_or_else(|error| panic!("cannot load tokenizer {path}: {error}"));
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .expect("disabling truncation cannot fail");
    tokenizer
}

fn load_corpus() -> Corpus {
    let paths = common::debian_docs_paths();
    let mut sections = Vec::new();
    for path in &paths {
        let text = std::fs::read(path).expect("readable document");
        let text = String::from_utf8_lossy(&text);
        let mut current = String::new();
        for paragraph in text.split("\n\n") {
            if !current.is_empty() && current.len() + paragraph.len() > SECTION_BYTES {
                sections.push(std::mem::take(&mut current));
            }
            current.push_str(paragraph);
            current.push_str("\n\n");
        }
        if !current.trim().is_empty() {
            sections.push(current);
        }
    }
    let tokenizer = load_tokenizer();
    let offsets: Vec<TokenOffsets> = sections.iter().map(|s| tokenize(&tokenizer, s)).collect();
    let total_tokens = offsets.iter().map(|o| o.len() as u64).sum();
    // Stored sentence similarities are not part of chunking; a fixed-seed sequence stands in.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut sentence_ranges = Vec::new();
    let mut similarities = Vec::new();
    for section in &sections {
        let mut ranges = Vec::new();
        sentences(section, &mut ranges);
        let values = (0..ranges.len().saturating_sub(1))
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        sentence_ranges.push(ranges);
        similarities.push(values);
    }
    eprintln!(
        "corpus: {} documents, {} sections, {} bytes, {} MiniLM tokens",
        paths.len(),
        sections.len(),
        sections.iter().map(String::len).sum::<usize>(),
        total_tokens
    );
    Corpus {
        tokenizer,
        sections,
        offsets,
        sentence_ranges,
        similarities,
        total_tokens,
    }
}

fn tokenize(tokenizer: &Tokenizer, text: &str) -> TokenOffsets {
    let encoding = tokenizer
        .encode(text, false)
        .expect("MiniLM encodes any text");
    TokenOffsets::from_spans(text, encoding.get_offsets().iter().copied())
}

fn options(strategy: Strategy) -> ChunkOptions {
    ChunkOptions {
        strategy,
        max_size: MAX_TOKENS,
        overlap: 32,
        unit: Unit::Tokens,
        separators: None,
    }
}

const STRATEGIES: &[(&str, Strategy)] = &[
    ("fixed", Strategy::Fixed),
    ("sentence", Strategy::Sentence),
    ("recursive", Strategy::Recursive),
    ("structure", Strategy::Structure),
    ("auto", Strategy::Auto),
    ("semantic", Strategy::Semantic),
];

fn bare_pass(corpus: &Corpus) -> usize {
    corpus
        .sections
        .iter()
        .map(|s| tokenize(&corpus.tokenizer, s).len())
        .sum()
}

fn tokenize_and_chunk(corpus: &Corpus, strategy: Strategy, out: &mut Vec<ChunkSpan>) -> usize {
    let options = options(strategy);
    let mut chunks = 0;
    for (index, section) in corpus.sections.iter().enumerate() {
        let offsets = tokenize(&corpus.tokenizer, section);
        let input = semantic_input(corpus, index);
        chunk_section(section, &offsets, &options, Some(&input), out);
        chunks += out.len();
    }
    chunks
}

fn cut_only(corpus: &Corpus, strategy: Strategy, out: &mut Vec<ChunkSpan>) -> usize {
    let options = options(strategy);
    let mut chunks = 0;
    for (index, section) in corpus.sections.iter().enumerate() {
        let input = semantic_input(corpus, index);
        chunk_section_with_sentences(
            section,
            &corpus.offsets[index],
            &corpus.sentence_ranges[index],
            &options,
            Some(&input),
            out,
        );
        chunks += out.len();
    }
    chunks
}

fn semantic_input(corpus: &Corpus, index: usize) -> SemanticInput<'_> {
    SemanticInput {
        sentences: &corpus.sentence_ranges[index],
        similarities: &corpus.similarities[index],
        threshold: SemanticThreshold::Percentile(95.0),
        min_tokens: 16,
    }
}

fn text_splitter(corpus: &Corpus) -> usize {
    let splitter = text_splitter::TextSplitter::new(
        text_splitter::ChunkConfig::new(MAX_TOKENS as usize).with_sizer(&corpus.tokenizer),
    );
    corpus
        .sections
        .iter()
        .map(|s| splitter.chunk_indices(s).count())
        .sum()
}

fn benches(c: &mut Criterion) {
    let corpus = load_corpus();
    let mut out = Vec::new();
    let mut group = c.benchmark_group("chunking");
    group.throughput(Throughput::Elements(corpus.total_tokens));
    group.sample_size(10);
    group.bench_function("tokenize", |b| b.iter(|| black_box(bare_pass(&corpus))));
    for &(name, strategy) in STRATEGIES {
        group.bench_function(format!("tokenize+{name}"), |b| {
            b.iter(|| black_box(tokenize_and_chunk(&corpus, strategy, &mut out)))
        });
        group.bench_function(format!("cut/{name}"), |b| {
            b.iter(|| black_box(cut_only(&corpus, strategy, &mut out)))
        });
    }
    group.bench_function("text-splitter", |b| {
        b.iter(|| black_box(text_splitter(&corpus)))
    });
    group.finish();
    summary(&corpus);
}

/// Best of three timed passes of each variant, as tokens/s and as a ratio to the bare pass.
fn summary(corpus: &Corpus) {
    let tokens = corpus.total_tokens as f64;
    let best = |run: &mut dyn FnMut() -> usize| -> Duration {
        (0..3)
            .map(|_| {
                let started = Instant::now();
                black_box(run());
                started.elapsed()
            })
            .min()
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    let bare = best(&mut || bare_pass(corpus));
    let line = |name: &str, time: Duration| {
        println!(
            "{name:<22} {:>10.2} M tokens/s   {:>6.3}x the bare tokenize time",
            tokens / time.as_secs_f64() / 1e6,
            time.as_secs_f64() / bare.as_secs_f64()
        );
    };
    println!(
        "\nsummary ({} tokens, max {MAX_TOKENS} tokens, overlap 32):",
        corpus.total_tokens
    );
    line("tokenize", bare);
    for &(name, strategy) in STRATEGIES {
        line(
            &format!("tokenize+{name}"),
            best(&mut || tokenize_and_chunk(corpus, strategy, &mut out)),
        );
    }
    for &(name, strategy) in STRATEGIES {
        let chunks = cut_only(corpus, strategy, &mut out);
        let time = best(&mut || cut_only(corpus, strategy, &mut out));
        line(&format!("cut/{name} ({chunks} chunks)"), time);
    }
    line("text-splitter", best(&mut || text_splitter(corpus)));
}

criterion_group!(chunking, benches);
criterion_main!(chunking);
