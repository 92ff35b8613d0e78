//! Tokenizer calls: a text cut into calls of bounded size ([`for_each_tokenizer_call`]), one
//! call's pieces joined and its tokens mapped back ([`tokenize_call`]) and remembered for the
//! next identical call ([`CallMemo`]), and an embedder's ids and offsets tokenized that way
//! ([`encode_in_calls`]). See the parent module's doc for why the work per call is bounded.

use std::ops::Range;

use tokenizers::Tokenizer;

use super::{encode_plain, EMBEDDER_MAX_RUN_BYTES, MAX_CALL_BYTES};
use crate::tokens::{ceil_char_boundary, floor_char_boundary};

/// Cuts `text` into tokenizer calls that cover it in order, and calls `call(ranges)` for each,
/// `ranges` being consecutive byte ranges of `text`:
/// - a run of whitespace chars, or of other chars, longer than `max_run_bytes` (the budget
///   tokenizers use [`MAX_RUN_BYTES`](super::MAX_RUN_BYTES); at most `MAX_CALL_BYTES / 2`) is
///   cut into pieces of at most `max_run_bytes` at char boundaries, a call each; with
///   `join_pieces`, pieces of a run of non-whitespace go several to a call instead (up to
///   [`MAX_CALL_BYTES`]), to be joined by a space ([`tokenize_call`]), so that a 10 MB word
///   costs one call per 32 KiB rather than one per 128 bytes. Joining is for the Hugging Face
///   tokenizers, whose per-call cost is high and which take a space as a word boundary (BERT
///   exactly as separate calls); tiktoken would glue the space to the next piece;
/// - the text between such runs goes in calls of one range of at most about [`MAX_CALL_BYTES`],
///   cut before a whitespace run that follows a letter or digit (no tokenizer we ship merges
///   across such a point: BERT splits at whitespace, and tiktoken's pre-split patterns end a
///   letter or digit piece there), or, failing that for long, before any whitespace run.
///
/// Text with no run over `max_run_bytes` and at most `MAX_CALL_BYTES / 2` long is one call.
pub fn for_each_tokenizer_call(
    text: &str,
    max_run_bytes: usize,
    join_pieces: bool,
    mut call: impl FnMut(&[Range<usize>]),
) {
    let max_run_bytes = max_run_bytes.clamp(4, MAX_CALL_BYTES / 2);
    // Cut at a letter-or-digit/whitespace point once this long; at any whitespace once this long
    // (runs in between are at most `max_run_bytes`, so a call stays under `MAX_CALL_BYTES`).
    let soft_limit = MAX_CALL_BYTES / 2;
    let hard_limit = MAX_CALL_BYTES
        .saturating_sub(2 * max_run_bytes + 8)
        .max(soft_limit / 2);
    let mut stretch_start = 0usize;
    let mut previous_run_ends_alphanumeric = false;
    // Pieces of long runs of non-whitespace, waiting to go in one call, and their joined length.
    let mut pieces: Vec<Range<usize>> = Vec::new();
    let mut pieces_bytes = 0usize;
    fn flush(
        pieces: &mut Vec<Range<usize>>,
        pieces_bytes: &mut usize,
        call: &mut dyn FnMut(&[Range<usize>]),
    ) {
        if !pieces.is_empty() {
            call(pieces);
            pieces.clear();
            *pieces_bytes = 0;
        }
    }
    for_each_run(text, |run_start, run_end, is_whitespace| {
        if run_end - run_start > max_run_bytes {
            if stretch_start < run_start {
                flush(&mut pieces, &mut pieces_bytes, &mut call);
                call(std::slice::from_ref(&(stretch_start..run_start)));
            }
            let mut piece_start = run_start;
            while piece_start < run_end {
                let mut piece_end =
                    floor_char_boundary(text, piece_start + max_run_bytes).min(run_end);
                if piece_end <= piece_start {
                    piece_end = ceil_char_boundary(text, piece_start + 1).min(run_end);
                }
                if is_whitespace || !join_pieces {
                    flush(&mut pieces, &mut pieces_bytes, &mut call);
                    call(std::slice::from_ref(&(piece_start..piece_end)));
                } else {
                    if pieces_bytes + 1 + (piece_end - piece_start) > MAX_CALL_BYTES {
                        flush(&mut pieces, &mut pieces_bytes, &mut call);
                    }
                    pieces_bytes += 1 + (piece_end - piece_start);
                    pieces.push(piece_start..piece_end);
                }
                piece_start = piece_end;
            }
            stretch_start = run_end;
        } else if is_whitespace && run_start > stretch_start {
            let stretch_bytes = run_start - stretch_start;
            if (stretch_bytes >= soft_limit && previous_run_ends_alphanumeric)
                || stretch_bytes >= hard_limit
            {
                flush(&mut pieces, &mut pieces_bytes, &mut call);
                call(std::slice::from_ref(&(stretch_start..run_start)));
                stretch_start = run_start;
            }
        }
        previous_run_ends_alphanumeric = !is_whitespace
            && text[..run_end]
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric);
    });
    flush(&mut pieces, &mut pieces_bytes, &mut call);
    if stretch_start < text.len() {
        call(std::slice::from_ref(&(stretch_start..text.len())));
    }
}

/// The inputs and tokens of the last few tokenizer calls. A run of one repeated char (or of a
/// repeated pattern that fits the piece grid) gives the same inputs call after call; calls are
/// independent of each other, so their tokens can be replayed exactly, and 10 MB of one letter
/// costs a few tokenizations instead of three hundred. (A run's full calls and its last, shorter
/// one alternate: one entry would not do.)
#[derive(Default)]
pub struct CallMemo {
    /// Most recently used first.
    entries: Vec<(String, CallTokens)>,
}

/// One call's tokens: (start, end, id), byte offsets in the call's input.
type CallTokens = Vec<(usize, usize, u32)>;

impl CallMemo {
    const ENTRIES: usize = 4;

    /// The tokens of `input`, tokenized with `tokenize` unless remembered.
    fn tokens(
        &mut self,
        input: &str,
        tokenize: impl FnOnce(&str, &mut dyn FnMut(usize, usize, u32)),
    ) -> &[(usize, usize, u32)] {
        match self.entries.iter().position(|(known, _)| known == input) {
            Some(index) => self.entries[..=index].rotate_right(1),
            None => {
                let mut tokens = Vec::new();
                tokenize(input, &mut |start, end, id| tokens.push((start, end, id)));
                if self.entries.len() == Self::ENTRIES {
                    self.entries.pop();
                }
                self.entries.insert(0, (input.to_string(), tokens));
            }
        }
        &self.entries[0].1
    }
}

/// Tokenizes one call of [`for_each_tokenizer_call`]: hands `ranges` of `text` to `tokenize` as
/// one string (a single range as it is; several joined by a space, which every tokenizer we ship
/// takes as a word boundary) unless `memo` holds that very input, and passes each token
/// `(start, end, id)`, mapped back to `text`, to `sink`. A token wholly inside a joining space
/// is dropped; one that begins in it (a byte-level BPE glues the space to the next word) is
/// taken to begin with the next range.
pub fn tokenize_call(
    text: &str,
    ranges: &[Range<usize>],
    memo: &mut CallMemo,
    tokenize: impl FnOnce(&str, &mut dyn FnMut(usize, usize, u32)),
    sink: &mut dyn FnMut(usize, usize, u32),
) {
    let [first, rest @ ..] = ranges else {
        return;
    };
    let mut joined_starts = Vec::with_capacity(ranges.len());
    let input: std::borrow::Cow<'_, str> = if rest.is_empty() {
        joined_starts.push(0);
        std::borrow::Cow::Borrowed(&text[first.clone()])
    } else {
        let mut joined = String::with_capacity(ranges.iter().map(|r| r.len() + 1).sum());
        for range in ranges {
            if !joined.is_empty() {
                joined.push(' ');
            }
            joined_starts.push(joined.len());
            joined.push_str(&text[range.clone()]);
        }
        std::borrow::Cow::Owned(joined)
    };
    let tokens = memo.tokens(&input, tokenize);
    // The range an input position lies in or, in the space after a range, that range.
    let range_at = |position: usize| joined_starts.partition_point(|&s| s <= position).max(1) - 1;
    for &(start, end, id) in tokens {
        let index = range_at(start);
        let range = &ranges[index];
        let range_end_in_input = joined_starts[index] + range.len();
        let start_in_text = if start < range_end_in_input {
            range.start + (start - joined_starts[index])
        } else if end <= range_end_in_input + 1 || index + 1 == ranges.len() {
            // Wholly inside the joining space (or past the end: never from a real tokenizer).
            continue;
        } else {
            ranges[index + 1].start
        };
        let end_index = range_at(end.saturating_sub(1).max(start));
        let end_range = &ranges[end_index];
        let end_in_text = end_range.start + (end - joined_starts[end_index]).min(end_range.len());
        sink(start_in_text, end_in_text.max(start_in_text), id);
    }
}

/// Calls `run(start, end, is_whitespace)` for each maximal run of whitespace chars and of other
/// chars of `text`, in order.
fn for_each_run(text: &str, mut run: impl FnMut(usize, usize, bool)) {
    let mut chars = text.char_indices();
    let Some((_, first)) = chars.next() else {
        return;
    };
    let mut run_start = 0usize;
    let mut run_is_whitespace = first.is_whitespace();
    for (position, ch) in chars {
        let is_whitespace = ch.is_whitespace();
        if is_whitespace != run_is_whitespace {
            run(run_start, position, run_is_whitespace);
            run_start = position;
            run_is_whitespace = is_whitespace;
        }
    }
    run(run_start, text.len(), run_is_whitespace);
}

/// Ids and byte offsets of `text` in a Hugging Face tokenizer (no special tokens), for an
/// embedder: tokenized call by call as [`for_each_tokenizer_call`] cuts it with runs of at most
/// [`EMBEDDER_MAX_RUN_BYTES`], so that one huge text or word never makes one huge call, while a
/// huge word stays a few `[UNK]`s (pieces of 128 bytes, as for budgets, would make a 5 MB word
/// 40,000 model inputs). Calls stop once `max_tokens` ids are in (callers that truncate pass
/// their limit; the result may hold a few more).
pub fn encode_in_calls(
    tokenizer: &Tokenizer,
    text: &str,
    max_tokens: usize,
) -> std::result::Result<EncodedText, tokenizers::Error> {
    let mut ids = Vec::new();
    let mut offsets = Vec::new();
    let mut failure = None;
    let mut memo = CallMemo::default();
    for_each_tokenizer_call(text, EMBEDDER_MAX_RUN_BYTES, false, |ranges| {
        if failure.is_some() || ids.len() >= max_tokens {
            return;
        }
        tokenize_call(
            text,
            ranges,
            &mut memo,
            |input, tokens| {
                if let Err(error) = encode_plain(tokenizer, input, tokens) {
                    failure = Some(error);
                }
            },
            &mut |start, end, id| {
                ids.push(id);
                offsets.push((start, end));
            },
        );
    });
    match failure {
        Some(error) => Err(error),
        None => Ok(EncodedText { ids, offsets }),
    }
}

/// Ids and byte offsets of one text, from [`encode_in_calls`].
pub struct EncodedText {
    pub ids: Vec<u32>,
    pub offsets: Vec<(usize, usize)>,
}

#[cfg(test)]
// Calls are lists of ranges: one call of one range is what many tests expect.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::models_dir;
    use crate::tokenizer::{BudgetTokenizer, MAX_RUN_BYTES};

    fn calls_of(text: &str) -> Vec<Vec<Range<usize>>> {
        let mut calls = Vec::new();
        for_each_tokenizer_call(text, MAX_RUN_BYTES, true, |ranges| {
            calls.push(ranges.to_vec())
        });
        calls
    }

    #[test]
    fn ordinary_text_is_one_call_and_long_runs_are_cut_into_pieces_of_one_call() {
        let text = "Plain words, and more words.\n\nA second paragraph.";
        assert_eq!(calls_of(text), [vec![0..text.len()]]);
        assert!(calls_of("").is_empty());

        let text = format!("zebra {} tail", "b".repeat(1000));
        let calls = calls_of(&text);
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(calls[0], [0..6]);
        assert_eq!(calls[1].len(), 1000usize.div_ceil(MAX_RUN_BYTES));
        assert_eq!(calls[1][0], 6..6 + MAX_RUN_BYTES);
        assert_eq!(calls[1].last().unwrap().end, 1006);
        assert_eq!(calls[2], [1006..text.len()]);
        // Without joining, a piece a call.
        let mut separate = 0;
        for_each_tokenizer_call(&text, MAX_RUN_BYTES, false, |ranges| {
            assert_eq!(ranges.len(), 1);
            separate += 1;
        });
        assert_eq!(separate, 2 + 1000usize.div_ceil(MAX_RUN_BYTES));
        // Whitespace runs are cut too, a piece a call.
        let spaces = format!("a{}b", " ".repeat(300));
        assert_eq!(
            calls_of(&spaces).len(),
            2 + 300usize.div_ceil(MAX_RUN_BYTES)
        );
    }

    #[test]
    fn calls_cover_the_text_in_order_within_the_limits() {
        let prose = "Sentence one, with words. Zwei Wörter! 東京 😀\n".repeat(5000);
        let mixed = format!(
            "{prose}{}{}{}{prose}",
            "😀".repeat(30_000),
            " \t\n".repeat(500),
            "é".repeat(999)
        );
        for text in [prose.as_str(), mixed.as_str()] {
            let calls = calls_of(text);
            let mut expected_start = 0;
            for ranges in &calls {
                let joined_bytes: usize = ranges.iter().map(|r| r.len() + 1).sum::<usize>() - 1;
                assert!(joined_bytes <= MAX_CALL_BYTES, "{joined_bytes} bytes");
                for range in ranges {
                    assert_eq!(range.start, expected_start);
                    assert!(range.start < range.end && text.is_char_boundary(range.end));
                    assert!(ranges.len() == 1 || range.len() <= MAX_RUN_BYTES);
                    expected_start = range.end;
                }
            }
            assert_eq!(expected_start, text.len());
        }
        // Ordinary text is cut where a letter or digit meets whitespace.
        for ranges in &calls_of(&prose)[1..] {
            let start = ranges[0].start;
            assert!(prose[start..].starts_with(char::is_whitespace));
            assert!(prose[..start].ends_with(char::is_alphanumeric));
        }
    }

    /// Pieces joined into one call give each piece's tokens, mapped back, as separate calls do
    /// (WordPiece), and a byte-level BPE's token that begins in the joining space is taken to
    /// begin with the next piece.
    #[test]
    fn joined_pieces_tokenize_as_separate_calls() {
        let text = format!("{}{}", "b".repeat(300), "😀".repeat(100));
        let ranges = [0..128, 128..256, 256..300, 300..428, 428..500];
        for name in ["minilm", "cl100k_base"] {
            let tokenizer = BudgetTokenizer::resolve(name, &models_dir()).unwrap();
            let mut joined = Vec::new();
            tokenize_call(
                &text,
                &ranges,
                &mut CallMemo::default(),
                |input, tokens| tokenizer.tokenize_one_call(input, tokens),
                &mut |start, end, id| joined.push((start, end, id)),
            );
            let mut separate = Vec::new();
            for range in &ranges {
                tokenize_call(
                    &text,
                    std::slice::from_ref(range),
                    &mut CallMemo::default(),
                    |input, tokens| tokenizer.tokenize_one_call(input, tokens),
                    &mut |start, end, id| separate.push((start, end, id)),
                );
            }
            if name == "minilm" {
                assert_eq!(joined, separate);
            }
            for &(start, end, _) in &joined {
                let range = ranges
                    .iter()
                    .find(|range| range.contains(&start))
                    .expect("every token begins in a piece");
                assert!(
                    end <= range.end || name != "minilm",
                    "{name}: {start}..{end}"
                );
                // Raw byte-level spans: not yet snapped to chars.
                assert!(start < end, "{name}: {start}..{end}");
            }
            for pair in joined.windows(2) {
                assert!(pair[0].0 <= pair[1].0, "{name}: out of order");
            }
        }
    }
}
