//! The retrieve pipeline. The service runs the stages in order; no stage calls another.
//!
//! ```text
//! RetrieveQuery
//!   └─ coarse::retrieve      → Vec<SectionHit>          top-k sections by BM25 (tantivy)
//!   └─ analyze::analyze      → Vec<Arc<SectionAnalysis>> one tokenization per section (cached)
//!   └─ rechunk::rechunk      → Vec<Candidate>            fine chunks cut on token offsets
//!   └─ score::score          → Vec<Candidate> (scored)   chunk BM25 + section prior (+ dense)
//!   └─ pack::pack            → Vec<PackedSpan>           best chunks merged into the budget
//!   └─ assemble              → Vec<RetrievedChunk>       text and document offsets
//! ```

pub mod analyze;
pub mod coarse;
pub mod pack;
pub mod rechunk;
pub mod score;

use crate::chunk::Strategy;
use crate::types::ScoreParts;

/// A fine chunk cut from one of the retrieved sections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Index of the section in the coarse stage's hits.
    pub section: u32,
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
    /// The chunk `span` of section `section`, not scored yet.
    pub fn unscored(section: u32, span: &crate::chunk::ChunkSpan) -> Self {
        Self {
            section,
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
