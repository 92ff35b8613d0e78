//! Static token embeddings (wordllama `l2_supercat_256`): a text's vector is the mean of its
//! tokens' rows, L2-normalised. No model runs, so it costs about as much as tokenizing.

use std::ops::Range;
use std::path::{Path, PathBuf};

use half::f16;
use safetensors::{Dtype, SafeTensors};
use tokenizers::Tokenizer;

use super::chunked_bpe::ChunkedBpe;
use super::{
    l2_normalize, open_unpadded_tokenizer, validate_sentence_ranges, EmbedError, Embedder,
    FineMode, VectorMatrix,
};

/// Name of the embedding table inside the wordllama safetensors file.
const EMBEDDING_TENSOR_NAME: &str = "embedding.weight";

/// Mean-of-token-rows embedder over a float16 table (kept as f32 in memory: 32 000 × 256 × 4 B =
/// 33 MB, traded for not converting halves in the hot loop).
pub struct StaticEmbedder {
    tokenizer: Tokenizer,
    /// The same ids, one word at a time and remembered, when the tokenizer allows it (see
    /// `chunked_bpe`; wordllama's does).
    chunked: Option<ChunkedBpe>,
    dim: usize,
    /// Row-major `vocabulary × dim`.
    table: Vec<f32>,
}

impl std::fmt::Debug for StaticEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StaticEmbedder")
            .field("dim", &self.dim)
            .field("vocabulary", &self.vocabulary_len())
            .finish_non_exhaustive()
    }
}

impl StaticEmbedder {
    /// Loads `wordllama/l2_supercat_256.safetensors` and `wordllama/tokenizer.json` from `models_dir`.
    pub fn from_models_dir(models_dir: &Path) -> Result<Self, EmbedError> {
        Self::new(
            &models_dir.join("wordllama/l2_supercat_256.safetensors"),
            &models_dir.join("wordllama/tokenizer.json"),
        )
    }

    pub fn new(weights_path: &Path, tokenizer_path: &Path) -> Result<Self, EmbedError> {
        let weights_error = |message: String| EmbedError::ModelFile {
            path: PathBuf::from(weights_path),
            message,
        };
        let bytes =
            std::fs::read(weights_path).map_err(|error| weights_error(error.to_string()))?;
        let tensors =
            SafeTensors::deserialize(&bytes).map_err(|error| weights_error(error.to_string()))?;
        let tensor = tensors
            .tensor(EMBEDDING_TENSOR_NAME)
            .map_err(|error| weights_error(error.to_string()))?;
        let (vocabulary, dim) = match tensor.shape() {
            &[vocabulary, dim] if dim > 0 => (vocabulary, dim),
            shape => {
                return Err(weights_error(format!(
                    "`{EMBEDDING_TENSOR_NAME}` has shape {shape:?}, expected 2-d"
                )))
            }
        };
        let table: Vec<f32> = match tensor.dtype() {
            Dtype::F16 => tensor
                .data()
                .chunks_exact(2)
                .map(|half_bytes| f16::from_le_bytes([half_bytes[0], half_bytes[1]]).to_f32())
                .collect(),
            Dtype::F32 => tensor
                .data()
                .chunks_exact(4)
                .map(|bytes| f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                .collect(),
            other => {
                return Err(weights_error(format!(
                    "`{EMBEDDING_TENSOR_NAME}` has dtype {other:?}, expected F16 or F32"
                )))
            }
        };
        if table.len() != vocabulary * dim {
            return Err(weights_error(format!(
                "`{EMBEDDING_TENSOR_NAME}` holds {} values, expected {}",
                table.len(),
                vocabulary * dim
            )));
        }

        let tokenizer = open_unpadded_tokenizer(tokenizer_path)?;
        let chunked = ChunkedBpe::for_tokenizer(&tokenizer, tokenizer_path);
        Ok(Self {
            tokenizer,
            chunked,
            dim,
            table,
        })
    }

    pub fn vocabulary_len(&self) -> usize {
        self.table.len() / self.dim
    }

    /// The token ids of `text`, tokenized in bounded calls (one call over a megabyte section
    /// would hold tens of bytes per byte).
    fn token_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let Some(chunked) = &self.chunked else {
            return crate::tokenizer::encode_in_calls(&self.tokenizer, text, usize::MAX)
                .map(|encoded| encoded.ids)
                .map_err(EmbedError::tokenize);
        };
        // The calls `encode_in_calls` makes (one range each), each through the chunked path.
        let mut ids = Vec::new();
        let mut failure = None;
        let max_run = crate::tokenizer::EMBEDDER_MAX_RUN_BYTES;
        crate::tokenizer::for_each_tokenizer_call(text, max_run, false, |ranges| {
            for range in ranges {
                if failure.is_none() {
                    let call = &text[range.clone()];
                    failure = chunked.encode(&self.tokenizer, call, &mut ids).err();
                }
            }
        });
        match failure {
            Some(error) => Err(EmbedError::tokenize(error)),
            None => Ok(ids),
        }
    }

    /// Writes the normalised mean of `text`'s token rows into `out` (zeros when it has no token).
    fn embed_into(&self, text: &str, out: &mut [f32]) -> Result<(), EmbedError> {
        out.fill(0.0);
        for &id in &self.token_ids(text)? {
            let start = id as usize * self.dim;
            // An id past the table (a tokenizer/table mismatch) is skipped rather than trusted.
            let Some(row) = self.table.get(start..start + self.dim) else {
                continue;
            };
            out.iter_mut().zip(row).for_each(|(sum, x)| *sum += x);
        }
        l2_normalize(out);
        Ok(())
    }
}

impl Embedder for StaticEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn embed_texts(&self, texts: &[&str]) -> Result<VectorMatrix, EmbedError> {
        let mut matrix = VectorMatrix::zeros(self.dim, texts.len());
        for (row, text) in texts.iter().enumerate() {
            self.embed_into(text, matrix.row_mut(row))?;
        }
        Ok(matrix)
    }

    /// Static vectors have no context, so both modes give each sentence the mean of its own rows.
    fn sentence_vectors(
        &self,
        section_text: &str,
        sentences: &[Range<usize>],
        _mode: FineMode,
    ) -> Result<VectorMatrix, EmbedError> {
        validate_sentence_ranges(section_text, sentences)?;
        let mut matrix = VectorMatrix::zeros(self.dim, sentences.len());
        for (row, range) in sentences.iter().enumerate() {
            self.embed_into(&section_text[range.clone()], matrix.row_mut(row))?;
        }
        Ok(matrix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunked_path_gives_the_ids_of_bounded_calls_on_long_texts() {
        let embedder =
            StaticEmbedder::from_models_dir(&crate::tokenizer::tests::models_dir()).unwrap();
        assert!(
            embedder.chunked.is_some(),
            "wordllama takes the chunked path"
        );
        let text = format!(
            "{} {} {}",
            "The lathe turns; a gouge cuts 1234 shavings, naïve café 東京.\n\n".repeat(900),
            "w".repeat(20_000),
            "  indented\tcode ".repeat(500)
        );
        assert!(text.len() > 2 * crate::tokenizer::MAX_CALL_BYTES);
        let expected = crate::tokenizer::encode_in_calls(&embedder.tokenizer, &text, usize::MAX)
            .unwrap()
            .ids;
        assert_eq!(embedder.token_ids(&text).unwrap(), expected);
        // Remembered pieces give the same ids again.
        assert_eq!(embedder.token_ids(&text).unwrap(), expected);
    }
}
