//! Query-time chunking (interim: fixed and sentence; the full module replaces this file).
use std::ops::Range;
use std::sync::Arc;

use crate::tokens::TokenOffsets;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Fixed,
    Sentence,
    Recursive,
    Structure,
    Auto,
    Semantic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Unit {
    #[default]
    Tokens,
    Words,
    Chars,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkOptions {
    pub strategy: Strategy,
    pub max_size: u32,
    pub overlap: u32,
    pub unit: Unit,
    pub separators: Option<Arc<[String]>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    pub start: u32,
    pub end: u32,
    pub token_count: u32,
    pub strategy: Strategy,
}

pub struct SemanticInput<'a> {
    pub sentences: &'a [Range<u32>],
    pub similarities: &'a [f32],
}

pub fn sentences(text: &str, out: &mut Vec<Range<u32>>) {
    use unicode_segmentation::UnicodeSegmentation;
    out.clear();
    for (start, sentence) in text.split_sentence_bound_indices() {
        let trimmed = sentence.trim_end();
        if trimmed.trim_start().is_empty() {
            continue;
        }
        let lead = trimmed.len() - trimmed.trim_start().len();
        out.push((start + lead) as u32..(start + trimmed.len()) as u32);
    }
}

pub fn chunk_section(
    text: &str,
    tokens: &TokenOffsets,
    options: &ChunkOptions,
    _semantic: Option<&SemanticInput>,
    out: &mut Vec<ChunkSpan>,
) {
    out.clear();
    let max = options.max_size.max(1) as usize;
    match options.strategy {
        Strategy::Fixed => {
            let step = max - (options.overlap as usize).min(max - 1);
            let mut first = 0;
            while first < tokens.len() {
                let last = (first + max).min(tokens.len());
                out.push(span(tokens, first..last, Strategy::Fixed));
                if last == tokens.len() {
                    break;
                }
                first += step;
            }
        }
        _ => {
            let mut sentence_ranges = Vec::new();
            sentences(text, &mut sentence_ranges);
            let mut current: Option<Range<usize>> = None;
            for sentence in sentence_ranges {
                let token_range =
                    tokens.tokens_within(sentence.start as usize..sentence.end as usize);
                if token_range.is_empty() {
                    continue;
                }
                if token_range.len() > max {
                    if let Some(range) = current.take() {
                        out.push(span(tokens, range, Strategy::Sentence));
                    }
                    let mut first = token_range.start;
                    while first < token_range.end {
                        let last = (first + max).min(token_range.end);
                        out.push(span(tokens, first..last, Strategy::Sentence));
                        first = last;
                    }
                    continue;
                }
                current = match current {
                    Some(range) if token_range.end - range.start <= max => {
                        Some(range.start..token_range.end)
                    }
                    Some(range) => {
                        out.push(span(tokens, range, Strategy::Sentence));
                        Some(token_range)
                    }
                    None => Some(token_range),
                };
            }
            if let Some(range) = current {
                out.push(span(tokens, range, Strategy::Sentence));
            }
        }
    }
}

fn span(tokens: &TokenOffsets, range: Range<usize>, strategy: Strategy) -> ChunkSpan {
    ChunkSpan {
        start: tokens.start(range.start) as u32,
        end: tokens.end(range.end - 1) as u32,
        token_count: range.len() as u32,
        strategy,
    }
}
