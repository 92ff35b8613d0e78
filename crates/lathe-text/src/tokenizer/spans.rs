//! Exact counts of spans of one text, read from the text's own offsets where that is exact.
//!
//! Packing and expansion count a great many spans of the same few sections, and a span's count
//! must be the count of its own text ([`BudgetTokenizer::count`]), which may differ from the
//! section's tokens it covers: a word cut at the span's edge tokenizes differently. Tokenizing
//! every span again made a long budget cost hundreds of milliseconds.
//!
//! # Cuts
//! A *cut* of a text is a position where tokenizing the two sides on their own gives exactly the
//! tokens the whole text has on each side. Which positions are cuts depends on the tokenizer
//! ([`CutRule`]); the rules only name positions between two ASCII chars, where no normaliser,
//! pre-tokenizer or byte-pair piece of the tokenizers below can join across:
//! - [`CutRule::WhitespaceWords`]: Hugging Face tokenizers that split words at whitespace first
//!   (BERT's pre-tokenizer, `Whitespace`, `WhitespaceSplit`, optionally followed by splitters
//!   that only split further), with normalisers that work char by char (BERT's, lowercasing,
//!   Unicode normal forms, accent stripping), a WordPiece model with its unknown token, added
//!   tokens without whitespace or stripping, and no post-processor that moves offsets: between
//!   ASCII whitespace (space, tab, line feed, carriage return) and a printable ASCII char, in
//!   either order. Words never span whitespace, and a printable ASCII char is always in a token.
//! - [`CutRule::PiecesBeforeWhitespace`]: tiktoken's `cl100k_base` and `o200k_base`: after an ASCII
//!   letter or digit followed by ASCII whitespace, or after ASCII punctuation followed by a
//!   space or a tab. Their pre-split patterns end a letter, digit or punctuation piece there (a
//!   punctuation piece may take following line breaks, hence not before those), the next piece
//!   starts afresh, and byte-pair merges stay within a piece.
//!
//! A section is read this way only when the tokenizer sees it in one call (at most
//! `MAX_CALL_BYTES / 2` bytes and no run over `MAX_RUN_BYTES`, [`super::for_each_tokenizer_call`]),
//! so that its offsets are that one tokenization; then so is every span of it. Bounding (see
//! [`crate::tokens`]) keeps the cuts: a token ends at every cut (the printable char before it, or
//! after it, is in a token), so no long-token piece or gap cover crosses one.
//!
//! # A span's count
//! For a span `a..b` of such a section: `p1` is `a` when `a` is a cut or the section's start,
//! else the first cut after `a`; `p2` is `b` when `b` is a cut or the section's end, else the last
//! cut before `b`. Then the span's count is the count of `a..p1` on its own text, plus the
//! section's tokens within `p1..p2` (two binary searches), plus the count of `p2..b` on its own
//! text — the two edges counted as parts: one without any token adds none (alone, a non-empty
//! text counts one). A span whose parts add up to nothing holds no token and is counted whole
//! (it counts one, or its covers). Chunk edges are mostly cuts already, so most spans need no tokenizer call at all. Spans
//! without a cut, sections past the one-call size and tokenizers without a rule are counted on
//! their own text, as before. Debug builds check every such count against the plain count.

use std::ops::Range;

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{Model, ModelWrapper, Tokenizer};

use super::{BudgetTokenizer, MAX_CALL_BYTES, MAX_RUN_BYTES};
use crate::tokens::TokenOffsets;

/// Where a tokenizer's text may be cut without changing the tokens on either side (see the
/// module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CutRule {
    /// No position is known to be a cut: every span is counted on its own text.
    Unknown,
    /// Between ASCII whitespace and a printable ASCII char, in either order.
    WhitespaceWords,
    /// After an ASCII letter or digit followed by ASCII whitespace, or after ASCII punctuation
    /// followed by a space or a tab.
    PiecesBeforeWhitespace,
}

impl CutRule {
    /// The rule of a Hugging Face tokenizer: [`CutRule::WhitespaceWords`] when every part of it
    /// is one the module doc names, else [`CutRule::Unknown`].
    pub(super) fn of_tokenizer_json(tokenizer: &Tokenizer) -> Self {
        let normalizer_ok = tokenizer
            .get_normalizer()
            .is_none_or(char_by_char_normalizer);
        let pre_tokenizer_ok = tokenizer
            .get_pre_tokenizer()
            .is_some_and(splits_whitespace_first);
        let model_ok = match tokenizer.get_model() {
            ModelWrapper::WordPiece(wordpiece) => {
                wordpiece.token_to_id(&wordpiece.unk_token).is_some()
            }
            _ => false,
        };
        let post_processor_ok = matches!(
            tokenizer.get_post_processor(),
            None | Some(PostProcessorWrapper::Bert(_) | PostProcessorWrapper::Template(_))
        );
        let added_tokens_ok = tokenizer.get_added_tokens_decoder().values().all(|token| {
            !token.lstrip && !token.rstrip && !token.content.contains(char::is_whitespace)
        });
        if normalizer_ok && pre_tokenizer_ok && model_ok && post_processor_ok && added_tokens_ok {
            Self::WhitespaceWords
        } else {
            Self::Unknown
        }
    }

    /// Whether byte position `p` of `bytes` is a cut (`0 < p < bytes.len()`).
    fn is_cut(self, bytes: &[u8], p: usize) -> bool {
        let (before, after) = (bytes[p - 1], bytes[p]);
        let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self {
            Self::Unknown => false,
            Self::WhitespaceWords => {
                (is_space(before) && after.is_ascii_graphic())
                    || (before.is_ascii_graphic() && is_space(after))
            }
            Self::PiecesBeforeWhitespace => {
                (before.is_ascii_alphanumeric() && is_space(after))
                    || (before.is_ascii_punctuation() && matches!(after, b' ' | b'\t'))
            }
        }
    }
}

fn char_by_char_normalizer(normalizer: &NormalizerWrapper) -> bool {
    match normalizer {
        NormalizerWrapper::BertNormalizer(_)
        | NormalizerWrapper::Lowercase(_)
        | NormalizerWrapper::NFC(_)
        | NormalizerWrapper::NFD(_)
        | NormalizerWrapper::NFKC(_)
        | NormalizerWrapper::NFKD(_)
        | NormalizerWrapper::StripAccents(_) => true,
        NormalizerWrapper::Sequence(sequence) => {
            sequence.as_ref().iter().all(char_by_char_normalizer)
        }
        _ => false,
    }
}

/// A pre-tokenizer that splits at whitespace (and, in a sequence, then only splits further).
fn splits_whitespace_first(pre_tokenizer: &PreTokenizerWrapper) -> bool {
    match pre_tokenizer {
        PreTokenizerWrapper::BertPreTokenizer(_)
        | PreTokenizerWrapper::Whitespace(_)
        | PreTokenizerWrapper::WhitespaceSplit(_) => true,
        PreTokenizerWrapper::Sequence(sequence) => {
            let steps = sequence.as_ref();
            steps.first().is_some_and(splits_whitespace_first)
                && steps.iter().all(|step| {
                    splits_whitespace_first(step)
                        || matches!(
                            step,
                            PreTokenizerWrapper::Punctuation(_) | PreTokenizerWrapper::Digits(_)
                        )
                })
        }
        _ => false,
    }
}

impl BudgetTokenizer {
    /// Whether spans of `text` can be counted from its offsets ([`Self::count_span`] with
    /// `from_offsets`): this tokenizer has a cut rule and sees `text` in one call.
    pub fn spans_count_from_offsets(&self, text: &str) -> bool {
        self.cut_rule != CutRule::Unknown
            && text.len() <= MAX_CALL_BYTES / 2
            && runs_at_most(text, MAX_RUN_BYTES)
    }

    /// Exactly `self.count(&text[bytes])`. `offsets` are this tokenizer's offsets of `text`, and
    /// `from_offsets` what [`Self::spans_count_from_offsets`] says of it; with it the count is
    /// read from the offsets as the module doc describes.
    pub fn count_span(
        &self,
        text: &str,
        offsets: &TokenOffsets,
        from_offsets: bool,
        bytes: Range<usize>,
    ) -> usize {
        let (a, b) = (bytes.start, bytes.end);
        let cuts = if from_offsets && a < b {
            self.inner_cuts(text.as_bytes(), a, b)
        } else {
            None
        };
        let Some((p1, p2)) = cuts else {
            return self.count(&text[a..b]);
        };
        // Counted as parts, an edge without a token adds none; the span as a whole counts one
        // when it holds none at all, which is when its parts add up to nothing.
        let head = if a < p1 {
            self.count_part(&text[a..p1])
        } else {
            0
        };
        let tail = if p2 < b {
            self.count_part(&text[p2..b])
        } else {
            0
        };
        let counted = head + offsets.count_within(p1..p2) + tail;
        if counted == 0 {
            return self.count(&text[a..b]);
        }
        debug_assert_eq!(
            counted,
            self.count(&text[a..b]),
            "span {a}..{b} of {:?}",
            &text[a..b]
        );
        counted
    }

    /// Exactly `self.count(&format!("{line}\n{}", &text[bytes]))`, where `line_tokens` is
    /// `self.count(line)`: a span read after a line of context (a section's heading path).
    ///
    /// When the line break is a cut on both sides (the line ends and the span starts with a
    /// printable ASCII char, under [`CutRule::WhitespaceWords`]), each side holds a token and the
    /// break itself none, so the count is the line's plus the span's, read from the offsets as
    /// [`Self::count_span`] reads it. Otherwise the joined text is counted.
    pub fn count_after_line(
        &self,
        line: &str,
        line_tokens: usize,
        text: &str,
        offsets: &TokenOffsets,
        from_offsets: bool,
        bytes: Range<usize>,
    ) -> usize {
        let span = &text[bytes.clone()];
        let rule = self.cut_rule;
        let cut_on_both_sides = match (line.as_bytes().last(), span.as_bytes().first()) {
            (Some(&last), Some(&first)) => {
                rule == CutRule::WhitespaceWords
                    && rule.is_cut(&[last, b'\n'], 1)
                    && rule.is_cut(&[b'\n', first], 1)
            }
            _ => false,
        };
        if !cut_on_both_sides {
            let mut joined = String::with_capacity(line.len() + 1 + span.len());
            joined.push_str(line);
            joined.push('\n');
            joined.push_str(span);
            return self.count(&joined);
        }
        let counted = line_tokens + self.count_span(text, offsets, from_offsets, bytes);
        debug_assert_eq!(
            counted,
            self.count(&format!("{line}\n{span}")),
            "{line:?} then {span:?}"
        );
        counted
    }

    /// Whether any text ending with the byte `left_last`, then `gap`, then any text starting
    /// with `right_first` counts exactly as the two texts apart: under
    /// [`CutRule::WhitespaceWords`], when `gap` is ASCII whitespace between printable ASCII
    /// chars, both its ends are cuts and it holds no token. (Two neighbouring sections read as
    /// one passage: `query::join`.)
    pub fn gap_adds_nothing(&self, left_last: u8, gap: &str, right_first: u8) -> bool {
        let gap = gap.as_bytes();
        let (Some(&first), Some(&last)) = (gap.first(), gap.last()) else {
            return false;
        };
        self.cut_rule == CutRule::WhitespaceWords
            && gap
                .iter()
                .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            && self.cut_rule.is_cut(&[left_last, first], 1)
            && self.cut_rule.is_cut(&[last, right_first], 1)
    }

    /// The first cut at or after `a` and the last at or before `b` (the text's ends count as
    /// cuts for a span that starts or ends there), when they are in order.
    fn inner_cuts(&self, bytes: &[u8], a: usize, b: usize) -> Option<(usize, usize)> {
        let rule = self.cut_rule;
        let is_cut = |p: usize| p > 0 && p < bytes.len() && rule.is_cut(bytes, p);
        let p1 = if a == 0 || is_cut(a) {
            a
        } else {
            (a + 1..b).find(|&p| is_cut(p))?
        };
        let p2 = if b == bytes.len() || is_cut(b) {
            b
        } else {
            // `p1` itself only when it is a cut: the text's start is one only for a span's head.
            (p1 + 1..b)
                .rev()
                .find(|&p| is_cut(p))
                .or(is_cut(p1).then_some(p1))?
        };
        Some((p1, p2))
    }
}

/// Whether no run of whitespace chars or of other chars in `text` is longer than `most` bytes
/// (the runs [`super::for_each_tokenizer_call`] cuts into pieces past [`MAX_RUN_BYTES`]). ASCII
/// bytes are classed without decoding a char, and the scan stops at the first run too long.
fn runs_at_most(text: &str, most: usize) -> bool {
    if text.len() <= most {
        return true;
    }
    let bytes = text.as_bytes();
    let (mut position, mut run_start) = (0, 0);
    let mut run_is_whitespace = None;
    while position < bytes.len() {
        let (is_whitespace, width) = match bytes[position] {
            // `char::is_whitespace` of the ASCII chars: tab, line feed, vertical tab, form feed,
            // carriage return and space.
            byte @ 0..=0x7f => (matches!(byte, b'\t'..=b'\r' | b' '), 1),
            _ => {
                let ch = text[position..].chars().next().unwrap_or_default();
                (ch.is_whitespace(), ch.len_utf8())
            }
        };
        if run_is_whitespace != Some(is_whitespace) {
            run_start = position;
            run_is_whitespace = Some(is_whitespace);
        }
        position += width;
        if position - run_start > most {
            return false;
        }
    }
    true
}

#[cfg(test)]
pub(super) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tokenizer::tests::models_dir;

    /// Where a gap adds nothing, two texts joined by it count as the two apart; it adds
    /// nothing only under WordPiece, for ASCII whitespace between printable ASCII chars.
    #[test]
    fn a_gap_adds_nothing_only_where_both_ends_are_cuts() {
        let [minilm, cl100k, _] = tokenizers() else {
            unreachable!()
        };
        for (left, gap, right) in [
            ("one.", "\n\n", "Two"),
            ("a)", " \t\r\n", "(b"),
            ("x", " ", "y"),
        ] {
            assert!(minilm.gap_adds_nothing(
                *left.as_bytes().last().unwrap(),
                gap,
                right.as_bytes()[0]
            ));
            let apart = minilm.count(left) + minilm.count(right);
            assert_eq!(minilm.count(&format!("{left}{gap}{right}")), apart);
            assert!(!cl100k.gap_adds_nothing(
                *left.as_bytes().last().unwrap(),
                gap,
                right.as_bytes()[0]
            ));
        }
        assert!(!minilm.gap_adds_nothing(b'a', "", b'b'), "no gap: one word");
        assert!(
            !minilm.gap_adds_nothing(b'a', "\u{a0}", b'b'),
            "not ASCII whitespace"
        );
        assert!(
            !minilm.gap_adds_nothing(0xa9, " ", b'b'),
            "not an ASCII char before it"
        );
    }

    fn tokenizers() -> &'static [BudgetTokenizer] {
        static TOKENIZERS: std::sync::OnceLock<Vec<BudgetTokenizer>> = std::sync::OnceLock::new();
        TOKENIZERS.get_or_init(|| {
            ["minilm", "cl100k_base", "o200k_base"]
                .iter()
                .map(|name| BudgetTokenizer::resolve(name, &models_dir()).unwrap())
                .collect()
        })
    }

    #[test]
    fn the_shipped_tokenizers_have_cut_rules_and_others_are_counted_whole() {
        let rules: Vec<CutRule> = tokenizers().iter().map(|t| t.cut_rule).collect();
        assert_eq!(
            rules,
            [
                CutRule::WhitespaceWords,
                CutRule::PiecesBeforeWhitespace,
                CutRule::PiecesBeforeWhitespace
            ]
        );
        // The same MiniLM file with a byte-level pre-tokenizer (GPT-2's): no rule is known.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let mut json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(models_dir().join(super::super::MINILM_TOKENIZER_PATH))
                .unwrap(),
        )
        .unwrap();
        json["pre_tokenizer"] = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let byte_level = BudgetTokenizer::resolve(path.to_str().unwrap(), &models_dir()).unwrap();
        assert_eq!(byte_level.cut_rule, CutRule::Unknown);
        assert!(!byte_level.spans_count_from_offsets("plain words"));
    }

    #[test]
    fn only_texts_of_one_call_are_counted_from_offsets() {
        let minilm = &tokenizers()[0];
        assert!(minilm.spans_count_from_offsets("Two words."));
        assert!(!minilm.spans_count_from_offsets(&"word ".repeat(4000)));
        assert!(!minilm.spans_count_from_offsets(&format!("a {} b", "x".repeat(129))));
        assert!(minilm.spans_count_from_offsets(&format!("a {} b", "x".repeat(128))));
    }

    #[test]
    fn a_span_between_cuts_is_counted_without_the_tokenizer_and_agrees() {
        let minilm = &tokenizers()[0];
        let text = "Denver beat Carolina 24-10. The game was played in Santa Clara.";
        let offsets = minilm.offsets(text);
        let start = text.find("The").unwrap();
        let end = text.find(" Santa").unwrap();
        assert_eq!(
            minilm.inner_cuts(text.as_bytes(), start, end),
            Some((start, end)),
            "both edges are cuts"
        );
        assert_eq!(
            minilm.count_span(text, &offsets, true, start..end),
            minilm.count(&text[start..end])
        );
        // A span that starts inside a word is counted from its first cut on.
        let inside = text.find("ver").unwrap();
        assert_eq!(
            minilm.inner_cuts(text.as_bytes(), inside, end),
            Some((text.find(" beat").unwrap(), end))
        );
    }

    #[test]
    fn edges_without_a_token_add_none_and_a_span_without_one_counts_one() {
        let minilm = &tokenizers()[0];
        // The head, a space before a cut, has no token: alone it would count one.
        let text = "A  a b";
        let offsets = minilm.offsets(text);
        assert_eq!(minilm.count_span(text, &offsets, true, 2..4), 1);
        // A lone space after a cut: its parts add up to nothing, and on its own it counts one.
        let text = "YFAabJ ς";
        let offsets = minilm.offsets(text);
        assert_eq!(minilm.count_span(text, &offsets, true, 6..7), 1);
        assert_eq!(minilm.count(" "), 1);
    }

    /// Text made to stress cuts: ASCII words, digits and punctuation beside every kind of
    /// whitespace Rust, BERT and tiktoken disagree on, control and format chars, combining marks,
    /// CJK, Greek capitals (final sigma), emoji, contractions, line breaks and added tokens.
    pub(in crate::tokenizer) fn tricky_text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                6 => "[a-zA-Z]{1,9}",
                2 => "[0-9]{1,6}",
                3 => Just(" ".to_string()),
                1 => prop::sample::select(vec![
                    "\t", "\n", "\r\n", "\n\n", "  ", "\u{b}", "\u{c}", "\u{85}", "\u{a0}",
                    "\u{2028}", "\u{3000}", "\u{200b}", "\u{1}", "\u{feff}",
                ]).prop_map(str::to_string),
                2 => prop::sample::select(vec![
                    ".", ",", "!", "?", "'s", "'ll", "-", "--", "(", ")", "\"", "/", "#", "...",
                    "[MASK]", "[UNK]", "[CLS]", "|", "$", "%",
                ]).prop_map(str::to_string),
                1 => prop::sample::select(vec![
                    "é", "e\u{301}", "\u{301}", "東京", "日本語", "ΣΑΣ", "ς", "İ", "👩‍👩‍👧", "😀",
                    "مرحبا", "ไทย", "ß", "ﬁ", "Ⅻ", "①", "\u{fffd}", "𝔘",
                ]).prop_map(str::to_string),
                1 => "\\PC{1,3}",
            ],
            0..80,
        )
        .prop_map(|parts| parts.concat())
    }

    /// Short texts over a small alphabet, so that every pair of neighbours (cut or not) occurs.
    pub(in crate::tokenizer) fn dense_text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec![
                "a", "Z", "7", ".", ",", "'", "-", "(", " ", " ", "\n", "\t", "\r", "\u{b}",
                "\u{85}", "\u{a0}", "é", "\u{301}", "東", "\u{1}", "ς", "[MASK]", "'s",
            ]),
            0..40,
        )
        .prop_map(|parts| parts.concat())
    }

    /// A char boundary of `text` picked by `pick`.
    fn boundary(text: &str, pick: usize) -> usize {
        let boundaries: Vec<usize> = text
            .char_indices()
            .map(|(i, _)| i)
            .chain([text.len()])
            .collect();
        boundaries[pick % boundaries.len()]
    }

    /// The longest run of whitespace chars or of other chars, in bytes, char by char: what
    /// [`runs_at_most`] must agree with.
    fn longest_run(text: &str) -> usize {
        let mut runs: Vec<(bool, usize)> = Vec::new();
        for ch in text.chars() {
            match runs.last_mut() {
                Some((white, bytes)) if *white == ch.is_whitespace() => *bytes += ch.len_utf8(),
                _ => runs.push((ch.is_whitespace(), ch.len_utf8())),
            }
        }
        runs.iter().map(|&(_, bytes)| bytes).max().unwrap_or(0)
    }

    #[test]
    fn runs_are_measured_in_bytes_whatever_their_chars() {
        // A no-break space and an ideographic space are whitespace of 2 and 3 bytes; `é` and `中`
        // are other chars of 2 and 3 bytes; vertical tab and form feed are ASCII whitespace.
        for (text, longest) in [
            ("ab  cd", 2),
            ("a\u{a0}\u{3000} b", 6),
            ("é中x y", 6),
            ("x\x0b\x0c\r\n\ty", 5),
            ("", 0),
        ] {
            assert_eq!(longest_run(text), longest, "{text:?}");
            assert!(runs_at_most(text, longest), "{text:?}");
            assert!(
                !runs_at_most(text, longest.saturating_sub(1)) || longest == 0,
                "{text:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn runs_at_most_agrees_with_the_longest_run_char_by_char(
            text in "[ a\\t\\n\\x0b\u{a0}\u{2003}é中\u{1f600}-]{0,40}",
            most in 0usize..12,
        ) {
            prop_assert_eq!(runs_at_most(&text, most), longest_run(&text) <= most);
        }

        /// Read from the offsets or not, a span's count is its own text's count: for spans cut
        /// anywhere and for spans on token edges (as chunks are).
        #[test]
        fn a_span_counts_as_its_own_text(
            text in prop_oneof![tricky_text(), dense_text()],
            which in 0usize..3,
            picks in prop::collection::vec((any::<usize>(), any::<usize>()), 1..12),
            on_tokens in any::<bool>(),
        ) {
            let tokenizer = &tokenizers()[which];
            let offsets = tokenizer.offsets(&text);
            let from_offsets = tokenizer.spans_count_from_offsets(&text);
            for (x, y) in picks {
                let (mut a, mut b) = if on_tokens && !offsets.is_empty() {
                    (offsets.start(x % offsets.len()), offsets.end(y % offsets.len()))
                } else {
                    (boundary(&text, x), boundary(&text, y))
                };
                if a > b {
                    std::mem::swap(&mut a, &mut b);
                }
                if a == b {
                    continue;
                }
                let expected = tokenizer.count(&text[a..b]);
                let counted = tokenizer.count_span(&text, &offsets, from_offsets, a..b);
                prop_assert_eq!(
                    counted, expected,
                    "{} span {}..{} {:?} of {:?}", tokenizer.name(), a, b, &text[a..b], text
                );
            }
        }
    }
}
