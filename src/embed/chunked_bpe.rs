//! The static embedder's tokenizer (wordllama's SentencePiece-style BPE) one word at a time, with
//! the ids of each word remembered: the same ids as the Hugging Face tokenizer gives the whole
//! text, at a fraction of the cost.
//!
//! That tokenizer has no pre-tokeniser: it prepends `▁`, turns every space into `▁` and runs BPE
//! over the whole text as one word, so its own per-word cache never hits and every sentence of
//! every section is merged from single chars (40 % of a static-vector ingest). But no token of
//! its vocabulary holds a `▁` after another char (`▁` only leads a token, or makes up all of
//! one), so no merge ever crosses the point before a `▁` that follows another char: BPE of the
//! text is BPE of each piece between such points (`▁▁word`, `▁the`, …), in order. Each piece's
//! ids are computed once with the tokenizer's own model and remembered.
//!
//! [`ChunkedBpe::for_tokenizer`] checks that shape (normaliser `Prepend("▁")` then `Replace(" ",
//! "▁")`, no pre-tokeniser, a BPE model without dropout, suffixes or `ignore_merges`, and the
//! vocabulary property); a text holding an added token's text goes to the tokenizer whole.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use tokenizers::{Model, Tokenizer};

const SPACE_MARK: char = '\u{2581}';
/// Pieces remembered before the memory is cleared and starts again.
const REMEMBERED_PIECES: usize = 1 << 18;

pub struct ChunkedBpe {
    /// Added tokens' texts: a text holding one is tokenized whole.
    added: Vec<String>,
    pieces: Mutex<HashMap<Box<str>, Box<[u32]>>>,
}

impl std::fmt::Debug for ChunkedBpe {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ChunkedBpe").finish_non_exhaustive()
    }
}

impl ChunkedBpe {
    /// The word-at-a-time path for the tokenizer loaded from `path`, when its configuration is
    /// the one described in the module doc; `None` for any other.
    pub fn for_tokenizer(tokenizer: &Tokenizer, path: &Path) -> Option<Self> {
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let normalizer = serde_json::json!({
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "\u{2581}"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
            ]
        });
        let model = &json["model"];
        let plain_bpe = model["type"] == "BPE"
            && model["dropout"].is_null()
            && model["continuing_subword_prefix"].is_null()
            && model["end_of_word_suffix"].is_null()
            && model["ignore_merges"] != true;
        if json["normalizer"] != normalizer || !json["pre_tokenizer"].is_null() || !plain_bpe {
            return None;
        }
        let marks_only_lead = tokenizer.get_model().get_vocab().keys().all(|token| {
            let rest = token.trim_start_matches(SPACE_MARK);
            !rest.contains(SPACE_MARK)
        });
        if !marks_only_lead {
            return None;
        }
        let added = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|token| token.content)
            .filter(|content| !content.is_empty())
            .collect();
        Some(Self {
            added,
            pieces: Mutex::new(HashMap::new()),
        })
    }

    /// The ids `tokenizer.encode(text, false)` gives, appended to `ids`.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
    ) -> Result<(), tokenizers::Error> {
        if self.added.iter().any(|added| text.contains(added.as_str())) {
            ids.extend_from_slice(tokenizer.encode(text, false)?.get_ids());
            return Ok(());
        }
        if text.is_empty() {
            return Ok(());
        }
        let mut normalized = String::with_capacity(text.len() + 3 * (1 + text.len() / 4));
        normalized.push(SPACE_MARK);
        for c in text.chars() {
            normalized.push(if c == ' ' { SPACE_MARK } else { c });
        }
        let mut pieces = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        let mut start = 0;
        let mut previous_is_mark = true;
        for (position, c) in normalized.char_indices() {
            let is_mark = c == SPACE_MARK;
            if is_mark && !previous_is_mark {
                self.piece(tokenizer, &normalized[start..position], &mut pieces, ids)?;
                start = position;
            }
            previous_is_mark = is_mark;
        }
        self.piece(tokenizer, &normalized[start..], &mut pieces, ids)
    }

    fn piece(
        &self,
        tokenizer: &Tokenizer,
        piece: &str,
        pieces: &mut HashMap<Box<str>, Box<[u32]>>,
        ids: &mut Vec<u32>,
    ) -> Result<(), tokenizers::Error> {
        if let Some(known) = pieces.get(piece) {
            ids.extend_from_slice(known);
            return Ok(());
        }
        let tokens: Box<[u32]> = tokenizer
            .get_model()
            .tokenize(piece)?
            .into_iter()
            .map(|token| token.id)
            .collect();
        ids.extend_from_slice(&tokens);
        if pieces.len() >= REMEMBERED_PIECES {
            pieces.clear();
        }
        pieces.insert(piece.into(), tokens);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wordllama() -> &'static (Tokenizer, ChunkedBpe) {
        static LOADED: std::sync::OnceLock<(Tokenizer, ChunkedBpe)> = std::sync::OnceLock::new();
        LOADED.get_or_init(|| {
            let path = crate::test_models_dir().join("wordllama/tokenizer.json");
            let tokenizer = super::super::open_unpadded_tokenizer(&path).unwrap();
            let chunked = ChunkedBpe::for_tokenizer(&tokenizer, &path).expect("wordllama's shape");
            (tokenizer, chunked)
        })
    }

    fn both(text: &str) -> (Vec<u32>, Vec<u32>) {
        let (tokenizer, chunked) = wordllama();
        let mut fast = Vec::new();
        chunked.encode(tokenizer, text, &mut fast).unwrap();
        let slow = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        (fast, slow)
    }

    #[test]
    fn other_tokenizers_do_not_take_this_path() {
        let path = crate::test_models_dir().join("minilm/tokenizer.json");
        let tokenizer = super::super::open_unpadded_tokenizer(&path).unwrap();
        assert!(ChunkedBpe::for_tokenizer(&tokenizer, &path).is_none());
    }

    #[test]
    fn words_one_at_a_time_give_the_ids_of_the_whole_text() {
        for text in [
            "",
            " ",
            "The quick brown fox jumps over the lazy dog.",
            "  two  spaces,   three, and\ttabs\nnewlines\n\n  indented code()",
            "naïve café 北京欢迎你 🦀 <s> and </s> <unk>x",
            "    fn main() {\n        println!(\"hi\");\n    }",
            "tokenization tokenization tokenization",
            "\u{2581}already marked\u{2581}\u{2581}text",
        ] {
            let (fast, slow) = both(text);
            assert_eq!(fast, slow, "{text:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_mix_gives_the_ids_of_the_whole_text(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "the", "The", "ization", "token", "a", " ", "  ", "   ", "\n", "\t", ".", ",",
                "é", "ü", "北", "🦀", "<s>", "</s>", "\u{2581}", "x\u{301}", "42", "(", ")",
                "\u{0}", "\u{a0}",
            ]), 0..40),
        ) {
            let text = pieces.concat();
            let (fast, slow) = both(&text);
            prop_assert_eq!(fast, slow);
        }
    }
}
