//! A whitespace-local Hugging Face tokenizer ([`CutRule::WhitespaceWords`]: BERT-style WordPiece)
//! one word at a time, with the tokens of each word remembered: the same tokens, offsets and ids
//! as `tokenizer.encode(input, false)` gives the whole input, at a fraction of the cost.
//!
//! The Hugging Face pipeline keeps alignment data for every char it normalises and allocates
//! several strings per word; on text it sees for the first time that is most of a lexical ingest's
//! CPU, and most of a query's section analysis. But under that rule tokenizing the two sides of a
//! cut on their own gives exactly the tokens of the whole on each side (see the `spans` module
//! doc), and a run of ASCII whitespace with a printable ASCII char (or the input's edge) on both
//! sides is two cuts with no token between them. So the tokens of an input are those of its
//! *words*, the text between such runs, each tokenized alone and shifted to where it lies. Words
//! repeat: a word's tokens are computed once with the tokenizer's own `encode` and remembered,
//! in a memory shared by every collection and thread using that tokenizer file. The words not yet known are encoded together in one call, joined by single spaces
//! (cuts again), so text of unseen words costs about one `encode` of it, as before.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use rustc_hash::{FxBuildHasher, FxHashMap};
use tokenizers::Tokenizer;

/// Longest word remembered (its offsets fit a `u8`); longer ones are encoded every time.
const MAX_WORD_BYTES: usize = 48;
/// Words remembered before a shard is cleared and starts again (about 25 MB in all).
const REMEMBERED_WORDS: usize = 1 << 18;
/// Independently locked parts of the memory, so that pool threads seldom wait on each other.
const SHARDS: usize = 16;

/// One token of a remembered word: byte offsets in the word, and the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WordToken {
    start: u8,
    end: u8,
    id: u32,
}

type Shard = FxHashMap<Box<str>, Box<[WordToken]>>;

/// The words tokenized with one tokenizer, shared by every collection and thread that uses it.
pub(super) struct WordMemo {
    shards: Box<[Mutex<Shard>]>,
}

impl std::fmt::Debug for WordMemo {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("WordMemo").finish_non_exhaustive()
    }
}

/// A token of the input, or (`start == u32::MAX`) the place of the `end`-th unknown word.
type Slot = (u32, u32, u32);
const UNKNOWN: u32 = u32::MAX;

impl WordMemo {
    pub(super) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, word: &str) -> std::sync::MutexGuard<'_, Shard> {
        // The low bits pick the map's bucket; the shard comes from the high ones.
        let shard = (FxBuildHasher.hash_one(word) >> 58) as usize % SHARDS;
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls `tokens(start, end, id)` for each token `tokenizer.encode(input, false)` gives, in
    /// order, offsets in bytes of `input`. `tokenizer` must be whitespace-local
    /// ([`CutRule::WhitespaceWords`]) and the one every call of this memory passes.
    ///
    /// [`CutRule::WhitespaceWords`]: super::spans::CutRule::WhitespaceWords
    pub(super) fn encode(
        &self,
        tokenizer: &Tokenizer,
        input: &str,
        tokens: &mut dyn FnMut(usize, usize, u32),
    ) -> tokenizers::Result<()> {
        let words = words_of(input);
        // The tokens of the words remembered, in order, with a slot for each of the others.
        let mut slots: Vec<Slot> = Vec::with_capacity(words.len() + words.len() / 2);
        let mut unknown = Vec::new();
        for range in &words {
            let word = &input[range.clone()];
            match self.shard(word).get(word) {
                Some(known) => slots.extend(known.iter().map(|t| {
                    let start = range.start as u32;
                    (start + u32::from(t.start), start + u32::from(t.end), t.id)
                })),
                None => {
                    slots.push((UNKNOWN, unknown.len() as u32, 0));
                    unknown.push(range.clone());
                }
            }
        }
        let Some(fresh) = encode_together(tokenizer, input, &unknown)? else {
            return super::encode_plain(tokenizer, input, tokens);
        };
        for &(start, end, id) in &slots {
            if start != UNKNOWN {
                tokens(start as usize, end as usize, id);
                continue;
            }
            let word_start = unknown[end as usize].start;
            for &(start, end, id) in &fresh[end as usize] {
                tokens(word_start + start, word_start + end, id);
            }
        }
        for (range, word_tokens) in unknown.into_iter().zip(fresh) {
            let word = &input[range];
            if word.len() > MAX_WORD_BYTES {
                continue;
            }
            let compact = word_tokens
                .into_iter()
                .map(|(start, end, id)| WordToken {
                    start: start as u8,
                    end: end as u8,
                    id,
                })
                .collect();
            let mut shard = self.shard(word);
            if shard.len() >= REMEMBERED_WORDS / SHARDS {
                shard.clear();
            }
            shard.insert(word.into(), compact);
        }
        Ok(())
    }
}

/// One word's tokens: (start, end, id), byte offsets in the word.
type WordTokens = Vec<(usize, usize, u32)>;

/// The tokens of each of `unknown` (ranges of `input`; offsets in the word), from one `encode`
/// of them joined by single spaces ([`super::tokenize_call`]); `None` if a token reached past
/// its word (never under the rule).
fn encode_together(
    tokenizer: &Tokenizer,
    input: &str,
    unknown: &[Range<usize>],
) -> tokenizers::Result<Option<Vec<WordTokens>>> {
    let mut per_word = vec![Vec::new(); unknown.len()];
    let (mut failure, mut crossed) = (None, false);
    super::tokenize_call(
        input,
        unknown,
        &mut super::CallMemo::default(),
        |joined, tokens| {
            if let Err(error) = super::encode_plain(tokenizer, joined, tokens) {
                failure = Some(error);
            }
        },
        &mut |start, end, id| {
            let at = unknown.partition_point(|word| word.start <= start).max(1) - 1;
            let word = &unknown[at];
            crossed |= end > word.end;
            per_word[at].push((start - word.start, end - word.start, id));
        },
    );
    if let Some(error) = failure {
        return Err(error);
    }
    debug_assert!(!crossed, "a token crosses a joining space in {unknown:?}");
    Ok((!crossed).then_some(per_word))
}

/// The words of `input`: the non-empty stretches between runs of ASCII whitespace (space, tab,
/// line feed, carriage return) that have a printable ASCII char or the input's edge on each side.
/// A run beside anything else (a combining mark, a control char, non-ASCII whitespace) is not
/// known to be a cut and stays inside its word.
fn words_of(input: &str) -> Vec<Range<usize>> {
    let bytes = input.as_bytes();
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut words = Vec::with_capacity(bytes.len() / 5 + 1);
    let mut word_start = 0;
    let mut at = 0;
    while at < bytes.len() {
        if !is_space(bytes[at]) {
            at += 1;
            continue;
        }
        let run_start = at;
        while at < bytes.len() && is_space(bytes[at]) {
            at += 1;
        }
        let cut_before = run_start == 0 || bytes[run_start - 1].is_ascii_graphic();
        let cut_after = at == bytes.len() || bytes[at].is_ascii_graphic();
        if cut_before && cut_after {
            if run_start > word_start {
                words.push(word_start..run_start);
            }
            word_start = at;
        }
    }
    if word_start < bytes.len() {
        words.push(word_start..bytes.len());
    }
    words
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tokenizer::spans::tests::{dense_text, tricky_text};
    use crate::tokenizer::tests::models_dir;

    fn minilm() -> std::sync::Arc<super::super::LoadedTokenizer> {
        super::super::load_tokenizer_json(
            &models_dir().join(super::super::MINILM_TOKENIZER_PATH),
            "test",
        )
        .expect("run scripts/fetch-models.sh")
    }

    fn by_words(input: &str) -> Vec<(usize, usize, u32)> {
        let loaded = minilm();
        let memo = loaded.words.as_ref().expect("MiniLM is whitespace-local");
        let mut tokens = Vec::new();
        memo.encode(&loaded.tokenizer, input, &mut |start, end, id| {
            tokens.push((start, end, id))
        })
        .unwrap();
        tokens
    }

    fn whole(tokenizer: &Tokenizer, input: &str) -> Vec<(usize, usize, u32)> {
        let mut tokens = Vec::new();
        super::super::encode_plain(tokenizer, input, &mut |start, end, id| {
            tokens.push((start, end, id))
        })
        .unwrap();
        tokens
    }

    #[test]
    fn words_end_only_at_ascii_whitespace_between_printable_ascii() {
        fn words(input: &str) -> Vec<&str> {
            words_of(input).into_iter().map(|r| &input[r]).collect()
        }
        assert_eq!(words("  one two\n\tthree  "), ["one", "two", "three"]);
        assert!(words("").is_empty() && words(" \n ").is_empty());
        // Beside a combining mark, a control char or non-ASCII text the run is not a cut.
        assert_eq!(words("a \u{301}b c"), ["a \u{301}b", "c"]);
        assert_eq!(words("x \u{b} y z"), ["x \u{b} y", "z"]);
        assert_eq!(words("東 京 a b"), ["東 京 a", "b"]);
    }

    #[test]
    fn remembered_words_give_the_tokens_of_the_whole_input() {
        let loaded = minilm();
        let tokenizer = &loaded.tokenizer;
        let text = "The café's naïve résumé — 東京 [MASK] unbelievable tokenization, twice: \
                    the café's naïve résumé — 東京 [MASK] unbelievable tokenization.";
        assert_eq!(by_words(text), whole(tokenizer, text));
        // Now every word is remembered.
        assert_eq!(by_words(text), whole(tokenizer, text));
        let long = format!("short {} short", "x".repeat(200));
        assert_eq!(by_words(&long), whole(tokenizer, &long));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Word by word, cold or remembered, the tokens are exactly those of one `encode`.
        #[test]
        fn word_by_word_is_one_encode(
            texts in prop::collection::vec(prop_oneof![tricky_text(), dense_text()], 1..4),
        ) {
            let loaded = minilm();
        let tokenizer = &loaded.tokenizer;
            for text in &texts {
                let expected = whole(tokenizer, text);
                prop_assert_eq!(by_words(text), expected.clone(), "cold: {:?}", text);
                prop_assert_eq!(by_words(text), expected, "remembered: {:?}", text);
            }
        }
    }
}
