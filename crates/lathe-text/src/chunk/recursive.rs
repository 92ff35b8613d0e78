//! `Recursive`: LangChain `RecursiveCharacterTextSplitter` over byte spans.
//!
//! The first separator that occurs in a piece splits it (the separator stays at the end of the
//! piece before it, so "。" stays with its sentence); pieces within the limit are merged with
//! overlap exactly as LangChain's `_merge_splits` does, and a piece over the limit flushes the
//! pieces gathered so far and is split again with the finer separators. The empty separator, and
//! running out of separators, cut between tokens.

use std::ops::Range;

use super::budget::Cutter;
use super::{ChunkSpan, Strategy, DEFAULT_SEPARATORS};

pub(super) fn chunk(
    cutter: &Cutter,
    overlap: usize,
    separators: Option<&[String]>,
    out: &mut Vec<ChunkSpan>,
) {
    let separator_list: Vec<&str> = match separators {
        Some(list) => list.iter().map(String::as_str).collect(),
        None => DEFAULT_SEPARATORS.to_vec(),
    };
    split(cutter, 0, cutter.text.len(), &separator_list, overlap, out);
}

fn split(
    cutter: &Cutter,
    start: usize,
    end: usize,
    separators: &[&str],
    overlap: usize,
    out: &mut Vec<ChunkSpan>,
) {
    let piece_text = &cutter.text[start..end];
    // The first separator present; the empty one (or none left) means token boundaries.
    let chosen = separators
        .iter()
        .position(|separator| separator.is_empty() || piece_text.contains(separator));
    let mut pieces: Vec<Range<u32>> = Vec::new();
    let (separator, finer) = match chosen {
        Some(index) if !separators[index].is_empty() => {
            (separators[index], &separators[index + 1..])
        }
        _ => {
            // Single tokens, but a word's continuation pieces stay with it while it fits, so
            // that no chunk starts inside a word (re-tokenizing it would give more tokens).
            cutter.split_tokens(start, end, 1, |a, b| {
                if let Some(previous) = pieces.last_mut() {
                    if cutter.starts_mid_word(a)
                        && cutter.count(previous.start as usize, b) <= cutter.max_tokens
                    {
                        previous.end = b as u32;
                        return;
                    }
                }
                pieces.push(a as u32..b as u32)
            });
            merge(cutter, &pieces, overlap, out);
            return;
        }
    };
    let mut good: Vec<Range<u32>> = Vec::new();
    let mut piece_start = start;
    let mut handle = |piece_start: usize, piece_end: usize, good: &mut Vec<Range<u32>>| {
        let Some((a, b)) = cutter.trimmed(piece_start, piece_end) else {
            return;
        };
        if cutter.count(a, b) <= cutter.max_tokens {
            good.push(a as u32..b as u32);
            return;
        }
        merge(cutter, good, overlap, out);
        good.clear();
        split(cutter, a, b, finer, overlap, out);
    };
    for (offset, _) in piece_text.match_indices(separator) {
        let piece_end = start + offset + separator.len();
        handle(piece_start, piece_end, &mut good);
        piece_start = piece_end;
    }
    if piece_start < end {
        handle(piece_start, end, &mut good);
    }
    merge(cutter, &good, overlap, out);
}

/// LangChain's `_merge_splits`: extend the current chunk piece by piece; when the next piece does
/// not fit, emit it, then drop pieces from its front until what is left holds at most `overlap`
/// tokens and leaves room for the next piece.
fn merge(cutter: &Cutter, pieces: &[Range<u32>], overlap: usize, out: &mut Vec<ChunkSpan>) {
    let budget = cutter.max_tokens;
    let mut first = 0;
    for next in 0..pieces.len() {
        let next_end = pieces[next].end as usize;
        if first < next && cutter.count(pieces[first].start as usize, next_end) > budget {
            let current_end = pieces[next - 1].end as usize;
            push(cutter, out, pieces[first].start as usize, current_end);
            while first < next
                && (cutter.count(pieces[first].start as usize, current_end) > overlap
                    || cutter.count(pieces[first].start as usize, next_end) > budget)
            {
                first += 1;
            }
        }
    }
    if first < pieces.len() {
        push(
            cutter,
            out,
            pieces[first].start as usize,
            pieces[pieces.len() - 1].end as usize,
        );
    }
}

fn push(cutter: &Cutter, out: &mut Vec<ChunkSpan>, start: usize, end: usize) {
    cutter.push(out, start, end, Strategy::Recursive, None, None);
}
