//! Budget tokenizers: the tokenizer a collection counts budgets and chunk sizes in. One tokenization
//! pass gives a text's [`TokenOffsets`]; counts of any span come from those offsets, and the final
//! answer is recounted exactly with [`BudgetTokenizer::count`].

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::SystemTime;

use tiktoken_rs::CoreBPE;
use tokenizers::Tokenizer;

use crate::error::{LatheError, Result};
use crate::tokens::TokenOffsets;

/// Name of the default budget tokenizer: the tokenizer.json of all-MiniLM-L6-v2.
pub const DEFAULT_TOKENIZER: &str = "minilm";
pub const MINILM_TOKENIZER_PATH: &str = "minilm/tokenizer.json";

/// A tokenizer that counts tokens and gives their byte offsets, without special tokens.
#[derive(Clone)]
pub struct BudgetTokenizer {
    name: Arc<str>,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    HuggingFace(Arc<Tokenizer>),
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
                return Err(LatheError::invalid(
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
        Ok(Self {
            name: Arc::from(name),
            kind,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Token byte offsets of `text` (one pass, no special tokens).
    pub fn offsets(&self, text: &str) -> TokenOffsets {
        match &self.kind {
            // `encode` (not `encode_fast`) tracks byte offsets.
            Kind::HuggingFace(tokenizer) => match tokenizer.encode(text, false) {
                Ok(encoding) => {
                    TokenOffsets::from_spans(text, encoding.get_offsets().iter().copied())
                }
                Err(error) => {
                    // The HF tokenizers fail only on pathological configurations; fall back to
                    // whitespace words so that a query never fails on one odd section.
                    tracing::warn!(%error, tokenizer = %self.name, "tokenization failed, counting words");
                    TokenOffsets::whitespace(text)
                }
            },
            Kind::Tiktoken(bpe) => {
                let ranks = bpe.encode_ordinary(text);
                let mut position = 0usize;
                let spans = bpe._decode_native_and_split(ranks).map(|bytes| {
                    let start = position;
                    position += bytes.len();
                    (start, position)
                });
                TokenOffsets::from_spans(text, spans)
            }
        }
    }

    /// Exact token count of `text` as the caller's model would see it (no special tokens).
    pub fn count(&self, text: &str) -> usize {
        match &self.kind {
            Kind::HuggingFace(tokenizer) => match tokenizer.encode_fast(text, false) {
                Ok(encoding) => encoding.len(),
                Err(_) => TokenOffsets::whitespace(text).len(),
            },
            Kind::Tiktoken(bpe) => bpe.encode_ordinary(text).len(),
        }
    }
}

fn load_tokenizer_json(path: &Path, field: &str) -> Result<Arc<Tokenizer>> {
    if !path.exists() {
        return Err(LatheError::invalid(
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
    type Loaded = HashMap<PathBuf, (Option<(SystemTime, u64)>, Weak<Tokenizer>)>;
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
        LatheError::invalid(field, format!("cannot load {}: {error}", path.display()))
    })?;
    // The shipped tokenizer.json pads and truncates to 128 tokens: counting needs neither.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|error| LatheError::internal(format!("cannot disable truncation: {error}")))?;
    let tokenizer = Arc::new(tokenizer);
    let mut loaded = loaded.lock().unwrap_or_else(|p| p.into_inner());
    // Forget tokenizers no collection holds any more before remembering this one.
    loaded.retain(|_, (_, held)| held.strong_count() > 0);
    loaded.insert(path.to_path_buf(), (version, Arc::downgrade(&tokenizer)));
    Ok(tokenizer)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn models_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models")
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
