//! Shared driver of the fuzz targets: arbitrary text and settings for one strategy; the contract
//! (`check_invariants`) must hold for the tokenizer-shaped offsets, and nothing may panic for
//! arbitrary raw token spans.

use std::ops::Range;

use arbitrary::Arbitrary;
use lathe_text::chunk::{
    check_invariants, chunk_section, sentences, ChunkOptions, SemanticInput, SemanticThreshold,
    Strategy, Unit,
};
use lathe_text::tokens::TokenOffsets;

#[derive(Arbitrary, Debug)]
pub struct Case {
    text: String,
    max_size: u16,
    overlap: u16,
    unit: u8,
    tokenizer: u8,
    raw_spans: Vec<(u16, u16)>,
    separators: Option<Vec<String>>,
    similarities: Vec<f32>,
    threshold: u8,
    amount: f32,
    min_tokens: u8,
    own_sentences: bool,
}

pub fn run(strategy: Strategy, case: Case) {
    let text = case.text.as_str();
    let max_size = u32::from(case.max_size).max(1);
    let options = ChunkOptions {
        strategy,
        max_size,
        overlap: u32::from(case.overlap) % max_size,
        unit: match case.unit % 3 {
            0 => Unit::Tokens,
            1 => Unit::Words,
            _ => Unit::Chars,
        },
        separators: case.separators.map(Into::into),
    };
    let (tokens, sane) = match case.tokenizer % 4 {
        0 => (TokenOffsets::whitespace(text), true),
        1 => (each_char(text, 1), true),
        2 => (each_char(text, 4), true),
        _ => (
            TokenOffsets::from_spans(
                text,
                case.raw_spans
                    .iter()
                    .map(|&(a, b)| (usize::from(a), usize::from(b))),
            ),
            false,
        ),
    };
    let mut sentence_ranges: Vec<Range<u32>> = Vec::new();
    if case.own_sentences {
        sentences(text, &mut sentence_ranges);
    } else {
        // Arbitrary (possibly invalid) ranges: the chunker must reject them, not panic.
        sentence_ranges.extend(
            case.raw_spans
                .iter()
                .map(|&(a, b)| u32::from(a)..u32::from(b)),
        );
    }
    let mut similarities = case.similarities;
    if case.own_sentences {
        similarities.resize(sentence_ranges.len().saturating_sub(1), 0.5);
    }
    let threshold = match case.threshold % 4 {
        0 => SemanticThreshold::Percentile(case.amount),
        1 => SemanticThreshold::StdDev(case.amount),
        2 => SemanticThreshold::Interquartile(case.amount),
        _ => SemanticThreshold::Gradient(case.amount),
    };
    let input = SemanticInput {
        sentences: &sentence_ranges,
        similarities: &similarities,
        threshold,
        min_tokens: u32::from(case.min_tokens),
    };
    let mut spans = Vec::new();
    chunk_section(text, &tokens, &options, Some(&input), &mut spans);
    if sane {
        if let Err(problem) = check_invariants(text, &tokens, &options, &spans) {
            panic!("{problem}\noptions: {options:?}\ntext: {text:?}\nspans: {spans:?}");
        }
    }
}

/// `per_char` tokens for each non-whitespace char (4: a byte-level BPE's worst case).
fn each_char(text: &str, per_char: usize) -> TokenOffsets {
    TokenOffsets::from_spans(
        text,
        text.char_indices()
            .filter(|(_, c)| !c.is_whitespace())
            .flat_map(|(i, c)| {
                std::iter::repeat_n((i, i + c.len_utf8()), per_char.min(c.len_utf8()))
            }),
    )
}
