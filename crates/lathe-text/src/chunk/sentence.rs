//! `Sentence`: whole sentences packed up to the token limit, overlapping by whole sentences.

use std::ops::Range;

use super::budget::Cutter;
use super::segment;
use super::{ChunkSpan, Strategy};

pub(super) fn chunk(cutter: &Cutter, overlap: usize, strategy: Strategy, out: &mut Vec<ChunkSpan>) {
    let mut segmented = Vec::new();
    let sentence_ranges = match cutter.sentences {
        Some(known) => known,
        None => {
            segment::sentences_in(cutter.text, 0, cutter.text.len(), &mut segmented);
            &segmented
        }
    };
    let mut units = Vec::with_capacity(sentence_ranges.len());
    sentence_units(cutter, sentence_ranges, cutter.max_tokens, &mut units);
    cutter.pack(&units, cutter.max_tokens, overlap, |start, end| {
        cutter.push(out, start, end, strategy, None, None)
    });
}

/// Turns sentences into packing units of at most `budget` tokens: a sentence that is too long is
/// cut after clause punctuation, and a clause that is still too long at token starts.
pub(super) fn sentence_units(
    cutter: &Cutter,
    sentence_ranges: &[Range<u32>],
    budget: usize,
    units: &mut Vec<Range<u32>>,
) {
    for sentence in sentence_ranges {
        let (start, end) = (sentence.start as usize, sentence.end as usize);
        if cutter.count(start, end) <= budget {
            units.push(sentence.clone());
            continue;
        }
        segment::clause_pieces(cutter.text, start, end, |clause_start, clause_end| {
            cutter.push_unit_or_split(clause_start, clause_end, budget, units)
        });
    }
}

/// Sentence units of `start..end` (absolute offsets), for strategies that split prose blocks.
pub(super) fn prose_units(
    cutter: &Cutter,
    start: usize,
    end: usize,
    budget: usize,
    units: &mut Vec<Range<u32>>,
) {
    let mut sentence_ranges = Vec::new();
    segment::sentences_in(cutter.text, start, end, &mut sentence_ranges);
    sentence_units(cutter, &sentence_ranges, budget, units);
}
