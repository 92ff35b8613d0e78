//! all-MiniLM-L6-v2 over onnxruntime (`ort`, library loaded at run time).
//!
//! Texts are tokenized once without special tokens; [CLS]/[SEP] are added here, so the same
//! token stream serves whole-text embeddings, per-sentence embeddings and late-chunking windows.
//! Sequences are sorted by length and packed into batches under a padded-token budget, so short
//! sentences are not padded to the longest one in the call.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session};
use ort::value::TensorRef;
use tokenizers::Tokenizer;

use super::{
    l2_normalize, open_unpadded_tokenizer, validate_sentence_ranges, EmbedError, Embedder,
    FineMode, InferenceTotals, VectorMatrix,
};
use crate::tokenizer::EncodedText;
use crate::tokens::TokenOffsets;

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
            max_batch_sequences: 32,
            max_batch_tokens: 8192,
            max_sequence_tokens: MINILM_MAX_SEQUENCE_TOKENS,
            late_chunking_overlap_tokens: 32,
            optimized_model_dir: None,
        }
    }
}

/// ort allows one environment per process, ever (its slot is never cleared), so every embedder of
/// the process shares this one. A failed load is not remembered: a later call may retry.
static ORT_ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);

/// The process-wide onnxruntime environment, loading the library from `library_path` on first use.
/// Later calls return the same environment whatever path they pass (a process can load only one
/// onnxruntime library).
pub fn ort_environment(library_path: &Path) -> Result<Environment, EmbedError> {
    let mut slot = ORT_ENVIRONMENT
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(environment) = slot.as_ref() {
        return Ok(environment.clone());
    }
    let library_error = |message: String| EmbedError::RuntimeLibrary {
        path: library_path.to_path_buf(),
        message,
    };
    // `init_from` reports a missing or incompatible library as an error; loading it implicitly
    // would panic instead.
    let builder = ort::init_from(library_path).map_err(|error| library_error(error.to_string()))?;
    let environment = builder
        .with_name("lathe")
        .with_telemetry(false)
        .build()
        .map_err(|error| library_error(error.to_string()))?;
    *slot = Some(environment.clone());
    Ok(environment)
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

/// [`InferenceTotals`], kept with relaxed atomics (each run adds its own figures once).
#[derive(Debug, Default)]
struct InferenceClock {
    runs: AtomicU64,
    sequences: AtomicU64,
    padded_tokens: AtomicU64,
    nanos: AtomicU64,
}

impl InferenceClock {
    fn record(&self, sequences: usize, padded_tokens: usize, elapsed: std::time::Duration) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
        self.padded_tokens
            .fetch_add(padded_tokens as u64, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn totals(&self) -> InferenceTotals {
        InferenceTotals {
            runs: self.runs.load(Ordering::Relaxed),
            sequences: self.sequences.load(Ordering::Relaxed),
            padded_tokens: self.padded_tokens.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

impl std::fmt::Debug for MiniLmEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MiniLmEmbedder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Which work a model run is for: sentence vectors at ingest, or texts (queries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessionSide {
    Ingest,
    Query,
}

/// One model input: content token ids without [CLS]/[SEP].
struct Sequence<'a> {
    content_ids: &'a [u32],
}

/// A late-chunking window over the section's tokens: the model sees `tokens`, and the states of
/// `owned` (the tokens with the most context in this window) are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LateChunkingWindow {
    tokens: Range<usize>,
    owned: Range<usize>,
}

impl MiniLmEmbedder {
    pub fn new(config: MiniLmConfig) -> Result<Self, EmbedError> {
        if config.max_sequence_tokens < 3 || config.max_sequence_tokens > MINILM_MAX_SEQUENCE_TOKENS
        {
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

        let model_error = |error: &dyn std::fmt::Display| EmbedError::ModelFile {
            path: config.model_path.clone(),
            message: error.to_string(),
        };
        let optimized_model = config.optimized_model_dir.as_deref().and_then(|dir| {
            write_optimized_model(&environment, &config, dir)
                .inspect_err(|error| {
                    tracing::warn!(
                        %error,
                        "cannot write the optimised MiniLM model; each session optimises its own copy"
                    );
                })
                .ok()
        });
        let open_sessions = |model_path: &Path| {
            (0..config.session_count.max(1))
                .map(|_| {
                    open_session(&environment, &config, model_path)
                        .map(Mutex::new)
                        .map_err(|error| model_error(&error))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let opened = match optimized_model.as_deref().map(open_sessions) {
            Some(Ok(sessions)) => Ok((sessions, true)),
            Some(Err(error)) => {
                tracing::warn!(%error, "cannot load the optimised MiniLM model; loading the original");
                open_sessions(&config.model_path).map(|sessions| (sessions, false))
            }
            None => open_sessions(&config.model_path).map(|sessions| (sessions, false)),
        };
        // Each session has mapped or pre-packed the weights it keeps: the files can go.
        if let Some(dir) = &config.optimized_model_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        let (sessions, optimized) = opened?;
        let shrink_arena = if config.memory_arena {
            let mut options = RunOptions::new().map_err(|error| model_error(&error))?;
            options
                .set("memory.enable_memory_arena_shrinkage", "cpu:0")
                .map_err(|error| model_error(&error))?;
            Some(options)
        } else {
            None
        };
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

    /// A free session, trying first the one `side` prefers (ingest the first, queries the last,
    /// so that with two sessions a query does not wait behind an ingest batch and only the
    /// ingest session's memory grows to a batch's); else waits for the preferred one.
    fn acquire_session(&self, side: SessionSide) -> MutexGuard<'_, Session> {
        let count = self.sessions.len();
        let first = match side {
            SessionSide::Ingest => 0,
            SessionSide::Query => count - 1,
        };
        for offset in 0..count {
            let index = match side {
                SessionSide::Ingest => first + offset,
                SessionSide::Query => first - offset,
            };
            if let Ok(guard) = self.sessions[index].try_lock() {
                return guard;
            }
        }
        // A panic inside a run leaves the session itself usable: runs keep no state between calls.
        self.sessions[first]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `sequences` through the model in length-sorted batches and hands each sequence's token
    /// states to `sink(sequence_index, states)`, where `states` holds `content_len + 2` rows of
    /// [`MINILM_DIM`] floats: [CLS], the content tokens, [SEP].
    fn run_sequences(
        &self,
        sequences: &[Sequence<'_>],
        side: SessionSide,
        mut sink: impl FnMut(usize, &[f32]),
    ) -> Result<(), EmbedError> {
        let mut order: Vec<usize> = (0..sequences.len()).collect();
        order.sort_by_key(|&index| sequences[index].content_ids.len());

        let mut input_ids: Vec<i64> = Vec::new();
        let mut attention_mask: Vec<i64> = Vec::new();
        let mut token_type_ids: Vec<i64> = Vec::new();
        let mut batch_start = 0;
        while batch_start < order.len() {
            // A run takes tens to hundreds of milliseconds and a section's batches can take
            // seconds: stop between runs once the result has no taker (see `cpu_pool`).
            if crate::cpu_pool::current_job_abandoned() {
                return Err(EmbedError::Abandoned);
            }
            let batch_end = self.batch_end(sequences, &order, batch_start);
            let batch = &order[batch_start..batch_end];
            // Sorted ascending, so the last sequence taken sets the padded length.
            let padded_len = sequences[order[batch_end - 1]].content_ids.len() + 2;
            self.fill_batch_inputs(
                sequences,
                batch,
                padded_len,
                &mut input_ids,
                &mut attention_mask,
            );
            token_type_ids.resize(batch.len() * padded_len, 0);

            let shape = [batch.len(), padded_len];
            let inputs = ort::inputs![
                "input_ids" => TensorRef::from_array_view((shape, input_ids.as_slice())).map_err(EmbedError::inference)?,
                "attention_mask" => TensorRef::from_array_view((shape, attention_mask.as_slice())).map_err(EmbedError::inference)?,
                "token_type_ids" => TensorRef::from_array_view((shape, &token_type_ids[..batch.len() * padded_len])).map_err(EmbedError::inference)?,
            ];
            let mut session = self.acquire_session(side);
            let started = Instant::now();
            // The last run of an ingest call hands the arena's free memory back (see
            // `shrink_arena`), so a server between writes holds what it did before them.
            let last_of_ingest = side == SessionSide::Ingest && batch_end == order.len();
            let outputs = match self.shrink_arena.as_ref().filter(|_| last_of_ingest) {
                Some(options) => session.run_with_options(inputs, options),
                None => session.run(inputs),
            }
            .map_err(EmbedError::inference)?;
            self.clock
                .record(batch.len(), batch.len() * padded_len, started.elapsed());
            let hidden = outputs
                .get("last_hidden_state")
                .ok_or_else(|| EmbedError::inference("model has no output `last_hidden_state`"))?;
            let (output_shape, states) = hidden
                .try_extract_tensor::<f32>()
                .map_err(EmbedError::inference)?;
            let expected_shape = [batch.len() as i64, padded_len as i64, MINILM_DIM as i64];
            if output_shape[..] != expected_shape[..]
                || states.len() != batch.len() * padded_len * MINILM_DIM
            {
                return Err(EmbedError::inference(format!(
                    "last_hidden_state has shape {output_shape:?}, expected {expected_shape:?}"
                )));
            }
            for (row, &sequence_index) in batch.iter().enumerate() {
                let real_len = sequences[sequence_index].content_ids.len() + 2;
                let row_start = row * padded_len * MINILM_DIM;
                sink(
                    sequence_index,
                    &states[row_start..row_start + real_len * MINILM_DIM],
                );
            }
            batch_start = batch_end;
        }
        Ok(())
    }

    /// End (exclusive, into `order`) of the batch starting at `batch_start`: at most
    /// `max_batch_sequences` sequences whose padded size stays within `max_batch_tokens` (one
    /// sequence always goes, whatever its length). `order` sorts the sequences by length, so the
    /// last one taken sets the padded length.
    fn batch_end(&self, sequences: &[Sequence<'_>], order: &[usize], batch_start: usize) -> usize {
        let mut batch_end = batch_start;
        while batch_end < order.len() && batch_end - batch_start < self.config.max_batch_sequences {
            let padded_len = sequences[order[batch_end]].content_ids.len() + 2;
            if batch_end > batch_start
                && (batch_end - batch_start + 1) * padded_len > self.config.max_batch_tokens
            {
                break;
            }
            batch_end += 1;
        }
        batch_end
    }

    /// Writes the model inputs of `batch` (indexes into `sequences`) as rows of `padded_len`:
    /// `[CLS] content [SEP]` then padding, with an attention mask of 1 over the real tokens.
    fn fill_batch_inputs(
        &self,
        sequences: &[Sequence<'_>],
        batch: &[usize],
        padded_len: usize,
        input_ids: &mut Vec<i64>,
        attention_mask: &mut Vec<i64>,
    ) {
        input_ids.clear();
        attention_mask.clear();
        input_ids.resize(batch.len() * padded_len, 0);
        attention_mask.resize(batch.len() * padded_len, 0);
        for (row, &sequence_index) in batch.iter().enumerate() {
            let content = sequences[sequence_index].content_ids;
            let ids_row = &mut input_ids[row * padded_len..(row + 1) * padded_len];
            ids_row[0] = self.cls_token_id;
            for (slot, &id) in ids_row[1..].iter_mut().zip(content) {
                *slot = i64::from(id);
            }
            ids_row[content.len() + 1] = self.sep_token_id;
            attention_mask[row * padded_len..row * padded_len + content.len() + 2].fill(1);
        }
    }

    /// Embeds texts given as token id lists (already truncated), mean-pooling every row of the
    /// model input ([CLS] and [SEP] included, as sentence-transformers does); list `i` goes to
    /// row `targets[i].1` of `matrices[targets[i].0]`.
    fn embed_token_lists(
        &self,
        token_lists: &[&[u32]],
        targets: &[(usize, usize)],
        matrices: &mut [VectorMatrix],
        side: SessionSide,
    ) -> Result<(), EmbedError> {
        let sequences: Vec<Sequence<'_>> = token_lists
            .iter()
            .map(|&content_ids| Sequence { content_ids })
            .collect();
        self.run_sequences(&sequences, side, |sequence_index, states| {
            let (matrix_index, row_index) = targets[sequence_index];
            let row = matrices[matrix_index].row_mut(row_index);
            row.fill(0.0);
            for token_state in states.chunks_exact(MINILM_DIM) {
                row.iter_mut()
                    .zip(token_state)
                    .for_each(|(sum, x)| *sum += x);
            }
            // Scaling by 1 / token count would not change the direction.
            l2_normalize(row);
        })
    }

    /// Sentence vectors of many sections in one pass, so that batches are filled across
    /// sections (a section alone often has only a handful of sentences or one window).
    fn batched_sentence_vectors(
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

/// One inference session on `model_path`, as `config` sets it up.
fn open_session(
    environment: &Environment,
    config: &MiniLmConfig,
    model_path: &Path,
) -> ort::Result<Session> {
    Session::builder(environment)?
        .with_memory_pattern(config.memory_arena)?
        .with_execution_providers([ort::ep::CPU::default()
            .with_arena_allocator(config.memory_arena)
            .build()])?
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_intra_threads(config.intra_op_threads.max(1))?
        .commit_from_file(model_path)
}

/// The file name, inside [`MiniLmConfig::optimized_model_dir`], of the optimised model; its
/// weights lie beside it in [`OPTIMIZED_WEIGHTS_FILE`].
const OPTIMIZED_MODEL_FILE: &str = "model.onnx";
const OPTIMIZED_WEIGHTS_FILE: &str = "weights.bin";

/// Writes ONNX Runtime's optimised form of `config.model_path` into `dir` (emptied first) and
/// returns the model file's path.
///
/// The shipped model stores its weights as int8 with a scale (`Cast` and `Mul` before each
/// `MatMul`). Constant folding turns them into f32 when a session is created, and a session that
/// optimises the model itself keeps the folded weights beside the pre-packed copies its kernels
/// make: about 100 MiB a session. Written out with the folded weights in an external file, the
/// model loads with those weights memory-mapped, and a session keeps only what it pre-packs
/// (about 40 MiB). The optimisation written is ONNX Runtime's extended level, which is not
/// specific to this machine's CPU; each session still applies every level when it loads.
fn write_optimized_model(
    environment: &Environment,
    config: &MiniLmConfig,
    dir: &Path,
) -> Result<PathBuf, EmbedError> {
    let model_error = |error: &dyn std::fmt::Display| EmbedError::ModelFile {
        path: dir.join(OPTIMIZED_MODEL_FILE),
        message: error.to_string(),
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(model_error(&error)),
    }
    std::fs::create_dir_all(dir).map_err(|error| model_error(&error))?;
    let model_path = dir.join(OPTIMIZED_MODEL_FILE);
    // The session that writes the file is not kept: creating it is what writes it.
    let write = || -> ort::Result<Session> {
        Session::builder(environment)?
            .with_optimization_level(GraphOptimizationLevel::Level2)?
            .with_optimized_model_path(&model_path)?
            .with_config_entry(
                "session.optimized_model_external_initializers_file_name",
                OPTIMIZED_WEIGHTS_FILE,
            )?
            .with_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                "1024",
            )?
            .commit_from_file(&config.model_path)
    };
    write().map_err(|error| model_error(&error))?;
    Ok(model_path)
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

    /// A two-session MiniLM from the repository's models/ (scripts/fetch-models.sh).
    fn two_session_embedder() -> MiniLmEmbedder {
        let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
        let mut config = MiniLmConfig::from_models_dir(&models);
        config.session_count = 2;
        config.max_batch_tokens = 512;
        config.memory_arena = true;
        MiniLmEmbedder::new(config).expect("MiniLM loads (run scripts/fetch-models.sh)")
    }

    /// Which of the two sessions are held now.
    fn held(embedder: &MiniLmEmbedder) -> [bool; 2] {
        [0, 1].map(|i| embedder.sessions[i].try_lock().is_err())
    }

    #[test]
    fn ingest_takes_the_first_free_session_and_queries_the_last() {
        let embedder = two_session_embedder();
        {
            let _ingest = embedder.acquire_session(SessionSide::Ingest);
            assert_eq!(held(&embedder), [true, false]);
            // With the ingest session busy, a query still gets a session at once.
            let _query = embedder.acquire_session(SessionSide::Query);
            assert_eq!(held(&embedder), [true, true]);
        }
        {
            let _query = embedder.acquire_session(SessionSide::Query);
            assert_eq!(held(&embedder), [false, true]);
            // A second ingest run while one holds the first session takes the free one.
            let _first = embedder.acquire_session(SessionSide::Ingest);
            assert_eq!(held(&embedder), [true, true]);
        }
    }

    #[test]
    fn every_model_run_is_counted_with_its_sequences_tokens_and_time() {
        let embedder = two_session_embedder();
        assert_eq!(
            embedder.inference_totals(),
            Some(InferenceTotals::default())
        );
        let text = "Lathe cuts chunks at query time. Each caller gets its own sizes.";
        let sentences = [0..32, 33..text.len()];
        let sections: Vec<(&str, &[Range<usize>])> = vec![(text, &sentences); 3];
        embedder
            .sentence_vectors_of_sections(&sections, FineMode::LateChunking)
            .expect("embeds");
        let after_ingest = embedder.inference_totals().expect("MiniLM keeps totals");
        // The ingest call's last run shrank the arena (it is on in this embedder).
        assert!(embedder.shrink_arena.is_some());
        // Three short sections are one window each, filling one batch.
        assert_eq!((after_ingest.runs, after_ingest.sequences), (1, 3));
        let content = embedder
            .tokenize(text, usize::MAX)
            .expect("tokenizes")
            .ids
            .len();
        assert_eq!(after_ingest.padded_tokens as usize, 3 * (content + 2));
        assert!(after_ingest.seconds > 0.0, "{after_ingest:?}");
        embedder
            .embed_query("where are chunks cut")
            .expect("embeds");
        let after_query = embedder.inference_totals().expect("MiniLM keeps totals");
        assert_eq!((after_query.runs, after_query.sequences), (2, 4));
        assert!(after_query.seconds > after_ingest.seconds);
    }

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
