//! What goes into a collection's index and what comes out of it: the writer takes [`WriteOp`]s
//! of [`DocumentRecord`]s (one per document version, its sections as [`SectionRecord`]s); a
//! search gives back [`SectionHit`]s. How they become tantivy documents is in `section_document`.

use std::collections::BTreeMap;
use std::ops::Range;

/// One section ready to be indexed.
#[derive(Clone, Debug)]
pub struct SectionRecord {
    pub ordinal: u64,
    pub heading_path: Vec<String>,
    pub text: String,
    /// The whitespace between this section and the next one in the document ([`gap_after`]):
    /// what joins a chunk ending this section to one starting the next.
    pub gap_after: String,
    pub byte_start: u64,
    pub char_start: u64,
    /// Stable id of this version of the section (see [`section_key`]).
    pub section_key: u64,
    /// Sentence byte ranges in `text`.
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes, one row per sentence; empty without the neural stage.
    pub sentence_vectors: Vec<u8>,
    /// One-row `QuantizedVectors` bytes of the section's vector; empty without the neural stage.
    pub section_vector: Vec<u8>,
}

/// Longest [`SectionRecord::gap_after`] stored: a longer run of whitespace is not worth
/// returning inside a chunk, so the sections on either side of it are never joined.
pub const MAX_GAP_BYTES: usize = 64;

/// The gap stored after a section ending at byte `end` of `text` when the next one starts at
/// `next_start`: the text between them when it is whitespace only and at most
/// [`MAX_GAP_BYTES`] long, else empty (the last section, overlapping sections, a caller's
/// sections with text between them that belongs to neither).
pub fn gap_after(text: &str, end: usize, next_start: Option<usize>) -> &str {
    match next_start.and_then(|next| text.get(end..next)) {
        Some(gap) if gap.len() <= MAX_GAP_BYTES && gap.chars().all(char::is_whitespace) => gap,
        _ => "",
    }
}

/// The dense-index key of one version of one section. Keys are stored in the index, so this
/// must never change for the same inputs.
pub fn section_key(doc_id: &str, ordinal: u64, version: u64) -> u64 {
    crate::content_hash::content_hash([
        doc_id.as_bytes(),
        &ordinal.to_le_bytes(),
        &version.to_le_bytes(),
    ])
}

/// One document's sections, all from one version.
#[derive(Clone, Debug)]
pub struct DocumentRecord {
    pub doc_id: String,
    pub title: String,
    pub metadata: BTreeMap<String, String>,
    pub text_bytes: u64,
    pub version: u64,
    pub sections: Vec<SectionRecord>,
}

/// One change to a collection, applied in order by its writer.
#[derive(Clone, Debug)]
pub enum WriteOp {
    /// Replaces every section of the document by these.
    Upsert(DocumentRecord),
    Delete {
        doc_id: String,
    },
}

/// What a stored section's vectors were computed from, and the vectors: what the embed stage
/// needs to reuse them for an unchanged section (see `ingest::embed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEmbedding {
    pub text: String,
    /// Sentence byte ranges in `text`.
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes, one row per sentence; empty when none were stored.
    pub sentence_vectors: Vec<u8>,
    /// One-row `QuantizedVectors` bytes; empty when none was stored.
    pub section_vector: Vec<u8>,
}

/// A section found by the coarse search, with what re-chunking needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SectionHit {
    pub score: f32,
    pub doc_id: String,
    pub ordinal: u64,
    pub version: u64,
    pub doc_title: String,
    pub heading_path: Vec<String>,
    pub text: String,
    /// [`SectionRecord::gap_after`]; empty in an index written before gaps were stored.
    pub gap_after: String,
    pub byte_start: u64,
    pub char_start: u64,
    pub metadata: BTreeMap<String, String>,
    pub section_key: u64,
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes (empty without the neural stage).
    pub sentence_vectors: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_whitespace_only_short_and_between_sections_in_order() {
        let text = format!("a \u{a0}\n b{}c", " ".repeat(MAX_GAP_BYTES + 1));
        assert_eq!(
            gap_after(&text, 1, Some(text.find('b').unwrap())),
            " \u{a0}\n "
        );
        assert_eq!(gap_after(&text, 1, Some(1)), "", "sections that touch");
        assert_eq!(gap_after(&text, 1, None), "", "the last section");
        assert_eq!(gap_after(&text, 3, Some(1)), "", "overlapping sections");
        assert_eq!(
            gap_after(&text, 0, Some(text.find('b').unwrap())),
            "",
            "text between"
        );
        let b = text.find('b').unwrap() + 1;
        assert_eq!(gap_after(&text, b, Some(text.len() - 1)), "", "too long");
        // Inside a char: `get` refuses the range instead of panicking.
        assert_eq!(gap_after(&text, 2, Some(3)), "");
    }

    #[test]
    fn a_section_key_is_stable_and_tells_versions_and_positions_apart() {
        // Stored in every index written so far: a change would orphan every section vector.
        assert_eq!(section_key("a", 0, 1), 0x243f_9355_69c6_23ce);
        let keys = [
            section_key("a", 0, 1),
            section_key("a", 0, 2),
            section_key("a", 1, 1),
            section_key("b", 0, 1),
            // The id's bytes do not run into the ordinal's.
            section_key("a\0", 0, 1),
        ];
        for (i, key) in keys.iter().enumerate() {
            assert!(!keys[i + 1..].contains(key), "key {i} repeats: {keys:x?}");
        }
    }
}
