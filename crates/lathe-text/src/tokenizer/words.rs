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
//!
//! A word of printable ASCII not yet known skips that call when the tokenizer is plain BERT
//! ([`AsciiWordPiece`]): its pieces go straight to the tokenizer's own WordPiece model. Corpora
//! of paths and identifiers are mostly such words, each seen once.
//!
//! Chinese text has no spaces, so its "words" are whole clauses, too long to remember and each
//! seen once: every one went through the whole pipeline. A BERT normaliser that isolates Chinese
//! chars (`handle_chinese_chars`) makes each a word of its own ([`ChineseCuts`]), and the memory
//! then cuts there too: Chinese text costs a lookup per char, like any other text.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use rustc_hash::{FxBuildHasher, FxHashMap};
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{Model, ModelWrapper, NormalizedString, Normalizer, Tokenizer};

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
    /// The fast path for printable ASCII words, when the tokenizer allows it.
    ascii: Option<AsciiWordPiece>,
    /// Whether both sides of a Chinese char are cuts too.
    chinese_cuts: ChineseCuts,
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
    /// The memory of `tokenizer`, the one every call of [`Self::encode`] passes.
    pub(super) fn new(tokenizer: &Tokenizer) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            ascii: AsciiWordPiece::of(tokenizer),
            chinese_cuts: ChineseCuts::of(tokenizer),
        }
    }

    fn shard(&self, word: &str) -> std::sync::MutexGuard<'_, Shard> {
        // The map hashes the word the same way and hashbrown takes a bucket from the low bits
        // and a slot's tag from the top seven, so the shard comes from bits that neither uses
        // (from the top ones, the words of a shard would share most of their tags).
        let shard = (FxBuildHasher.hash_one(word) >> 32) as usize % SHARDS;
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
        let words = words_of(input, self.chinese_cuts);
        // The tokens of the words remembered, in order, with a slot for each of the others.
        let mut slots: Vec<Slot> = Vec::with_capacity(words.len() + words.len() / 2);
        let mut unknown = Vec::new();
        let ascii = self.ascii.as_ref().zip(match tokenizer.get_model() {
            ModelWrapper::WordPiece(model) => Some(model),
            _ => None,
        });
        let (mut lowered, mut word_tokens) = (String::new(), WordTokens::new());
        for range in &words {
            let word = &input[range.clone()];
            let start = range.start as u32;
            if let Some(known) = self.shard(word).get(word) {
                slots.extend(
                    known
                        .iter()
                        .map(|t| (start + u32::from(t.start), start + u32::from(t.end), t.id)),
                );
                continue;
            }
            if let Some((ascii, model)) = ascii {
                if ascii.tokenize(model, word, &mut lowered, &mut word_tokens)? {
                    slots.extend(
                        word_tokens
                            .iter()
                            .map(|&(s, e, id)| (start + s as u32, start + e as u32, id)),
                    );
                    self.remember(word, &word_tokens);
                    continue;
                }
            }
            slots.push((UNKNOWN, unknown.len() as u32, 0));
            unknown.push(range.clone());
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
            self.remember(&input[range], &word_tokens);
        }
        Ok(())
    }

    /// Remembers the tokens of `word` (offsets in the word), unless it is too long.
    fn remember(&self, word: &str, word_tokens: &[(usize, usize, u32)]) {
        if word.len() > MAX_WORD_BYTES {
            return;
        }
        let compact = word_tokens
            .iter()
            .map(|&(start, end, id)| WordToken {
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
}

/// One word's tokens: (start, end, id), byte offsets in the word.
type WordTokens = Vec<(usize, usize, u32)>;

/// `tokenizer.encode(word, false)` of a word of printable ASCII, without the pipeline, for a
/// plain BERT tokenizer: normaliser `BertNormalizer` (any settings) or none, pre-tokenizer
/// `BertPreTokenizer`, model `WordPiece`, no truncation or padding, a post-processor that adds
/// nothing without special tokens. On such a word `encode` (tokenizers 0.23) does exactly this:
/// - the added-tokens split (`AddedVocabulary::extract_and_normalize`) finds an added token,
///   special or not, wherever its content occurs in the raw text, or its normalised content in
///   the normalised text; a word that holds no added token's content or normalised content in
///   either is left whole. Words that might hold one are declined;
/// - `BertNormalizer` leaves printable ASCII as it is (`clean_text` drops control chars and
///   maps whitespace, `handle_chinese_chars` and `strip_accents` touch no ASCII char) except
///   that `lowercase` lowercases it, byte for byte: offsets stay those of the word;
/// - `BertPreTokenizer` splits at whitespace (there is none) and isolates each punctuation char:
///   `is_ascii_punctuation`, or a Unicode punctuation char, which in ASCII is a subset of it. So
///   every ASCII punctuation char is a piece, and so is each maximal run of the other chars;
/// - each piece is `Model::tokenize`d by the WordPiece model (a piece over its
///   `max_input_chars_per_word`, or one it cannot cover, becomes one unknown token spanning
///   it), offsets in the piece;
/// - with `add_special_tokens == false`, `BertProcessing` returns the encoding as it is, and
///   `TemplateProcessing` keeps only the template's sequence, once in the templates accepted.
#[derive(Debug)]
struct AsciiWordPiece {
    lowercase: bool,
    /// The added tokens' contents, raw and normalised (any that could match printable ASCII).
    added: Vec<String>,
    /// Whether a printable ASCII byte, or its lowercase when lowercasing, begins one of `added`.
    may_begin_added: [bool; 128],
}

impl AsciiWordPiece {
    /// The fast path for `tokenizer`, if it is exactly a plain BERT tokenizer (see the type doc).
    fn of(tokenizer: &Tokenizer) -> Option<Self> {
        let normalizer = tokenizer.get_normalizer();
        let lowercase = match normalizer {
            None => false,
            Some(NormalizerWrapper::BertNormalizer(bert)) => bert.lowercase,
            Some(_) => return None,
        };
        let post_processor_ok = match tokenizer.get_post_processor() {
            None | Some(PostProcessorWrapper::Bert(_)) => true,
            Some(PostProcessorWrapper::Template(template)) => {
                // `Template` hides its pieces; its serialised form is tokenizer.json's list.
                let single = serde_json::to_value(&template.single).unwrap_or_default();
                let sequences = single.as_array().map_or(0, |pieces| {
                    pieces
                        .iter()
                        .filter(|piece| piece.get("Sequence").is_some())
                        .count()
                });
                sequences == 1
            }
            Some(_) => false,
        };
        let plain = matches!(
            tokenizer.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::BertPreTokenizer(_))
        ) && matches!(tokenizer.get_model(), ModelWrapper::WordPiece(_))
            && tokenizer.get_truncation().is_none()
            && tokenizer.get_padding().is_none()
            && post_processor_ok;
        if !plain {
            return None;
        }
        let mut added = Vec::new();
        for token in tokenizer.get_added_tokens_decoder().into_values() {
            let mut normalized = NormalizedString::from(token.content.as_str());
            if let Some(normalizer) = normalizer {
                normalizer.normalize(&mut normalized).ok()?;
            }
            added.push(normalized.get().to_owned());
            added.push(token.content);
        }
        // Only ASCII contents can occur in printable ASCII; an empty one would match anywhere.
        added.retain(|content| content.is_ascii());
        if added.iter().any(String::is_empty) {
            return None;
        }
        let mut may_begin_added = [false; 128];
        for byte in 0..128u8 {
            let begins = |b: u8| added.iter().any(|content| content.as_bytes()[0] == b);
            may_begin_added[usize::from(byte)] =
                begins(byte) || (lowercase && begins(byte.to_ascii_lowercase()));
        }
        Some(Self {
            lowercase,
            added,
            may_begin_added,
        })
    }

    /// Sets `tokens` to the tokens of `word` (offsets in the word), as `tokenizer.encode(word,
    /// false)` gives them, `model` being the tokenizer's; `false` (and `tokens` unspecified) if
    /// the word is not all printable ASCII or might hold an added token. `lowered` is scratch.
    fn tokenize(
        &self,
        model: &WordPiece,
        word: &str,
        lowered: &mut String,
        tokens: &mut WordTokens,
    ) -> tokenizers::Result<bool> {
        let bytes = word.as_bytes();
        let mut may_hold_added = false;
        for &byte in bytes {
            if !byte.is_ascii_graphic() {
                return Ok(false);
            }
            may_hold_added |= self.may_begin_added[usize::from(byte)];
        }
        let normalized = if self.lowercase {
            lowered.clear();
            lowered.push_str(word);
            lowered.make_ascii_lowercase();
            lowered.as_str()
        } else {
            word
        };
        if may_hold_added
            && self.added.iter().any(|content| {
                word.contains(content.as_str()) || normalized.contains(content.as_str())
            })
        {
            return Ok(false);
        }
        tokens.clear();
        let mut start = 0;
        while start < bytes.len() {
            let end = if bytes[start].is_ascii_punctuation() {
                start + 1
            } else {
                bytes[start..]
                    .iter()
                    .position(u8::is_ascii_punctuation)
                    .map_or(bytes.len(), |length| start + length)
            };
            for token in model.tokenize(&normalized[start..end])? {
                let (token_start, token_end) = token.offsets;
                tokens.push((start + token_start, start + token_end, token.id));
            }
            start = end;
        }
        Ok(true)
    }
}

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

/// Whether both sides of a Chinese char are cuts, besides the ASCII whitespace of
/// [`words_of`]. They are for a whitespace-local tokenizer ([`CutRule::WhitespaceWords`]) whose
/// normaliser is BERT's with `handle_chinese_chars`, and whose added tokens neither hold a
/// Chinese char nor are `single_word`:
/// - the normaliser puts a space before and after each Chinese char (BERT's `is_chinese_char`:
///   the CJK ideograph blocks, [`is_chinese_char`]), judged on the raw char: only `clean_text`
///   runs before it, and it drops control chars and maps whitespace to a space. What follows
///   (accent stripping, lowercasing) maps a char to chars and keeps the spaces; canonical
///   reordering of combining marks stops at the Chinese char, a starter;
/// - the pre-tokenizer splits at those spaces, so the char is a word alone, and WordPiece
///   tokenizes each word alone;
/// - an added token is matched before the pre-tokenizer: one that holds no Chinese char (nor,
///   under the rule, whitespace) cannot match across one; a `single_word` one checks the chars
///   beside a match, and a Chinese char (a word char) there would decline a match that the
///   word alone, the char cut off, would take.
///
/// [`CutRule::WhitespaceWords`]: super::spans::CutRule::WhitespaceWords
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChineseCuts(bool);

impl ChineseCuts {
    /// The cuts of `tokenizer`, whitespace-local as every tokenizer of this memory is.
    fn of(tokenizer: &Tokenizer) -> Self {
        let isolates_chinese = matches!(
            tokenizer.get_normalizer(),
            Some(NormalizerWrapper::BertNormalizer(bert)) if bert.handle_chinese_chars
        );
        let added_tokens_ok = tokenizer
            .get_added_tokens_decoder()
            .values()
            .all(|token| !token.single_word && !token.content.chars().any(is_chinese_char));
        Self(isolates_chinese && added_tokens_ok)
    }
}

/// BERT's Chinese chars (`tokenizers::normalizers::bert::is_chinese_char`, which is private):
/// the CJK Unified Ideographs and their extensions A to E, and the compatibility ideographs.
fn is_chinese_char(c: char) -> bool {
    matches!(
        u32::from(c),
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// The words of `input`: the non-empty stretches between runs of ASCII whitespace (space, tab,
/// line feed, carriage return) that have a printable ASCII char or the input's edge on each side.
/// A run beside anything else (a combining mark, a control char, non-ASCII whitespace) is not
/// known to be a cut and stays inside its word. With `chinese_cuts`, each Chinese char is a word
/// of its own, and so is each stretch between two of them.
fn words_of(input: &str, chinese_cuts: ChineseCuts) -> Vec<Range<usize>> {
    let bytes = input.as_bytes();
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut words = Vec::with_capacity(bytes.len() / 5 + 1);
    let mut push = |word: Range<usize>| {
        if chinese_cuts.0 && !input[word.clone()].is_ascii() {
            push_cut_at_chinese_chars(input, word, &mut words);
        } else {
            words.push(word);
        }
    };
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
                push(word_start..run_start);
            }
            word_start = at;
        }
    }
    if word_start < bytes.len() {
        push(word_start..bytes.len());
    }
    words
}

/// Pushes the pieces of `word` (a range of `input`) cut before and after each Chinese char.
fn push_cut_at_chinese_chars(input: &str, word: Range<usize>, words: &mut Vec<Range<usize>>) {
    let mut piece_start = word.start;
    for (offset, c) in input[word.clone()].char_indices() {
        if is_chinese_char(c) {
            let at = word.start + offset;
            if at > piece_start {
                words.push(piece_start..at);
            }
            piece_start = at + c.len_utf8();
            words.push(at..piece_start);
        }
    }
    if piece_start < word.end {
        words.push(piece_start..word.end);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tokenizer::spans::tests::{dense_text, tricky_text};

    /// MiniLM as the stages' tests share it, which keeps it loaded, words remembered, throughout.
    fn minilm() -> std::sync::Arc<super::super::LoadedTokenizer> {
        match &crate::tokenizer::tests::minilm().kind {
            super::super::Kind::HuggingFace(loaded) => loaded.clone(),
            super::super::Kind::Tiktoken(_) => unreachable!("MiniLM is a Hugging Face tokenizer"),
        }
    }

    /// The tokens `memo` gives `input` word by word.
    fn by_words_in(
        memo: &WordMemo,
        tokenizer: &Tokenizer,
        input: &str,
    ) -> Vec<(usize, usize, u32)> {
        let mut tokens = Vec::new();
        memo.encode(tokenizer, input, &mut |start, end, id| {
            tokens.push((start, end, id))
        })
        .unwrap();
        tokens
    }

    fn by_words(input: &str) -> Vec<(usize, usize, u32)> {
        let loaded = minilm();
        let memo = loaded.words.as_ref().expect("MiniLM is whitespace-local");
        by_words_in(memo, &loaded.tokenizer, input)
    }

    fn whole(tokenizer: &Tokenizer, input: &str) -> Vec<(usize, usize, u32)> {
        let mut tokens = Vec::new();
        super::super::encode_plain(tokenizer, input, &mut |start, end, id| {
            tokens.push((start, end, id))
        })
        .unwrap();
        tokens
    }

    /// The words [`words_of`] finds in `input`, as text.
    fn words(input: &str, chinese_cuts: bool) -> Vec<&str> {
        words_of(input, ChineseCuts(chinese_cuts))
            .into_iter()
            .map(|r| &input[r])
            .collect()
    }

    #[test]
    fn words_end_only_at_ascii_whitespace_between_printable_ascii() {
        let words = |input| words(input, false);
        assert_eq!(words("  one two\n\tthree  "), ["one", "two", "three"]);
        assert!(words("").is_empty() && words(" \n ").is_empty());
        // Beside a combining mark, a control char or non-ASCII text the run is not a cut.
        assert_eq!(words("a \u{301}b c"), ["a \u{301}b", "c"]);
        assert_eq!(words("x \u{b} y z"), ["x \u{b} y", "z"]);
        assert_eq!(words("東 京 a b"), ["東 京 a", "b"]);
    }

    #[test]
    fn with_chinese_cuts_each_chinese_char_is_a_word() {
        let words = |input| words(input, true);
        assert_eq!(words("東 京 a b"), ["東", " ", "京", " a", "b"]);
        assert_eq!(
            words("PCI Express端口（PCIe）驱\u{301}。"),
            ["PCI", "Express", "端", "口", "（PCIe）", "驱", "\u{301}。"]
        );
        // Extension B and a compatibility ideograph are Chinese chars; kana and hangul are not.
        assert_eq!(words("𠀀豈のひ한국"), ["𠀀", "豈", "のひ한국"]);
        assert_eq!(words("plain ascii, café"), ["plain", "ascii,", "café"]);
    }

    #[test]
    fn chinese_chars_are_cuts_only_where_the_normaliser_isolates_them() {
        use tokenizers::normalizers::BertNormalizer;
        use tokenizers::AddedToken;
        let shipped = minilm().tokenizer.clone();
        assert_eq!(ChineseCuts::of(&shipped), ChineseCuts(true));
        let mut kept_together = shipped.clone();
        kept_together
            .with_normalizer(Some(BertNormalizer::new(true, false, None, true)))
            .unwrap();
        let mut chinese_added = shipped.clone();
        chinese_added
            .add_tokens([AddedToken::from("端口", false)])
            .unwrap();
        let mut single_word = shipped.clone();
        single_word
            .add_tokens([AddedToken::from("zork", false).single_word(true)])
            .unwrap();
        for tokenizer in [kept_together, chinese_added, single_word] {
            assert_eq!(ChineseCuts::of(&tokenizer), ChineseCuts(false));
        }
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

    /// The fast path's tokens of `word`, or `None` where it declines.
    fn fast(
        ascii: &AsciiWordPiece,
        tokenizer: &Tokenizer,
        word: &str,
    ) -> Option<Vec<(usize, usize, u32)>> {
        let ModelWrapper::WordPiece(model) = tokenizer.get_model() else {
            unreachable!("a WordPiece tokenizer")
        };
        let mut tokens = Vec::new();
        let taken = ascii
            .tokenize(model, word, &mut String::new(), &mut tokens)
            .unwrap();
        taken.then_some(tokens)
    }

    /// MiniLM as shipped (lowercasing, special tokens only), and it and a cased variant with two
    /// added tokens that are not special, one matched in normalised text and one in raw text.
    fn plain_berts() -> &'static [(AsciiWordPiece, Tokenizer)] {
        use tokenizers::normalizers::BertNormalizer;
        use tokenizers::AddedToken;
        static BERTS: std::sync::OnceLock<Vec<(AsciiWordPiece, Tokenizer)>> =
            std::sync::OnceLock::new();
        BERTS.get_or_init(|| {
            let shipped = minilm().tokenizer.clone();
            let mut cased = shipped.clone();
            cased
                .with_normalizer(Some(BertNormalizer::new(true, true, None, false)))
                .unwrap();
            let mut with_added = [shipped.clone(), cased];
            for tokenizer in &mut with_added {
                tokenizer
                    .add_tokens([
                        AddedToken::from("zork", false),
                        AddedToken::from("Qz", false).normalized(false),
                    ])
                    .unwrap();
            }
            std::iter::once(shipped)
                .chain(with_added)
                .map(|tokenizer| {
                    let ascii = AsciiWordPiece::of(&tokenizer).expect("plain BERT");
                    (ascii, tokenizer)
                })
                .collect()
        })
    }

    /// The plain BERTs of [`plain_berts`], and the cased one without accent stripping, whose
    /// combining marks survive to sit beside Chinese chars.
    fn chinese_berts() -> &'static [(&'static str, Tokenizer)] {
        use tokenizers::normalizers::BertNormalizer;
        static BERTS: std::sync::OnceLock<Vec<(&'static str, Tokenizer)>> =
            std::sync::OnceLock::new();
        BERTS.get_or_init(|| {
            let mut keeps_accents = minilm().tokenizer.clone();
            keeps_accents
                .with_normalizer(Some(BertNormalizer::new(true, true, Some(false), false)))
                .unwrap();
            let [shipped, lowercase_added, cased_added] = plain_berts() else {
                unreachable!("three plain BERTs")
            };
            vec![
                ("shipped", shipped.1.clone()),
                ("lowercase, added tokens", lowercase_added.1.clone()),
                ("cased, added tokens", cased_added.1.clone()),
                ("cased, accents kept", keeps_accents),
            ]
        })
    }

    /// Whether every tokenizer's fast path takes `word`, checking that where one does its tokens
    /// are those of `encode` of the word.
    fn check_fast_path(
        berts: &[(AsciiWordPiece, Tokenizer)],
        word: &str,
    ) -> Result<bool, TestCaseError> {
        let mut taken = true;
        for (ascii, tokenizer) in berts {
            match fast(ascii, tokenizer, word) {
                Some(tokens) => prop_assert_eq!(tokens, whole(tokenizer, word), "{:?}", word),
                None => taken = false,
            }
        }
        Ok(taken)
    }

    #[test]
    fn the_ascii_fast_path_gives_the_tokens_of_encode() {
        let berts = plain_berts();
        assert!(minilm().words.as_ref().unwrap().ascii.is_some());
        let long = format!("{}.{}", "a".repeat(101), "Ab".repeat(60));
        let taken = [
            "--foo=bar",
            "/usr/share/doc/x.gz",
            "e.g.",
            "McDonald's",
            "##",
            "a##b",
            "##ing",
            "...!?!...",
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
            "0123456789",
            "3.14159e-10",
            "x86_64-unknown-linux-gnu",
            "HTTPServerError",
            "fooBAR",
            "unbelievable",
            "[CLS",
            "CLS]",
            "a[b]c",
            "[unknown]",
            long.as_str(),
            &"z".repeat(100),
            &"z".repeat(101),
            &"qqqqxyzzy".repeat(12),
        ];
        for word in taken {
            assert!(check_fast_path(berts, word).unwrap(), "declined {word:?}");
        }
        // Added tokens, special or not, raw or normalised, and words not of printable ASCII.
        let declined = [
            "[CLS]",
            "[UNK]x",
            "a[MASK]b",
            "[mask]",
            "[PAD][SEP]",
            "ZORK",
            "xZorky",
            "Qz",
            "café",
            "a\u{7f}b",
            "tab\tin",
        ];
        for word in declined {
            assert!(!check_fast_path(berts, word).unwrap(), "took {word:?}");
        }
        let text = [taken.as_slice(), declined.as_slice()].concat().join(" ");
        assert_eq!(by_words(&text), whole(&minilm().tokenizer, &text));
    }

    #[test]
    fn the_ascii_fast_path_is_only_for_plain_bert() {
        use tokenizers::normalizers::Lowercase;
        use tokenizers::pre_tokenizers::whitespace::Whitespace;
        use tokenizers::TruncationParams;
        let loaded = minilm();
        assert!(loaded.words.as_ref().unwrap().ascii.is_some());
        let mut lowercase = loaded.tokenizer.clone();
        lowercase.with_normalizer(Some(Lowercase)).unwrap();
        let mut whitespace = loaded.tokenizer.clone();
        whitespace.with_pre_tokenizer(Some(Whitespace));
        let mut truncated = loaded.tokenizer.clone();
        truncated
            .with_truncation(Some(TruncationParams::default()))
            .unwrap();
        for tokenizer in [lowercase, whitespace, truncated] {
            assert!(AsciiWordPiece::of(&tokenizer).is_none());
        }
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

        /// The fast path takes any printable ASCII word without an added token, and gives the
        /// tokens of `encode`, punctuation runs, long pieces and all.
        #[test]
        fn the_ascii_fast_path_is_encode(
            word in prop::collection::vec(
                prop_oneof![
                    4 => "[!-~]{1,8}",
                    3 => "[a-zA-Z0-9]{1,12}",
                    2 => "[-_./=:#'\\[\\]]{1,3}",
                    1 => prop::sample::select(
                        vec!["[CLS]", "[UNK]", "[mask]", "##", "zork", "Qz", "e.g.", "McDonald"]
                    ).prop_map(str::to_string),
                    1 => "[a-z]{95,110}",
                ],
                1..6,
            ).prop_map(|parts| parts.concat()),
        ) {
            let taken = check_fast_path(plain_berts(), &word)?;
            let lowered = word.to_ascii_lowercase();
            let has_added = ["[cls]", "[unk]", "[mask]", "[pad]", "[sep]", "zork", "qz"]
                .iter()
                .any(|added| lowered.contains(added));
            prop_assert!(taken || has_added, "declined {:?}", word);
        }

        /// Chinese text mixed with what may lie beside it (fullwidth punctuation, kana, combining
        /// marks, control chars, ASCII words and spaces, added tokens), word by word and cut at
        /// each Chinese char, gives the tokens of one `encode`, cold and remembered, with each
        /// of [`chinese_berts`].
        #[test]
        fn chinese_text_word_by_word_is_one_encode(
            text in prop::collection::vec(
                prop_oneof![
                    6 => "[\u{4E00}-\u{4E3F}\u{9FA0}-\u{9FFF}]{1,6}",
                    1 => "[\u{3400}\u{4DBF}\u{20000}\u{2A6DF}\u{F900}\u{FAFF}\u{2F800}\u{2FA1F}]",
                    1 => "[\u{33FF}\u{4DC0}\u{A000}\u{F8FF}\u{FB00}\u{3041}-\u{3045}\u{AC00}]",
                    2 => prop::sample::select(vec![
                        "，", "。", "（", "）", "：", "、", "\u{3000}", "\u{301}", "\u{308}",
                        "\u{1}", "\u{200b}", "é", "e\u{301}", "[MASK]", "[unk]", "zork", "Qz",
                        "##", "'s", "-", ".", "(",
                    ]).prop_map(str::to_string),
                    3 => "[a-zA-Z0-9]{1,8}",
                    3 => prop::sample::select(vec![" ", "  ", "\n", "\t", "\r\n"])
                        .prop_map(str::to_string),
                ],
                0..60,
            ).prop_map(|parts| parts.concat()),
        ) {
            for (name, tokenizer) in chinese_berts() {
                let memo = WordMemo::new(tokenizer);
                prop_assert_eq!(memo.chinese_cuts, ChineseCuts(true), "{}", name);
                let expected = whole(tokenizer, &text);
                let cold = by_words_in(&memo, tokenizer, &text);
                prop_assert_eq!(cold, expected.clone(), "{} cold: {:?}", name, text);
                let remembered = by_words_in(&memo, tokenizer, &text);
                prop_assert_eq!(remembered, expected, "{} remembered: {:?}", name, text);
            }
        }

        /// Random printable ASCII text with spaces, tabs and line breaks, word by word through
        /// the fast path, gives the tokens of one `encode`.
        #[test]
        fn ascii_text_word_by_word_is_one_encode(text in "[ -~\t\n]{0,300}") {
            let expected = whole(&minilm().tokenizer, &text);
            prop_assert_eq!(by_words(&text), expected.clone(), "cold: {:?}", text);
            prop_assert_eq!(by_words(&text), expected, "remembered: {:?}", text);
        }
    }
}
