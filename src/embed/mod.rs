//! Text embeddings.
//!
//! Design rule: at query time the transformer sees only the query. At ingest the neural work is
//! done once, one vector per sentence ([`Embedder::sentence_vectors`]), stored compactly
//! ([`QuantizedVectors`]); the vector of any chunk cut at query time is pooled from the sentence
//! vectors it covers ([`QuantizedVectors::pool_into`]).
//!
//! Vectors travel as a [`VectorMatrix`] (row-major, one allocation) rather than `Vec<Vec<f32>>`,
//! so that a section's sentences cost one buffer and feed [`QuantizedVectors::from_matrix`]
//! directly.

mod chunked_bpe;
mod minilm;
mod quantized;
mod static_vectors;

use std::ops::Range;
use std::path::{Path, PathBuf};

pub use minilm::{ort_environment, MiniLmConfig, MiniLmEmbedder};
pub use quantized::{quantize_row, QuantizedVectors};
pub use static_vectors::StaticEmbedder;

/// How sentence vectors are computed from a section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FineMode {
    /// Each sentence is embedded on its own, blind to its neighbours.
    PerSentence,
    /// Late chunking (Günther et al. 2024): the whole section runs through the model in
    /// overlapping windows and each sentence's vector is the mean of its own token states, so a
    /// sentence such as "It was founded in 1998." carries what "it" refers to.
    #[default]
    LateChunking,
}

/// Errors of the embedding layer.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("cannot load the onnxruntime library `{path}`: {message}")]
    RuntimeLibrary { path: PathBuf, message: String },
    #[error("cannot read model file `{path}`: {message}")]
    ModelFile { path: PathBuf, message: String },
    #[error("cannot load tokenizer `{path}`: {message}")]
    TokenizerFile { path: PathBuf, message: String },
    #[error("tokenization failed: {message}")]
    Tokenize { message: String },
    #[error("inference failed: {message}")]
    Inference { message: String },
    #[error("sentence range {start}..{end} is not a char-aligned range of a {text_len}-byte text")]
    InvalidSentenceRange {
        start: usize,
        end: usize,
        text_len: usize,
    },
    #[error("invalid argument `{name}`: {message}")]
    InvalidArgument { name: &'static str, message: String },
    #[error("corrupt vector bytes: {message}")]
    CorruptBytes { message: String },
    /// The request that wanted the vectors is gone (cancelled, timed out, or the server is
    /// stopping): inference stopped between two model runs.
    #[error("stopped: nobody waits for these vectors any more")]
    Abandoned,
}

impl EmbedError {
    pub(crate) fn inference(error: impl std::fmt::Display) -> Self {
        Self::Inference {
            message: error.to_string(),
        }
    }

    pub(crate) fn tokenize(error: impl std::fmt::Display) -> Self {
        Self::Tokenize {
            message: error.to_string(),
        }
    }

    pub(crate) fn invalid_argument(name: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            name,
            message: message.into(),
        }
    }
}

/// Row-major matrix of vectors: row `i` is `values[i * dim..(i + 1) * dim]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VectorMatrix {
    dim: usize,
    values: Vec<f32>,
}

impl VectorMatrix {
    /// A matrix of `rows` zero vectors.
    pub fn zeros(dim: usize, rows: usize) -> Self {
        Self {
            dim,
            values: vec![0.0; dim * rows],
        }
    }

    /// Wraps row-major values; `None` when `values.len()` is not a multiple of `dim`.
    pub fn from_values(dim: usize, values: Vec<f32>) -> Option<Self> {
        if dim == 0 || !values.len().is_multiple_of(dim) {
            return None;
        }
        Some(Self { dim, values })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn rows(&self) -> usize {
        self.values.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Row `i`; panics when out of range, like slice indexing.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.values[i * self.dim..(i + 1) * self.dim]
    }

    pub fn iter_rows(&self) -> impl Iterator<Item = &[f32]> {
        self.values.chunks_exact(self.dim.max(1))
    }

    pub fn values(&self) -> &[f32] {
        &self.values
    }

    pub fn into_values(self) -> Vec<f32> {
        self.values
    }

    /// Copies the rows out, for callers that want one `Vec` per vector.
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.iter_rows().map(<[f32]>::to_vec).collect()
    }
}

/// What a model's runtime did since the model was loaded: its runs (batches), the sequences
/// and tokens (padding included) they held, and the wall time spent inside the runs, summed over
/// runs that went on at the same time. Tokenizing, batching and pooling are not in it: it is the
/// raw inference an ingest can at best keep busy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InferenceTotals {
    pub runs: u64,
    pub sequences: u64,
    pub padded_tokens: u64,
    pub seconds: f64,
}

/// Something that turns text into unit vectors.
pub trait Embedder: Send + Sync {
    /// Vector dimension.
    fn dim(&self) -> usize;

    /// One L2-normalised vector per text, in input order. A text with no tokens gets the model's
    /// vector of an empty input for MiniLM (its [CLS] [SEP] states) and a zero vector for static
    /// embeddings.
    fn embed_texts(&self, texts: &[&str]) -> Result<VectorMatrix, EmbedError>;

    /// One vector per sentence range of `section_text`, in input order. A sentence that holds no
    /// token (whitespace, an empty range) gets a zero vector: it has no meaning of its own, and a
    /// zero row adds nothing when chunk vectors are pooled.
    fn sentence_vectors(
        &self,
        section_text: &str,
        sentences: &[Range<usize>],
        mode: FineMode,
    ) -> Result<VectorMatrix, EmbedError>;

    /// [`Self::sentence_vectors`] for many sections at once, one matrix per section, in order.
    /// Batching embedders fill their batches across sections; ingest should call this.
    fn sentence_vectors_of_sections(
        &self,
        sections: &[(&str, &[Range<usize>])],
        mode: FineMode,
    ) -> Result<Vec<VectorMatrix>, EmbedError> {
        sections
            .iter()
            .map(|(text, sentences)| self.sentence_vectors(text, sentences, mode))
            .collect()
    }

    /// The vector of one query (the only text the model sees at query time).
    fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.embed_texts(&[query])?.into_values())
    }

    /// The model runtime's totals, for an embedder that runs one (`None` for a table lookup).
    fn inference_totals(&self) -> Option<InferenceTotals> {
        None
    }
}

/// Opens an embedder's tokenizer.json with its padding and truncation off: the embedders batch
/// and truncate themselves (the shipped MiniLM file pads and truncates to 128).
pub(crate) fn open_unpadded_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, EmbedError> {
    let mut tokenizer =
        tokenizers::Tokenizer::from_file(path).map_err(|error| EmbedError::TokenizerFile {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(EmbedError::tokenize)?;
    Ok(tokenizer)
}

/// Checks that every range is a char-aligned range of `text`.
pub(crate) fn validate_sentence_ranges(
    text: &str,
    sentences: &[Range<usize>],
) -> Result<(), EmbedError> {
    for range in sentences {
        let valid = range.start <= range.end
            && range.end <= text.len()
            && text.is_char_boundary(range.start)
            && text.is_char_boundary(range.end);
        if !valid {
            return Err(EmbedError::InvalidSentenceRange {
                start: range.start,
                end: range.end,
                text_len: text.len(),
            });
        }
    }
    Ok(())
}

/// Dot product. Both slices should have the same length; extra items of the longer are ignored.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Four independent accumulators let the compiler vectorise without -ffast-math.
    let mut sums = [0.0f32; 4];
    let mut a_chunks = a.chunks_exact(4);
    let mut b_chunks = b.chunks_exact(4);
    for (x, y) in (&mut a_chunks).zip(&mut b_chunks) {
        sums[0] += x[0] * y[0];
        sums[1] += x[1] * y[1];
        sums[2] += x[2] * y[2];
        sums[3] += x[3] * y[3];
    }
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    (sums[0] + sums[1]) + (sums[2] + sums[3]) + tail
}

/// Cosine similarity; 0 when either vector is zero.
#[inline]
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let norms = (dot(a, a) * dot(b, b)).sqrt();
    if norms > 0.0 {
        dot(a, b) / norms
    } else {
        0.0
    }
}

/// Scales `vector` to unit length in place; a zero (or non-finite) vector becomes all zeros.
#[inline]
pub fn l2_normalize(vector: &mut [f32]) {
    let norm = dot(vector, vector).sqrt();
    if norm > 0.0 && norm.is_finite() {
        let inverse = 1.0 / norm;
        vector.iter_mut().for_each(|x| *x *= inverse);
    } else {
        vector.iter_mut().for_each(|x| *x = 0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_for_all_tail_lengths() {
        for len in 0..13 {
            let a: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 1.0).collect();
            let b: Vec<f32> = (0..len).map(|i| 2.0 - i as f32 * 0.25).collect();
            let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - naive).abs() < 1e-4, "len {len}");
        }
    }

    #[test]
    fn normalising_a_zero_vector_keeps_it_zero() {
        let mut zero = vec![0.0f32; 5];
        l2_normalize(&mut zero);
        assert!(zero.iter().all(|&x| x == 0.0));
        assert_eq!(cosine(&zero, &[1.0, 0.0, 0.0, 0.0, 0.0]), 0.0);
        let mut nan = vec![f32::NAN, 1.0];
        l2_normalize(&mut nan);
        assert_eq!(nan, vec![0.0, 0.0]);
    }

    #[test]
    // One-range slices are the point here: a list of one sentence.
    #[allow(clippy::single_range_in_vec_init)]
    fn sentence_ranges_must_be_char_aligned_and_inside() {
        let text = "héllo";
        assert!(validate_sentence_ranges(text, &[0..1, 3..6]).is_ok());
        assert!(validate_sentence_ranges(text, &[0..2]).is_err());
        assert!(validate_sentence_ranges(text, &[0..7]).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = [3..1, 0..1];
        assert!(validate_sentence_ranges(text, &reversed).is_err());
    }
}
