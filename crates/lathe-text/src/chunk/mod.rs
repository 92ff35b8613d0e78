//! Query-time chunking: re-cuts a retrieved section into fine chunks.
//!
//! A section has been tokenized once into [`TokenOffsets`]; every strategy here cuts against those
//! offsets (never re-tokenizing a candidate piece) and returns byte spans into the section text.
//!
//! # Layout
//! - `mod.rs`: the public types and [`chunk_section`], which routes to a strategy.
//! - `budget.rs`: the shared cutting primitives (token-bounded cuts, packing units with overlap).
//! - `segment.rs`: [`sentences`] (UAX #29 plus abbreviation and Thai handling) and clause pieces.
//! - `fixed.rs`, `sentence.rs`, `recursive.rs`, `structure.rs`, `auto.rs` (CSV rows and source
//!   code), `semantic.rs`: one strategy each.
//!
//! # Guarantees (checked by the property tests in `tests.rs`)
//! Chunks come in order (starts and ends strictly increase); every non-whitespace char of the
//! section lies in some chunk; offsets lie on char boundaries; chunks are trimmed of surrounding
//! whitespace and never empty; `token_count <= max_size` (for `Fixed` in words or chars: at most
//! `max_size` of that unit); the overlap of two neighbours holds at most `overlap` tokens (units).
//! The one exception to the size limit: a single char that by itself holds more than `max_size`
//! tokens (a byte-level BPE can give one emoji several tokens, all widened to the char) becomes a
//! chunk of its own, since no cut on a char boundary can divide it.

mod auto;
mod budget;
mod fixed;
mod invariants;
mod recursive;
mod segment;
mod semantic;
mod sentence;
mod structure;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use crate::tokens::TokenOffsets;

// The domain enums live in `types` (a leaf every layer may use); the chunker is where most code
// reaches for them.
mod strategy;

pub use strategy::{SemanticThreshold, Strategy, Unit};

pub use invariants::check_invariants;
pub use segment::sentences;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkOptions {
    pub strategy: Strategy,
    /// Largest chunk, in `unit` for `Fixed` and in tokens otherwise; values below 1 act as 1.
    pub max_size: u32,
    /// Overlap of neighbours, in the same unit; values `>= max_size` act as `max_size - 1`.
    pub overlap: u32,
    pub unit: Unit,
    /// Separators for `Recursive`, coarsest first; `None` takes [`DEFAULT_SEPARATORS`]. An empty
    /// string means "between tokens" and is always tried last.
    pub separators: Option<Arc<[String]>>,
}

/// One chunk: a byte span of the section text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Start byte, on a char boundary.
    pub start: u32,
    /// End byte (exclusive), on a char boundary.
    pub end: u32,
    /// `tokens.count_within(start..end)`.
    pub token_count: u32,
    /// The strategy that actually cut this chunk (`Auto` reports the routed one).
    pub strategy: Strategy,
    /// (Added) Byte span of a table header (Markdown header and delimiter rows, or the first CSV
    /// row) that this chunk continues without holding it: the server prepends it. Its tokens were
    /// reserved, so `token_count + count_within(header) <= max_size`.
    pub header: Option<(u32, u32)>,
    /// (Added) Byte span of the innermost Markdown heading this chunk lies under when the chunk
    /// does not start with it (`Structure` only): context the server may prepend. Not reserved.
    pub heading: Option<(u32, u32)>,
}

/// Sentence data for [`Strategy::Semantic`], computed elsewhere from stored sentence vectors.
pub struct SemanticInput<'a> {
    /// Byte ranges of the sentences of the section, in order.
    pub sentences: &'a [Range<u32>],
    /// Cosine similarity of sentence `i` and `i + 1`; `len == sentences.len() - 1`.
    pub similarities: &'a [f32],
    pub threshold: SemanticThreshold,
    /// Groups holding fewer tokens are merged into a neighbour when the merge fits `max_size`.
    pub min_tokens: u32,
}

/// Default separators of `Recursive`, coarsest first: paragraph, line, sentence ends (CJK,
/// Devanagari, Arabic, Myanmar, Latin), clauses, words; then token boundaries.
pub const DEFAULT_SEPARATORS: &[&str] = &[
    "\n\n", "\n", "。", "！", "？", "।", "॥", "؟", "۔", "။", ". ", "! ", "? ", "；", "; ", "，",
    "、", "،", ", ", "：", ": ", " ", "",
];

/// Cuts `text` (whose tokens are `tokens`) into chunks, replacing the contents of `out`.
///
/// `semantic` is only read by [`Strategy::Semantic`]; without it (or with sentence data that does
/// not match the text) that strategy falls back to [`Strategy::Sentence`].
pub fn chunk_section(
    text: &str,
    tokens: &TokenOffsets,
    options: &ChunkOptions,
    semantic: Option<&SemanticInput>,
    out: &mut Vec<ChunkSpan>,
) {
    cut(text, tokens, None, options, semantic, out);
}

/// [`chunk_section`] for a text whose sentences are known already: `sentences` must be what
/// [`sentences`] gives for `text` (the server keeps them in its section cache), so that no
/// strategy segments the text again. The chunks are the same as [`chunk_section`]'s.
pub fn chunk_section_with_sentences(
    text: &str,
    tokens: &TokenOffsets,
    sentences: &[Range<u32>],
    options: &ChunkOptions,
    semantic: Option<&SemanticInput>,
    out: &mut Vec<ChunkSpan>,
) {
    cut(text, tokens, Some(sentences), options, semantic, out);
}

fn cut(
    text: &str,
    tokens: &TokenOffsets,
    sentences: Option<&[Range<u32>]>,
    options: &ChunkOptions,
    semantic: Option<&SemanticInput>,
    out: &mut Vec<ChunkSpan>,
) {
    out.clear();
    // Offsets are u32; a longer section cannot come from ingest, and would be cut wrongly.
    if text.len() > u32::MAX as usize || text.trim().is_empty() {
        return;
    }
    let max_size = options.max_size.max(1);
    let overlap = options.overlap.min(max_size - 1);
    let cutter = budget::Cutter {
        text,
        tokens,
        max_tokens: max_size as usize,
        sentences,
    };
    match options.strategy {
        Strategy::Fixed => fixed::chunk(&cutter, options.unit, overlap as usize, out),
        Strategy::Sentence => sentence::chunk(&cutter, overlap as usize, Strategy::Sentence, out),
        Strategy::Recursive => recursive::chunk(
            &cutter,
            overlap as usize,
            options.separators.as_deref(),
            out,
        ),
        Strategy::Structure => structure::chunk(&cutter, out),
        Strategy::Auto => auto::chunk(&cutter, overlap as usize, out),
        Strategy::Semantic => match semantic {
            Some(input) if semantic::chunk(&cutter, input, out) => {}
            _ => {
                out.clear();
                sentence::chunk(&cutter, overlap as usize, Strategy::Sentence, out)
            }
        },
        Strategy::Csv => {
            if !auto::chunk_csv(&cutter, out) {
                out.clear();
                sentence::chunk(&cutter, overlap as usize, Strategy::Sentence, out)
            }
        }
        Strategy::Code => auto::chunk_code(&cutter, out),
    }
}
