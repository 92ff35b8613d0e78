//! all-MiniLM-L6-v2 over onnxruntime (`ort`, library loaded at run time).
//!
//! Texts are tokenized once without special tokens; [CLS]/[SEP] are added here, so the same
//! token stream serves whole-text embeddings, per-sentence embeddings and late-chunking windows.
//! Sequences are sorted by length and packed into batches under a padded-token budget, so short
//! sentences are not padded to the longest one in the call.

mod run;
mod sentences;
mod session;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::session::{RunOptions, Session};
use tokenizers::Tokenizer;

use super::{
    open_unpadded_tokenizer, EmbedError, Embedder, FineMode, InferenceTotals, VectorMatrix,
};
use crate::tokenizer::EncodedText;
use run::InferenceClock;
pub use session::ort_environment;
use session::SessionSide;

/// Hidden size of all-MiniLM-L6-v2.
const MINILM_DIM: usize = 384;
/// The model has 512 positions; sentence-transformers trained and truncates at 256.
const MINILM_MAX_SEQUENCE_TOKENS: usize = 256;

/// Settings of [`MiniLmEmbedder`].
#[derive(Clone, Debug)]
pub struct MiniLmConfig {
    pub model_path: PathBuf,
    pub tokenizer_path: PathBuf,
    pub onnxruntime_library_path: PathBuf,
    /// Threads each session uses inside one operator.
    pub intra_op_threads: usize,
    /// ONNX Runtime's CPU arena and memory patterns: on, a session keeps the peak memory of its
    /// largest batch resident for reuse; off, activations are allocated per run and freed.
    pub memory_arena: bool,
    /// Sessions kept, so that this many calls can run inference at once.
    pub session_count: usize,
    /// With more than one session: the niceness (0..=19) of the threads of the first session,
    /// the one ingest takes first, so that queries get the cores first (0: the default).
    pub ingest_session_nice: i32,
    /// Most sequences in one model run.
    pub max_batch_sequences: usize,
    /// Most padded tokens (sequences × longest) in one model run; bounds activation memory.
    pub max_batch_tokens: usize,
    /// Longest model input, [CLS] and [SEP] included (at most 256, the length the model was
    /// trained at). Longer texts are truncated; late chunking cuts windows of this size.
    pub max_sequence_tokens: usize,
    /// Tokens shared by consecutive late-chunking windows, so that a token near a cut still sees
    /// context on both sides.
    pub late_chunking_overlap_tokens: usize,
    /// A writable directory the embedder owns while it opens: ONNX Runtime's optimised form of
    /// the model is written there once and every session loads it (see
    /// [`write_optimized_model`]); the directory is removed once they have. `None`: each session
    /// optimises the model file itself, holding about 100 MiB more.
    pub optimized_model_dir: Option<PathBuf>,
}

impl MiniLmConfig {
    /// Default settings for the model files laid out as in `models/` of the repository:
    /// `minilm/model.onnx`, `minilm/tokenizer.json`, `onnxruntime/libonnxruntime.so`.
    pub fn from_models_dir(models_dir: &Path) -> Self {
        Self {
            model_path: models_dir.join("minilm/model.onnx"),
            tokenizer_path: models_dir.join("minilm/tokenizer.json"),
            onnxruntime_library_path: models_dir.join("onnxruntime/libonnxruntime.so"),
            intra_op_threads: 2,
            memory_arena: false,
            session_count: 1,
            ingest_session_nice: 0,
            max_batch_sequences: 32,
            max_batch_tokens: 8192,
            max_sequence_tokens: MINILM_MAX_SEQUENCE_TOKENS,
            late_chunking_overlap_tokens: 32,
            optimized_model_dir: None,
        }
    }
}

/// all-MiniLM-L6-v2 sentence embedder (384 dimensions, mean pooling, L2-normalised).
pub struct MiniLmEmbedder {
    config: MiniLmConfig,
    tokenizer: Tokenizer,
    cls_token_id: i64,
    sep_token_id: i64,
    /// `Session::run` needs `&mut`; each session sits behind its own lock.
    sessions: Vec<Mutex<Session>>,
    /// Whether the sessions loaded the optimised model written at open
    /// ([`MiniLmConfig::optimized_model_dir`]).
    optimized: bool,
    clock: InferenceClock,
    /// With the arena on: run options that shrink the CPU arena at the end of the run (ONNX
    /// Runtime's `memory.enable_memory_arena_shrinkage`), used for the last run of an ingest call.
    /// Within a call the arena is reused; between writes it does not keep a batch's peak.
    shrink_arena: Option<RunOptions>,
}

impl std::fmt::Debug for MiniLmEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MiniLmEmbedder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl MiniLmEmbedder {
    pub fn new(config: MiniLmConfig) -> Result<Self, EmbedError> {
        check_sizes(&config)?;
        let environment = ort_environment(&config.onnxruntime_library_path)?;
        // The shipped tokenizer pads and truncates to 128; batching and truncation happen here.
        let tokenizer = open_unpadded_tokenizer(&config.tokenizer_path)?;
        let special_id = |token: &str| {
            tokenizer
                .token_to_id(token)
                .map(i64::from)
                .ok_or_else(|| EmbedError::TokenizerFile {
                    path: config.tokenizer_path.clone(),
                    message: format!("vocabulary has no {token}"),
                })
        };
        let cls_token_id = special_id("[CLS]")?;
        let sep_token_id = special_id("[SEP]")?;
        let (sessions, optimized) = session::open_sessions(&environment, &config)?;
        let shrink_arena = session::shrink_arena_options(&config)?;
        Ok(Self {
            config,
            tokenizer,
            cls_token_id,
            sep_token_id,
            sessions,
            optimized,
            clock: InferenceClock::default(),
            shrink_arena,
        })
    }

    pub fn config(&self) -> &MiniLmConfig {
        &self.config
    }

    /// Whether the sessions loaded the optimised model written at open
    /// ([`MiniLmConfig::optimized_model_dir`]), rather than each optimising the model file.
    pub fn loaded_optimized_model(&self) -> bool {
        self.optimized
    }

    /// Longest content (tokens without [CLS]/[SEP]) of one model input.
    fn max_content_tokens(&self) -> usize {
        self.config.max_sequence_tokens - 2
    }

    /// Token ids and byte offsets of `text`, without special tokens, at least the first
    /// `max_tokens` of them (all of them for `usize::MAX`). Tokenized in bounded calls (see
    /// [`crate::tokenizer::encode_in_calls`]): a word of megabytes is cut into pieces of
    /// [`crate::tokenizer::MAX_RUN_BYTES`] rather than handed whole to the tokenizer, which would
    /// hold tens of bytes per input byte and give one `[UNK]` for it.
    fn tokenize(&self, text: &str, max_tokens: usize) -> Result<EncodedText, EmbedError> {
        crate::tokenizer::encode_in_calls(&self.tokenizer, text, max_tokens)
            .map_err(EmbedError::tokenize)
    }

    /// Number of model tokens of `text` ([CLS]/[SEP] excluded, no truncation).
    pub fn count_tokens(&self, text: &str) -> Result<usize, EmbedError> {
        Ok(self.tokenize(text, usize::MAX)?.ids.len())
    }
}

/// The sequence and batch sizes of `config` within what the model takes: a sequence of at most
/// the model's 256 tokens holding at least one content token, and batches holding one of them.
fn check_sizes(config: &MiniLmConfig) -> Result<(), EmbedError> {
    if config.max_sequence_tokens < 3 || config.max_sequence_tokens > MINILM_MAX_SEQUENCE_TOKENS {
        return Err(EmbedError::invalid_argument(
            "max_sequence_tokens",
            format!(
                "must lie in 3..={MINILM_MAX_SEQUENCE_TOKENS}, got {}",
                config.max_sequence_tokens
            ),
        ));
    }
    if config.max_batch_sequences == 0 || config.max_batch_tokens < config.max_sequence_tokens {
        return Err(EmbedError::invalid_argument(
            "max_batch_tokens",
            "batches must hold at least one sequence of max_sequence_tokens",
        ));
    }
    Ok(())
}

impl Embedder for MiniLmEmbedder {
    fn dim(&self) -> usize {
        MINILM_DIM
    }

    fn inference_totals(&self) -> Option<InferenceTotals> {
        Some(self.clock.totals())
    }

    fn embed_texts(&self, texts: &[&str]) -> Result<VectorMatrix, EmbedError> {
        let mut matrices = [VectorMatrix::zeros(MINILM_DIM, texts.len())];
        let max_content = self.max_content_tokens();
        let encodings = texts
            .iter()
            .map(|text| self.tokenize(text, max_content))
            .collect::<Result<Vec<_>, _>>()?;
        let token_lists: Vec<&[u32]> = encodings
            .iter()
            .map(|encoding| &encoding.ids[..encoding.ids.len().min(max_content)])
            .collect();
        let targets: Vec<(usize, usize)> = (0..texts.len()).map(|row| (0, row)).collect();
        self.embed_token_lists(&token_lists, &targets, &mut matrices, SessionSide::Query)?;
        let [matrix] = matrices;
        Ok(matrix)
    }

    fn sentence_vectors(
        &self,
        section_text: &str,
        sentences: &[Range<usize>],
        mode: FineMode,
    ) -> Result<VectorMatrix, EmbedError> {
        let mut matrices = self.batched_sentence_vectors(&[(section_text, sentences)], mode)?;
        matrices
            .pop()
            .ok_or_else(|| EmbedError::inference("no vectors came back"))
    }

    fn sentence_vectors_of_sections(
        &self,
        sections: &[(&str, &[Range<usize>])],
        mode: FineMode,
    ) -> Result<Vec<VectorMatrix>, EmbedError> {
        self.batched_sentence_vectors(sections, mode)
    }
}

/// A two-session MiniLM from the repository's models/ (scripts/fetch-models.sh).
#[cfg(test)]
fn two_session_embedder() -> MiniLmEmbedder {
    let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut config = MiniLmConfig::from_models_dir(&models);
    config.session_count = 2;
    config.max_batch_tokens = 512;
    config.memory_arena = true;
    MiniLmEmbedder::new(config).expect("MiniLM loads (run scripts/fetch-models.sh)")
}
