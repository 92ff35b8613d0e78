//! Sentence vectors at ingest, for many sections in one pass: each sentence embedded on its own,
//! or by late chunking (each section run through the model in overlapping windows, each sentence
//! pooling its own token states).

use std::ops::Range;

use super::run::Sequence;
use super::session::SessionSide;
use super::{MiniLmEmbedder, MINILM_DIM};
use crate::embed::{l2_normalize, validate_sentence_ranges, EmbedError, FineMode, VectorMatrix};
use crate::tokens::TokenOffsets;

/// A late-chunking window over the section's tokens: the model sees `tokens`, and the states of
/// `owned` (the tokens with the most context in this window) are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LateChunkingWindow {
    tokens: Range<usize>,
    owned: Range<usize>,
}

impl MiniLmEmbedder {
    /// Sentence vectors of many sections in one pass, so that batches are filled across
    /// sections (a section alone often has only a handful of sentences or one window).
    pub(super) fn batched_sentence_vectors(
        &self,
        sections: &[(&str, &[Range<usize>])],
        mode: FineMode,
    ) -> Result<Vec<VectorMatrix>, EmbedError> {
        for (text, sentences) in sections {
            validate_sentence_ranges(text, sentences)?;
        }
        match mode {
            FineMode::PerSentence => self.per_sentence_vectors(sections),
            FineMode::LateChunking => self.late_chunking_vectors(sections),
        }
    }

    fn per_sentence_vectors(
        &self,
        sections: &[(&str, &[Range<usize>])],
    ) -> Result<Vec<VectorMatrix>, EmbedError> {
        let mut matrices = zero_matrices(sections);
        let mut encodings = Vec::new();
        let mut targets = Vec::new();
        for (section_index, (text, sentences)) in sections.iter().enumerate() {
            for (row, range) in sentences.iter().enumerate() {
                let encoding = self.tokenize(&text[range.clone()], self.max_content_tokens())?;
                // A sentence without tokens keeps its zero row (see `Embedder::sentence_vectors`).
                if encoding.ids.is_empty() {
                    continue;
                }
                encodings.push(encoding);
                targets.push((section_index, row));
            }
        }
        let max_content = self.max_content_tokens();
        let token_lists: Vec<&[u32]> = encodings
            .iter()
            .map(|encoding| &encoding.ids[..encoding.ids.len().min(max_content)])
            .collect();
        self.embed_token_lists(&token_lists, &targets, &mut matrices, SessionSide::Ingest)?;
        Ok(matrices)
    }

    fn late_chunking_vectors(
        &self,
        sections: &[(&str, &[Range<usize>])],
    ) -> Result<Vec<VectorMatrix>, EmbedError> {
        let mut matrices = zero_matrices(sections);
        let mut encodings = Vec::with_capacity(sections.len());
        let mut sentence_tokens: Vec<Vec<Range<usize>>> = Vec::with_capacity(sections.len());
        let mut windows: Vec<(usize, LateChunkingWindow)> = Vec::new();
        for (section_index, (text, sentences)) in sections.iter().enumerate() {
            let encoding = self.tokenize(text, usize::MAX)?;
            let offsets = TokenOffsets::from_spans(text, encoding.offsets.iter().copied());
            // A token belongs to the sentence its first byte lies in; this also works for
            // sentence ranges that leave gaps or split a token.
            sentence_tokens.push(
                sentences
                    .iter()
                    .map(|range| {
                        let starts = offsets.starts();
                        let first = starts.partition_point(|&start| (start as usize) < range.start);
                        let end = starts.partition_point(|&start| (start as usize) < range.end);
                        first..end.max(first)
                    })
                    .collect(),
            );
            windows.extend(
                plan_late_chunking_windows(
                    encoding.ids.len(),
                    self.max_content_tokens(),
                    self.config.late_chunking_overlap_tokens,
                )
                .into_iter()
                .map(|window| (section_index, window)),
            );
            encodings.push(encoding);
        }
        let sequences: Vec<Sequence<'_>> = windows
            .iter()
            .map(|(section_index, window)| Sequence {
                content_ids: &encodings[*section_index].ids[window.tokens.clone()],
            })
            .collect();
        self.run_sequences(&sequences, SessionSide::Ingest, |window_index, states| {
            let (section_index, window) = &windows[window_index];
            let matrix = &mut matrices[*section_index];
            for (sentence_index, tokens) in sentence_tokens[*section_index].iter().enumerate() {
                let first = tokens.start.max(window.owned.start);
                let end = tokens.end.min(window.owned.end);
                if first >= end {
                    continue;
                }
                let row = matrix.row_mut(sentence_index);
                for token in first..end {
                    // Row 0 of the window's states is [CLS].
                    let state_row = token - window.tokens.start + 1;
                    let token_state = &states[state_row * MINILM_DIM..(state_row + 1) * MINILM_DIM];
                    row.iter_mut()
                        .zip(token_state)
                        .for_each(|(sum, x)| *sum += x);
                }
            }
        })?;
        // Sentences without tokens kept zero sums and stay zero.
        for matrix in &mut matrices {
            for row in 0..matrix.rows() {
                l2_normalize(matrix.row_mut(row));
            }
        }
        Ok(matrices)
    }
}

/// Cuts `token_count` tokens into windows of at most `window_tokens`, consecutive windows sharing
/// `overlap_tokens` (the last window is pulled back to end at the text's end, so it is full).
/// Ownership of a shared token goes to the window where it lies farther from the cut: the
/// overlap is split at its middle. The owned ranges partition `0..token_count`.
fn plan_late_chunking_windows(
    token_count: usize,
    window_tokens: usize,
    overlap_tokens: usize,
) -> Vec<LateChunkingWindow> {
    let window_tokens = window_tokens.max(1);
    // An overlap of half a window or more would make no progress.
    let overlap_tokens = overlap_tokens.min((window_tokens - 1) / 2);
    let mut windows: Vec<LateChunkingWindow> = Vec::new();
    let mut start = 0;
    while start < token_count {
        let mut end = start + window_tokens;
        if end >= token_count {
            end = token_count;
            start = token_count.saturating_sub(window_tokens);
        }
        windows.push(LateChunkingWindow {
            tokens: start..end,
            owned: 0..0,
        });
        if end == token_count {
            break;
        }
        start = end - overlap_tokens;
    }
    let window_count = windows.len();
    for index in 0..window_count {
        let owned_start = if index == 0 {
            0
        } else {
            (windows[index].tokens.start + windows[index - 1].tokens.end).div_ceil(2)
        };
        let owned_end = if index + 1 == window_count {
            token_count
        } else {
            (windows[index + 1].tokens.start + windows[index].tokens.end).div_ceil(2)
        };
        windows[index].owned = owned_start..owned_end;
    }
    windows
}

/// One zero matrix per section, a row per sentence: the rows an embedding fills (a sentence
/// without tokens keeps its zero row).
fn zero_matrices(sections: &[(&str, &[Range<usize>])]) -> Vec<VectorMatrix> {
    sections
        .iter()
        .map(|(_, sentences)| VectorMatrix::zeros(MINILM_DIM, sentences.len()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_text_is_one_window_owning_everything() {
        let windows = plan_late_chunking_windows(10, 254, 32);
        assert_eq!(
            windows,
            vec![LateChunkingWindow {
                tokens: 0..10,
                owned: 0..10
            }]
        );
        assert!(plan_late_chunking_windows(0, 254, 32).is_empty());
    }

    #[test]
    fn overlap_is_split_at_its_middle() {
        let windows = plan_late_chunking_windows(300, 100, 20);
        let tokens: Vec<_> = windows.iter().map(|w| w.tokens.clone()).collect();
        assert_eq!(tokens, vec![0..100, 80..180, 160..260, 200..300]);
        let owned: Vec<_> = windows.iter().map(|w| w.owned.clone()).collect();
        assert_eq!(owned, vec![0..90, 90..170, 170..230, 230..300]);
    }

    proptest! {
        #[test]
        fn owned_ranges_partition_the_tokens_inside_their_windows(
            token_count in 0usize..3000, window in 1usize..300, overlap in 0usize..200,
        ) {
            let windows = plan_late_chunking_windows(token_count, window, overlap);
            let mut next = 0;
            for w in &windows {
                prop_assert!(w.tokens.len() <= window);
                prop_assert!(w.tokens.end <= token_count);
                prop_assert_eq!(w.owned.start, next);
                prop_assert!(w.owned.start >= w.tokens.start && w.owned.end <= w.tokens.end);
                next = w.owned.end;
            }
            prop_assert_eq!(next, token_count);
        }
    }
}
