//! The query pipeline. The service runs the stages in order and times each under its module's
//! name; no stage calls another. The types handed from one stage to the next are defined here;
//! what several stages share is in modules of its own, which no stage owns: `spans` (when two
//! spans of a section touch, a passage's text) and `context` (what is read before a span).
//!
//! ```text
//! RetrieveQuery
//!   └─ validate::validate_query     → (checked)         the query's own limits
//!   └─ plan::plan                   → QueryPlan         chunking (request, then collection, then server
//!                                                       defaults), the sizes cut (the one set, else ½, 1
//!                                                       and 2× the budget's), the coarse depth
//!   └─ embed::embed                 → EmbeddedQuery     query vector (one model pass) and terms
//!   └─ coarse::retrieve             → Vec<SectionHit>   top-k sections: BM25 (+ dense, fused)
//!   └─ analyze::analyze             → Vec<Arc<SectionAnalysis>>  one tokenization per section (cached)
//!   └─ rechunk::rechunk             → Vec<Candidate>    fine chunks cut on token offsets, at each size
//!   └─ score::score                 → Vec<Candidate>    chunk BM25 + section prior (+ dense), best first
//!   └─ diversify::diversify         → Vec<Candidate>    reordered by MMR (diversity > 0, or unset and an ambiguous query)
//!   └─ context::SpanContexts        → (per section)     what is read before a span (heading line in position order)
//!   └─ pack::pack                   → Vec<PackedSpan>   chunks in that order merged into the budget
//!   └─ expand::expand               → Vec<PackedSpan>   leftover budget grows spans by neighbouring sentences
//!   └─ join::join                   → Vec<Passage>      spans of neighbouring sections read as one
//!   └─ assemble::assemble           → Vec<RetrievedChunk>  ordered, with text and document offsets
//! ```

pub mod analyze;
pub mod assemble;
pub mod coarse;
pub mod context;
pub mod diversify;
pub mod embed;
pub mod expand;
pub mod join;
pub mod pack;
pub mod plan;
pub mod rechunk;
pub mod score;
mod spans;
pub mod validate;

use std::hash::BuildHasher;
use std::ops::Range;

use crate::chunk::{ChunkOptions, SemanticThreshold, Strategy};
use crate::tokens::TokenOffsets;
use crate::types::ScoreParts;

/// Hash of an analysed term, shared by section analysis and query terms.
pub fn term_hash(term: &str) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(term)
}

/// What `plan::plan` resolves for a query once its collection is known.
pub struct QueryPlan {
    /// The chunking: each field as requested, else the collection's default, else the server's.
    pub chunking: ChunkOptions,
    /// The chunk sizes the sections are cut at (`plan::chunk_sizes`).
    pub sizes: Vec<u32>,
    /// The coarse depth: the request's `top_k`, else the budget's (`plan::resolve_top_k`).
    pub top_k: u32,
    /// The semantic strategy's breakpoint rule.
    pub semantic_threshold: SemanticThreshold,
}

/// What the embed stage makes of the query text: its vector (when the collection has a dense
/// index and the server a model) and its analysed terms.
#[derive(Clone, Debug, Default)]
pub struct EmbeddedQuery {
    pub vector: Option<Vec<f32>>,
    /// Distinct analysed terms, in query order: what the coarse stage searches for.
    pub terms: Vec<String>,
    /// The same terms as chunk scoring uses them.
    pub scoring_terms: QueryTerms,
}

/// Analysed query terms, as hashes of the terms chunk scoring compares (their idf is taken over
/// each query's candidates: `score::candidate_idf`).
#[derive(Clone, Debug, Default)]
pub struct QueryTerms {
    pub hashes: Vec<u64>,
}

/// What a section's single analysis pass produces.
#[derive(Debug, Default)]
pub struct SectionAnalysis {
    /// Budget-tokenizer offsets: chunk boundaries are cut on these.
    pub tokens: TokenOffsets,
    /// BM25 analyser tokens: (byte offset, hash of the analysed term), in order.
    pub terms: Vec<(u32, u64)>,
    /// Sentences of the text ([`crate::chunk::sentences`]), so chunking does not segment again.
    pub sentences: Vec<Range<u32>>,
    /// Whether the counts of spans of the text can be read from `tokens`
    /// ([`crate::tokenizer::BudgetTokenizer::spans_count_from_offsets`]): pack and expand then
    /// count a span without tokenizing it again, exactly as its own text counts.
    pub spans_from_offsets: bool,
}

impl SectionAnalysis {
    /// What the analysis holds on the heap: its weight in the section cache.
    pub fn heap_bytes(&self) -> usize {
        self.tokens.heap_bytes()
            + self.terms.capacity() * std::mem::size_of::<(u32, u64)>()
            + self.sentences.capacity() * std::mem::size_of::<Range<u32>>()
    }
}

/// A fine chunk cut from one of the retrieved sections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Position of its section in the coarse stage's hits.
    pub hit_index: u32,
    /// Byte range in the section text.
    pub start: u32,
    pub end: u32,
    /// Budget tokens inside the range, from the section's token offsets.
    pub token_count: u32,
    /// Byte range of the table header this chunk continues without holding it (see
    /// [`crate::chunk::ChunkSpan::header`]): returned as the chunk's context.
    pub header: Option<(u32, u32)>,
    pub strategy: Strategy,
    pub score: f32,
    pub parts: ScoreParts,
}

impl Candidate {
    /// The chunk `span` of the section at `hit_index`, not scored yet.
    pub fn unscored(hit_index: u32, span: &crate::chunk::ChunkSpan) -> Self {
        Self {
            hit_index,
            start: span.start,
            end: span.end,
            token_count: span.token_count,
            header: span.header,
            strategy: span.strategy,
            score: 0.0,
            parts: ScoreParts::default(),
        }
    }
}

/// A merged span of one section, ready to be returned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedSpan {
    /// Position of its section in the coarse stage's hits.
    pub hit_index: u32,
    /// Byte range in the section text.
    pub start: u32,
    pub end: u32,
    /// Exact count in the budget tokenizer of the span's text, with its context when it has one
    /// ([`context::SpanContexts`]).
    pub token_count: u32,
    /// Byte range of the table header the span continues without holding it: the context the
    /// caller puts before the span's text.
    pub header: Option<(u32, u32)>,
    pub score: f32,
    pub parts: ScoreParts,
    pub strategy: Strategy,
}

/// Spans read as one: `parts` indexes the spans as [`join::join`] leaves them, in document order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passage {
    pub parts: Range<usize>,
    /// Exact budget tokens of what the caller reads: the context of the first part, then the
    /// text (see [`context::SpanContexts`]).
    pub token_count: u32,
}

/// What the stages after pack (expand, join) read besides the spans: the sections retrieved and
/// their analyses, the budget and its tokenizer, and what the caller reads before each span,
/// counted with it.
pub struct FitInputs<'a> {
    pub hits: &'a [crate::index::SectionHit],
    pub analyses: &'a [std::sync::Arc<SectionAnalysis>],
    pub budget: u32,
    pub tokenizer: &'a crate::tokenizer::BudgetTokenizer,
    pub contexts: &'a context::SpanContexts,
}

#[cfg(test)]
pub(crate) use test_support::{test_analysis, test_minilm, test_section_hit};

/// What the stages' unit tests cut, score and pack.
#[cfg(test)]
mod test_support {
    use super::SectionAnalysis;

    /// A retrieved section of document `d` holding `text` (ordinal 0, no metadata, no sentences):
    /// what the stages' unit tests cut, score and pack.
    pub(crate) fn test_section_hit(score: f32, text: &str) -> crate::index::SectionHit {
        crate::index::SectionHit {
            score,
            doc_id: "d".into(),
            ordinal: 0,
            version: 0,
            doc_title: String::new(),
            heading_path: Vec::new(),
            text: text.into(),
            gap_after: String::new(),
            byte_start: 0,
            char_start: 0,
            metadata: Default::default(),
            section_key: 0,
            sentences: Vec::new(),
            sentence_vectors: Vec::new(),
        }
    }

    /// The analysis of `hit` by `tokenizer` with its sentences and no query terms: what the
    /// stages' unit tests chunk and pack.
    pub(crate) fn test_analysis(
        hit: &crate::index::SectionHit,
        tokenizer: &crate::tokenizer::BudgetTokenizer,
    ) -> std::sync::Arc<SectionAnalysis> {
        let mut sentences = Vec::new();
        crate::chunk::sentences(&hit.text, &mut sentences);
        std::sync::Arc::new(SectionAnalysis {
            tokens: tokenizer.offsets(&hit.text),
            terms: Vec::new(),
            sentences,
            spans_from_offsets: tokenizer.spans_count_from_offsets(&hit.text),
        })
    }

    /// The MiniLM budget tokenizer, loaded once for the stages' unit tests.
    pub(crate) fn test_minilm() -> &'static crate::tokenizer::BudgetTokenizer {
        static TOKENIZER: std::sync::OnceLock<crate::tokenizer::BudgetTokenizer> =
            std::sync::OnceLock::new();
        TOKENIZER.get_or_init(|| {
            crate::tokenizer::BudgetTokenizer::resolve("minilm", &crate::test_models_dir())
                .expect("run scripts/fetch-models.sh")
        })
    }
}
