//! Static token embeddings (wordllama `l2_supercat_256`): a text's vector is the mean of its
//! tokens' rows, L2-normalised. No model runs, so it costs about as much as tokenizing.

use std::ops::Range;
use std::path::{Path, PathBuf};

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use memmap2::{Advice, Mmap};
use safetensors::{Dtype, SafeTensors};
use tokenizers::Tokenizer;

use super::chunked_bpe::ChunkedBpe;
use super::{
    l2_normalize, open_unpadded_tokenizer, validate_sentence_ranges, EmbedError, Embedder,
    FineMode, VectorMatrix,
};

/// Name of the embedding table inside the wordllama safetensors file.
const EMBEDDING_TENSOR_NAME: &str = "embedding.weight";

/// Mean-of-token-rows embedder over a float16 table, read in place from the memory-mapped model
/// file: only the rows of the tokens met are paged in (a query's few), and the kernel may drop
/// them again. Held as f32 in the heap it was 33 MB (32 000 × 256 × 4 B).
pub struct StaticEmbedder {
    tokenizer: Tokenizer,
    /// The same ids, one word at a time and remembered, when the tokenizer allows it (see
    /// `chunked_bpe`; wordllama's does).
    chunked: Option<ChunkedBpe>,
    dim: usize,
    /// Row-major `vocabulary × dim`.
    table: Halves,
}

/// The embedding table's halves: mapped from the model file where they lie aligned in it (as
/// they do in wordllama's), else copied out of it.
enum Halves {
    Mapped { map: Mmap, bytes: Range<usize> },
    Owned(Vec<f16>),
}

impl Halves {
    fn as_slice(&self) -> &[f16] {
        match self {
            // Checked aligned (and the host little-endian) when the map was kept.
            Self::Mapped { map, bytes } => {
                bytemuck::cast_slice::<u8, u16>(&map[bytes.clone()]).reinterpret_cast()
            }
            Self::Owned(halves) => halves,
        }
    }
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
        let file =
            std::fs::File::open(weights_path).map_err(|error| weights_error(error.to_string()))?;
        // SAFETY: model files are not written in place while a server runs: they are replaced
        // by a rename (`scripts/fetch-models.sh`), which leaves this mapping on the old file.
        let map = unsafe { Mmap::map(&file) }.map_err(|error| weights_error(error.to_string()))?;
        // Queries read a few scattered rows: no read-ahead around them.
        map.advise(Advice::Random)
            .map_err(|error| weights_error(error.to_string()))?;
        let tensors =
            SafeTensors::deserialize(&map).map_err(|error| weights_error(error.to_string()))?;
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
        let data = tensor.data();
        let width = match tensor.dtype() {
            Dtype::F16 => 2,
            Dtype::F32 => 4,
            other => {
                return Err(weights_error(format!(
                    "`{EMBEDDING_TENSOR_NAME}` has dtype {other:?}, expected F16 or F32"
                )))
            }
        };
        if data.len() != vocabulary * dim * width {
            return Err(weights_error(format!(
                "`{EMBEDDING_TENSOR_NAME}` holds {} bytes, expected {}",
                data.len(),
                vocabulary * dim * width
            )));
        }
        let offset = data.as_ptr() as usize - map.as_ptr() as usize;
        let table = match width {
            2 if offset.is_multiple_of(2) && cfg!(target_endian = "little") => Halves::Mapped {
                bytes: offset..offset + data.len(),
                map,
            },
            2 => Halves::Owned(
                data.chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            // Kept as halves too: a mean of rows, normalised, needs no more precision.
            _ => Halves::Owned(
                data.chunks_exact(4)
                    .map(|b| f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            ),
        };

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
        self.table.as_slice().len() / self.dim
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

    /// Writes the normalised mean of `text`'s token rows into `out` (zeros when it has no token);
    /// `widened` (`dim` long) takes each row as `f32`.
    fn embed_into(
        &self,
        text: &str,
        out: &mut [f32],
        widened: &mut [f32],
    ) -> Result<(), EmbedError> {
        out.fill(0.0);
        let table = self.table.as_slice();
        for &id in &self.token_ids(text)? {
            let start = id as usize * self.dim;
            // An id past the table (a tokenizer/table mismatch) is skipped rather than trusted.
            let Some(row) = table.get(start..start + self.dim) else {
                continue;
            };
            // Eight halves an instruction where the CPU converts them (F16C, detected at run time).
            row.convert_to_f32_slice(widened);
            out.iter_mut().zip(&*widened).for_each(|(sum, x)| *sum += x);
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
        let mut widened = vec![0.0; self.dim];
        for (row, text) in texts.iter().enumerate() {
            self.embed_into(text, matrix.row_mut(row), &mut widened)?;
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
        let mut widened = vec![0.0; self.dim];
        for (row, range) in sentences.iter().enumerate() {
            self.embed_into(
                &section_text[range.clone()],
                matrix.row_mut(row),
                &mut widened,
            )?;
        }
        Ok(matrix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_read_in_place_and_gives_the_rows_the_file_holds() {
        let models_dir = crate::test_models_dir();
        let embedder = StaticEmbedder::from_models_dir(&models_dir).unwrap();
        assert!(matches!(embedder.table, Halves::Mapped { .. }));
        // The reference: the file read whole, each half widened on its own.
        let bytes =
            std::fs::read(models_dir.join("wordllama/l2_supercat_256.safetensors")).unwrap();
        let tensors = SafeTensors::deserialize(&bytes).unwrap();
        let data = tensors.tensor(EMBEDDING_TENSOR_NAME).unwrap().data();
        let dim = embedder.dim;
        assert_eq!(embedder.vocabulary_len() * dim * 2, data.len());
        let text = "The lathe turns; a gouge cuts naïve shavings.";
        let mut expected = vec![0.0f32; dim];
        let ids = embedder.token_ids(text).unwrap();
        assert!(ids.len() > 5);
        for id in ids {
            for (j, sum) in expected.iter_mut().enumerate() {
                let at = (id as usize * dim + j) * 2;
                *sum += f16::from_le_bytes([data[at], data[at + 1]]).to_f32();
            }
        }
        l2_normalize(&mut expected);
        assert_eq!(embedder.embed_texts(&[text]).unwrap().row(0), &expected[..]);
    }

    #[test]
    fn the_chunked_path_gives_the_ids_of_bounded_calls_on_long_texts() {
        let embedder = StaticEmbedder::from_models_dir(&crate::test_models_dir()).unwrap();
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
