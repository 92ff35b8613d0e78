//! Budget tokenizers: the tokenizer a collection counts budgets and chunk sizes in. One tokenization
//! pass gives a text's [`TokenOffsets`]; counts of any span come from those offsets, and the final
//! answer is recounted exactly with [`BudgetTokenizer::count`].
//!
//! # Bounded work per call
//! The tokenizer never sees more than [`MAX_CALL_BYTES`] at once, nor a run of whitespace or of
//! other chars longer than [`MAX_RUN_BYTES`] ([`for_each_tokenizer_call`]): a longer run is
//! tokenized in pieces of at most [`MAX_RUN_BYTES`], cut at char boundaries. The Hugging Face
//! tokenizers keep tens of bytes of alignment data per input byte (a 10 MB section took about
//! 800 MB), and a byte-pair encoder's work grows faster than the length of one piece; cut this
//! way, both stay proportional to the text with a small constant. Ordinary text is cut only
//! where a letter or digit meets whitespace, which no tokenizer we ship merges across, so its
//! tokens and counts are the same as in one call. Counts of huge tokens are then bounded as
//! [`crate::tokens`] describes.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::SystemTime;

use tiktoken_rs::CoreBPE;
use tokenizers::Tokenizer;

use crate::error::{Result, TextError};
use crate::tokens::{SpanBounder, TokenOffsets, MAX_TOKEN_BYTES};

mod calls;
mod spans;
mod words;
pub use calls::{encode_in_calls, for_each_tokenizer_call, tokenize_call, CallMemo, EncodedText};
use spans::CutRule;

/// Longest run of whitespace, or of chars other than whitespace, handed to a tokenizer whole.
pub const MAX_RUN_BYTES: usize = MAX_TOKEN_BYTES;
/// Most bytes handed to a tokenizer in one call.
pub const MAX_CALL_BYTES: usize = 32 << 10;
/// Longest run handed to an embedder's tokenizer whole (see [`encode_in_calls`]).
pub const EMBEDDER_MAX_RUN_BYTES: usize = MAX_CALL_BYTES / 2;

/// Name of the default budget tokenizer: the tokenizer.json of all-MiniLM-L6-v2.
pub const DEFAULT_TOKENIZER: &str = "minilm";
pub const MINILM_TOKENIZER_PATH: &str = "minilm/tokenizer.json";

/// A tokenizer that counts tokens and gives their byte offsets, without special tokens.
#[derive(Clone)]
pub struct BudgetTokenizer {
    name: Arc<str>,
    kind: Kind,
    /// Where its texts may be cut without changing their tokens ([`Self::count_span`]).
    cut_rule: CutRule,
}

#[derive(Clone)]
enum Kind {
    HuggingFace(Arc<LoadedTokenizer>),
    Tiktoken(&'static CoreBPE),
}

impl fmt::Debug for BudgetTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetTokenizer")
            .field("name", &self.name)
            .finish()
    }
}

impl BudgetTokenizer {
    /// Resolves a tokenizer name: `minilm`, `cl100k_base`, `o200k_base`, or a path to a
    /// tokenizer.json (relative paths are taken from the working directory).
    pub fn resolve(name: &str, models_dir: &Path) -> Result<Self> {
        let field = "settings.budget_tokenizer";
        let kind = match name {
            "" | DEFAULT_TOKENIZER => Kind::HuggingFace(load_tokenizer_json(&models_dir.join(MINILM_TOKENIZER_PATH), field)?),
            "cl100k_base" => Kind::Tiktoken(tiktoken_rs::cl100k_base_singleton()),
            "o200k_base" => Kind::Tiktoken(tiktoken_rs::o200k_base_singleton()),
            path if path.ends_with(".json") => Kind::HuggingFace(load_tokenizer_json(&PathBuf::from(path), field)?),
            other => {
                return Err(TextError::invalid(
                    field,
                    format!(
                        "unknown tokenizer `{other}`: expected `minilm`, `cl100k_base`, `o200k_base` or a path to a tokenizer.json"
                    ),
                ))
            }
        };
        let name = if name.is_empty() {
            DEFAULT_TOKENIZER
        } else {
            name
        };
        let cut_rule = match &kind {
            Kind::HuggingFace(loaded) => loaded.cut_rule,
            Kind::Tiktoken(_) => CutRule::PiecesBeforeWhitespace,
        };
        Ok(Self {
            name: Arc::from(name),
            kind,
            cut_rule,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Token byte offsets of `text` (one pass, no special tokens), bounded (see
    /// [`crate::tokens`]).
    pub fn offsets(&self, text: &str) -> TokenOffsets {
        let mut spans = Vec::new();
        self.raw_spans(text, &mut |start, end| spans.push((start, end)));
        TokenOffsets::bounded_from_spans(text, spans)
    }

    /// Token count of `text` as the caller's model would see it (no special tokens), except that
    /// a huge token or untokenized stretch counts as [`crate::tokens`] describes; always
    /// `self.offsets(text).len()`.
    pub fn count(&self, text: &str) -> usize {
        let mut bounder = SpanBounder::new(text);
        let mut count = 0usize;
        let mut tally = |_: usize, _: usize| count += 1;
        self.raw_spans(text, &mut |start, end| bounder.push(start, end, &mut tally));
        bounder.finish(&mut tally);
        count
    }

    /// The tokens `text` adds as a part, cut at a cut ([`Self::count_span`]), of a longer text
    /// that holds a token elsewhere: [`Self::count`] but for a text in which the tokenizer finds
    /// nothing, which then adds none (on its own it counts one) unless it is long enough to be
    /// covered.
    fn count_part(&self, text: &str) -> usize {
        let mut bounder = SpanBounder::new(text);
        let mut count = 0usize;
        let mut tally = |_: usize, _: usize| count += 1;
        self.raw_spans(text, &mut |start, end| bounder.push(start, end, &mut tally));
        bounder.finish_part(&mut tally);
        count
    }

    /// The tokenizer's own byte spans of `text` (what [`BudgetTokenizer::count`] bounds and
    /// counts) when the tokenizer is whitespace-local — a BERT-style WordPiece tokenizer
    /// ([`CutRule::WhitespaceWords`]), which splits at every whitespace char and normalises char
    /// by char: the spans of any range of `text` whose ends touch whitespace are then those of
    /// `text` inside it (see `sections::TokenCounter::local_spans`). `None` for other tokenizers
    /// (a byte-level BPE glues a space to the word after it).
    pub fn local_spans(&self, text: &str) -> Option<Vec<(u32, u32)>> {
        if self.cut_rule != CutRule::WhitespaceWords {
            return None;
        }
        let mut spans = Vec::new();
        self.raw_spans(text, &mut |start, end| {
            spans.push((start as u32, end as u32))
        });
        Some(spans)
    }

    /// The tokenizer's own byte spans of `text`, in order, tokenized call by call as
    /// [`for_each_tokenizer_call`] cuts it.
    fn raw_spans(&self, text: &str, sink: &mut impl FnMut(usize, usize)) {
        let join_pieces = matches!(self.kind, Kind::HuggingFace(_));
        BUDGET_CALL_MEMO.with(|memo| {
            let mut memo = memo.borrow_mut();
            let (owner, memo) = &mut *memo;
            if owner.as_str() != &*self.name {
                owner.clear();
                owner.push_str(&self.name);
                *memo = CallMemo::default();
            }
            for_each_tokenizer_call(text, MAX_RUN_BYTES, join_pieces, |ranges| {
                tokenize_call(
                    text,
                    ranges,
                    memo,
                    |input, tokens| self.tokenize_one_call(input, tokens),
                    &mut |start, end, _| sink(start, end),
                );
            });
        });
    }

    /// Byte spans (and ids) of the tokens of one call's input, in order.
    fn tokenize_one_call(&self, input: &str, tokens: &mut dyn FnMut(usize, usize, u32)) {
        match &self.kind {
            Kind::HuggingFace(loaded) => match loaded.encode(input, tokens) {
                Ok(()) => {}
                Err(error) => {
                    // The HF tokenizers fail only on pathological configurations; fall back to
                    // whitespace words so that a query never fails on one odd section.
                    tracing::warn!(%error, tokenizer = %self.name, "tokenization failed, counting words");
                    let words = TokenOffsets::whitespace(input);
                    for (&start, &end) in words.starts().iter().zip(words.ends()) {
                        tokens(start as usize, end as usize, 0);
                    }
                }
            },
            Kind::Tiktoken(bpe) => {
                let ranks = bpe.encode_ordinary(input);
                let mut position = 0;
                for (bytes, rank) in bpe._decode_native_and_split(ranks.clone()).zip(ranks) {
                    tokens(position, position + bytes.len(), rank);
                    position += bytes.len();
                }
            }
        }
    }
}

/// A Hugging Face tokenizer as loaded from its file (shared by every collection that names the
/// file), with the words it has tokenized when it is whitespace-local ([`words`]).
struct LoadedTokenizer {
    tokenizer: Tokenizer,
    cut_rule: CutRule,
    words: Option<words::WordMemo>,
}

impl LoadedTokenizer {
    fn new(tokenizer: Tokenizer) -> Self {
        let cut_rule = CutRule::of_tokenizer_json(&tokenizer);
        let words =
            (cut_rule == CutRule::WhitespaceWords).then(|| words::WordMemo::new(&tokenizer));
        Self {
            tokenizer,
            cut_rule,
            words,
        }
    }

    /// The tokens of `input` as `tokenizer.encode(input, false)` gives them: word by word with
    /// the words remembered for a whitespace-local tokenizer, else in one `encode` (which, unlike
    /// `encode_fast`, tracks byte offsets).
    fn encode(
        &self,
        input: &str,
        tokens: &mut dyn FnMut(usize, usize, u32),
    ) -> tokenizers::Result<()> {
        match &self.words {
            Some(words) => words.encode(&self.tokenizer, input, tokens),
            None => encode_plain(&self.tokenizer, input, tokens),
        }
    }
}

/// Calls `tokens(start, end, id)` for each token of `tokenizer.encode(input, false)`, in order,
/// byte offsets in `input` (`encode`, unlike `encode_fast`, tracks them).
fn encode_plain(
    tokenizer: &Tokenizer,
    input: &str,
    tokens: &mut dyn FnMut(usize, usize, u32),
) -> tokenizers::Result<()> {
    let encoding = tokenizer.encode(input, false)?;
    for (&(start, end), &id) in encoding.get_offsets().iter().zip(encoding.get_ids()) {
        tokens(start, end, id);
    }
    Ok(())
}

thread_local! {
    /// The budget tokenizers' memo, per thread (the CPU pool's threads live as long as the
    /// server): the sections of one huge word are counted one after the other, each starting with
    /// the same call. Tagged with the tokenizer's name, so another tokenizer starts afresh.
    static BUDGET_CALL_MEMO: std::cell::RefCell<(String, CallMemo)> =
        std::cell::RefCell::new((String::new(), CallMemo::default()));
}

fn load_tokenizer_json(path: &Path, field: &str) -> Result<Arc<LoadedTokenizer>> {
    if !path.exists() {
        return Err(TextError::invalid(
            field,
            format!(
                "tokenizer file {} is missing (run scripts/fetch-models.sh to fetch the models)",
                path.display()
            ),
        ));
    }
    // Collections share a tokenizer loaded from the same unchanged file: a MiniLM tokenizer
    // costs megabytes and tens of milliseconds to parse, which a thousand collections of one
    // tenant each would pay a thousand times at every start.
    type Loaded = HashMap<PathBuf, (Option<(SystemTime, u64)>, Weak<LoadedTokenizer>)>;
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let version = std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())));
    let loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some((loaded_version, tokenizer)) =
        loaded.lock().unwrap_or_else(|p| p.into_inner()).get(path)
    {
        if version.is_some() && *loaded_version == version {
            if let Some(tokenizer) = tokenizer.upgrade() {
                return Ok(tokenizer);
            }
        }
    }
    let mut tokenizer = Tokenizer::from_file(path).map_err(|error| {
        TextError::invalid(field, format!("cannot load {}: {error}", path.display()))
    })?;
    // The shipped tokenizer.json pads and truncates to 128 tokens: counting needs neither.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|error| TextError::internal(format!("cannot disable truncation: {error}")))?;
    let tokenizer = Arc::new(LoadedTokenizer::new(tokenizer));
    let mut loaded = loaded.lock().unwrap_or_else(|p| p.into_inner());
    // Forget tokenizers no collection holds any more before remembering this one.
    loaded.retain(|_, (_, held)| held.strong_count() > 0);
    loaded.insert(path.to_path_buf(), (version, Arc::downgrade(&tokenizer)));
    Ok(tokenizer)
}

#[cfg(test)]
// Calls are lists of ranges: one call of one range is what many tests expect.
#[allow(clippy::single_range_in_vec_init)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn models_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
    }

    /// MiniLM's budget tokenizer, loaded once for every test of this crate.
    pub(crate) fn minilm() -> &'static BudgetTokenizer {
        static TOKENIZER: std::sync::OnceLock<BudgetTokenizer> = std::sync::OnceLock::new();
        TOKENIZER.get_or_init(|| {
            BudgetTokenizer::resolve("minilm", &models_dir()).expect("run scripts/fetch-models.sh")
        })
    }

    #[test]
    fn a_tokenizer_file_is_loaded_once_while_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::copy(models_dir().join(MINILM_TOKENIZER_PATH), &path).unwrap();
        let first = load_tokenizer_json(&path, "f").unwrap();
        let second = load_tokenizer_json(&path, "f").unwrap();
        assert!(
            Arc::ptr_eq(&first, &second),
            "the same file was parsed twice"
        );
        // A changed file (here one byte longer) is read again.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        let third = load_tokenizer_json(&path, "f").unwrap();
        assert!(
            !Arc::ptr_eq(&first, &third),
            "a changed file was not read again"
        );
    }

    #[test]
    fn minilm_offsets_slice_back_to_the_tokens_and_count_matches() {
        let tokenizer =
            BudgetTokenizer::resolve("minilm", &models_dir()).expect("run scripts/fetch-models.sh");
        let text = "Héllo wörld, the café's naïve résumé — 東京 😀 done.";
        let offsets = tokenizer.offsets(text);
        assert_eq!(offsets.len(), tokenizer.count(text));
        for i in 0..offsets.len() {
            assert!(
                text.is_char_boundary(offsets.start(i)) && text.is_char_boundary(offsets.end(i))
            );
        }
        // Longer than the shipped truncation at 128 tokens: counting must not truncate.
        let long = "word ".repeat(1000);
        assert_eq!(tokenizer.count(&long), 1000);
    }

    #[test]
    fn tiktoken_offsets_cover_the_text_in_order() {
        for name in ["cl100k_base", "o200k_base"] {
            let tokenizer = BudgetTokenizer::resolve(name, &models_dir()).unwrap();
            let text = "Lathe chunks at query time: 東京 😀 naïve.";
            let offsets = tokenizer.offsets(text);
            assert_eq!(offsets.len(), tokenizer.count(text));
            assert_eq!(offsets.end(offsets.len() - 1), text.len());
            for i in 0..offsets.len() {
                assert!(
                    text.is_char_boundary(offsets.start(i))
                        && text.is_char_boundary(offsets.end(i))
                );
            }
        }
    }

    /// The tokenizers' own spans of a text tokenized in one call, and the calls' spans agree on
    /// ordinary text longer than one call (cuts fall where no tokenizer merges across).
    #[test]
    fn ordinary_text_in_several_calls_tokenizes_as_in_one() {
        let text = "The lathe turns; a gouge cuts 1234567 shavings, naïve café — 東京 😀 done.\n\n\
                    Tabs\tand  double  spaces.\r\nDon't stop: it's 3.14159!\n"
            .repeat(1500);
        assert!(text.len() > 2 * MAX_CALL_BYTES);
        let minilm = BudgetTokenizer::resolve("minilm", &models_dir()).unwrap();
        let Kind::HuggingFace(hugging_face) = &minilm.kind else {
            unreachable!()
        };
        let whole = hugging_face.tokenizer.encode(text.as_str(), false).unwrap();
        assert_eq!(
            minilm.offsets(&text),
            TokenOffsets::from_spans(&text, whole.get_offsets().iter().copied())
        );
        for name in ["cl100k_base", "o200k_base"] {
            let tokenizer = BudgetTokenizer::resolve(name, &models_dir()).unwrap();
            let Kind::Tiktoken(bpe) = &tokenizer.kind else {
                unreachable!()
            };
            assert_eq!(
                tokenizer.count(&text),
                bpe.encode_ordinary(&text).len(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_huge_word_counts_one_token_per_piece_in_minilm_and_more_in_tiktoken() {
        let word = format!("zebra {}", "b".repeat(1_000_064));
        let minilm = BudgetTokenizer::resolve("minilm", &models_dir()).unwrap();
        // "zebra", then one [UNK] per piece of 128 b (WordPiece's word limit is 100 chars).
        assert_eq!(minilm.count(&word), 1 + 1_000_064 / MAX_RUN_BYTES);
        assert_eq!(minilm.offsets(&word).len(), minilm.count(&word));
        for name in ["cl100k_base", "o200k_base"] {
            let tokenizer = BudgetTokenizer::resolve(name, &models_dir()).unwrap();
            assert!(
                tokenizer.count(&word) >= 1_000_000 / MAX_TOKEN_BYTES,
                "{name}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;
        use crate::tokens::MAX_BYTES_PER_TOKEN;

        fn tokenizers() -> &'static [BudgetTokenizer] {
            static TOKENIZERS: std::sync::OnceLock<Vec<BudgetTokenizer>> =
                std::sync::OnceLock::new();
            TOKENIZERS.get_or_init(|| {
                ["minilm", "cl100k_base", "o200k_base"]
                    .iter()
                    .map(|name| BudgetTokenizer::resolve(name, &models_dir()).unwrap())
                    .collect()
            })
        }

        /// Words and punctuation with, now and then, a run of hundreds or thousands of one char
        /// (a letter, an emoji, a CJK char, a combining mark, a control char, whitespace).
        fn text_with_runs() -> impl Strategy<Value = String> {
            let run = (
                prop::sample::select(vec![
                    "b", "😀", "東", "\u{301}", "\u{1}", " ", "\n", "-", "é", "\u{200b}",
                ]),
                0usize..3000,
            )
                .prop_map(|(unit, count)| unit.repeat(count));
            prop::collection::vec(
                prop_oneof![
                    4 => "[a-zA-Z]{1,12}",
                    2 => Just(" ".to_string()),
                    1 => Just(". ".to_string()),
                    1 => "\\PC{1,4}",
                    2 => run,
                ],
                0..12,
            )
            .prop_map(|parts| parts.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// The new invariant: no counted token spans more than MAX_TOKEN_BYTES, no more than
            /// that lies outside tokens anywhere, so a text of k >= 1 tokens holds at most k *
            /// MAX_BYTES_PER_TOKEN bytes; and the count is the offsets' length.
            #[test]
            fn bytes_per_counted_token_are_bounded(text in text_with_runs()) {
                for tokenizer in tokenizers() {
                    let offsets = tokenizer.offsets(&text);
                    let count = tokenizer.count(&text);
                    prop_assert_eq!(offsets.len(), count, "{}", tokenizer.name());
                    prop_assert!(
                        text.len() <= count.max(1) * MAX_BYTES_PER_TOKEN,
                        "{}: {} bytes, {} tokens", tokenizer.name(), text.len(), count
                    );
                    if !text.is_empty() {
                        prop_assert!(count >= 1);
                    }
                    let mut covered_to = 0usize;
                    for i in 0..offsets.len() {
                        let (start, end) = (offsets.start(i), offsets.end(i));
                        prop_assert!(text.is_char_boundary(start) && text.is_char_boundary(end));
                        prop_assert!(start <= end && end - start <= MAX_TOKEN_BYTES);
                        prop_assert!(i == 0 || (offsets.start(i - 1) <= start && offsets.end(i - 1) <= end));
                        prop_assert!(start <= covered_to + MAX_TOKEN_BYTES, "gap before token {}", i);
                        covered_to = covered_to.max(end);
                    }
                    prop_assert!(text.len() <= covered_to + MAX_TOKEN_BYTES, "gap at the end");
                }
            }
        }
    }

    #[test]
    fn unknown_tokenizer_names_the_field_and_the_choices() {
        let error = BudgetTokenizer::resolve("gpt5", &models_dir()).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("settings.budget_tokenizer") && message.contains("cl100k_base"),
            "{message}"
        );
    }
}
