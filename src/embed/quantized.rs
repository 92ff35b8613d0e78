//! Compact sentence vectors: int8 codes with one f32 scale per vector (dim + 4 bytes each, 388 B
//! for MiniLM against 1 536 B in f32), stored per section in an index bytes field. A chunk cut at
//! query time gets its vector by pooling the rows of the sentences it covers.

use std::ops::Range;

use super::{l2_normalize, EmbedError, VectorMatrix};

/// Leading bytes of [`QuantizedVectors::to_bytes`]: format name and version.
const MAGIC: &[u8; 4] = b"LQV1";
const HEADER_LEN: usize = 12;

/// Int8 vectors with a per-vector scale: value `j` of row `i` is `scales[i] * codes[i * dim + j]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizedVectors {
    dim: usize,
    scales: Vec<f32>,
    codes: Vec<i8>,
}

/// Appends the int8 codes of `row` to `codes` and returns its scale (value `j` is
/// `scale * code[j]`): symmetric, the largest component maps to ±127, so 0 stays exact. The
/// codes do not change when `row` is scaled, so a vector and its unit vector share them (the
/// dense index's graphs hold these codes: `crate::dense::to_stored`).
pub fn quantize_row(row: &[f32], codes: &mut Vec<i8>) -> f32 {
    let max_abs = row.iter().fold(
        0.0f32,
        |max, x| if x.is_finite() { max.max(x.abs()) } else { max },
    );
    let scale = max_abs / 127.0;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    // `as i8` saturates, and maps NaN to 0.
    codes.extend(row.iter().map(|x| (x * inverse).round() as i8));
    scale
}

impl QuantizedVectors {
    /// Quantizes every row of `matrix`.
    pub fn from_matrix(matrix: &VectorMatrix) -> Self {
        let dim = matrix.dim();
        let mut scales = Vec::with_capacity(matrix.rows());
        let mut codes = Vec::with_capacity(matrix.values().len());
        for row in matrix.iter_rows() {
            scales.push(quantize_row(row, &mut codes));
        }
        Self { dim, scales, codes }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// Heap bytes held, for cache weighers.
    pub fn heap_bytes(&self) -> usize {
        self.scales.capacity() * std::mem::size_of::<f32>() + self.codes.capacity()
    }

    /// `MAGIC`, dim (u32 LE), count (u32 LE), count scales (f32 LE), count × dim codes (i8).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + self.scales.len() * 4 + self.codes.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(self.dim as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.scales.len() as u32).to_le_bytes());
        for scale in &self.scales {
            bytes.extend_from_slice(&scale.to_le_bytes());
        }
        bytes.extend(self.codes.iter().map(|&code| code as u8));
        bytes
    }

    /// Parses [`Self::to_bytes`] output; any other input gives an error, never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EmbedError> {
        let corrupt = |message: String| EmbedError::CorruptBytes { message };
        if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
            return Err(corrupt(format!(
                "expected a {HEADER_LEN}-byte header starting with {MAGIC:?}"
            )));
        }
        let read_u32 = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
        };
        let dim = read_u32(4);
        let count = read_u32(8);
        let expected_len = count
            .checked_mul(dim)
            .and_then(|codes| codes.checked_add(count.checked_mul(4)?))
            .and_then(|body| body.checked_add(HEADER_LEN));
        if expected_len != Some(bytes.len()) {
            return Err(corrupt(format!(
                "{} bytes do not hold {count} vectors of {dim} dimensions",
                bytes.len()
            )));
        }
        let scales_end = HEADER_LEN + count * 4;
        let scales: Vec<f32> = bytes[HEADER_LEN..scales_end]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if scales
            .iter()
            .any(|scale| !scale.is_finite() || *scale < 0.0)
        {
            return Err(corrupt("a scale is negative or not finite".to_owned()));
        }
        let codes = bytes[scales_end..].iter().map(|&byte| byte as i8).collect();
        Ok(Self { dim, scales, codes })
    }

    fn codes_of(&self, row: usize) -> &[i8] {
        &self.codes[row * self.dim..(row + 1) * self.dim]
    }

    /// Dequantizes row `row` into `out` (`out.len()` must be `dim`).
    pub fn row_into(&self, row: usize, out: &mut [f32]) -> Result<(), EmbedError> {
        self.check_out(out)?;
        if row >= self.len() {
            return Err(EmbedError::invalid_argument(
                "row",
                format!("{row} is past the {} vectors", self.len()),
            ));
        }
        let scale = self.scales[row];
        out.iter_mut()
            .zip(self.codes_of(row))
            .for_each(|(x, &code)| *x = scale * f32::from(code));
        Ok(())
    }

    /// Dot product of row `row` with `query`, without dequantizing into memory. Out-of-range rows
    /// score 0.
    pub fn dot_row(&self, row: usize, query: &[f32]) -> f32 {
        if row >= self.len() {
            return 0.0;
        }
        let codes = self.codes_of(row);
        let mut sums = [0.0f32; 4];
        let mut code_chunks = codes.chunks_exact(4);
        let mut query_chunks = query.chunks_exact(4);
        for (c, q) in (&mut code_chunks).zip(&mut query_chunks) {
            sums[0] += f32::from(c[0]) * q[0];
            sums[1] += f32::from(c[1]) * q[1];
            sums[2] += f32::from(c[2]) * q[2];
            sums[3] += f32::from(c[3]) * q[3];
        }
        let tail: f32 = code_chunks
            .remainder()
            .iter()
            .zip(query_chunks.remainder())
            .map(|(&c, q)| f32::from(c) * q)
            .sum();
        self.scales[row] * ((sums[0] + sums[1]) + (sums[2] + sums[3]) + tail)
    }

    /// Dot products of every row with `query`, written into `out` (cleared first; its capacity
    /// is reused across calls).
    pub fn dots_into(&self, query: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend((0..self.len()).map(|row| self.dot_row(row, query)));
    }

    /// Weighted mean of rows `sentences` (one weight per row, e.g. its token count), L2-normalised,
    /// into `out`. An empty range, all-zero weights or zero rows give a zero vector.
    pub fn pool_into(
        &self,
        sentences: Range<usize>,
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<(), EmbedError> {
        self.check_out(out)?;
        if sentences.start > sentences.end || sentences.end > self.len() {
            return Err(EmbedError::invalid_argument(
                "sentences",
                format!(
                    "{}..{} is not a range of the {} vectors",
                    sentences.start,
                    sentences.end,
                    self.len()
                ),
            ));
        }
        if weights.len() != sentences.len() {
            return Err(EmbedError::invalid_argument(
                "weights",
                format!(
                    "{} weights for {} sentences",
                    weights.len(),
                    sentences.len()
                ),
            ));
        }
        out.fill(0.0);
        for (row, &weight) in sentences.zip(weights) {
            let factor = weight * self.scales[row];
            if factor == 0.0 {
                continue;
            }
            out.iter_mut()
                .zip(self.codes_of(row))
                .for_each(|(x, &code)| *x += factor * f32::from(code));
        }
        l2_normalize(out);
        Ok(())
    }

    /// Allocating form of [`Self::pool_into`].
    pub fn pool(&self, sentences: Range<usize>, weights: &[f32]) -> Result<Vec<f32>, EmbedError> {
        let mut out = vec![0.0; self.dim];
        self.pool_into(sentences, weights, &mut out)?;
        Ok(out)
    }

    fn check_out(&self, out: &[f32]) -> Result<(), EmbedError> {
        if out.len() != self.dim {
            return Err(EmbedError::invalid_argument(
                "out",
                format!("length {} != dim {}", out.len(), self.dim),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{cosine, dot};
    use super::*;
    use proptest::prelude::*;

    /// Deterministic pseudo-random unit vectors (xorshift), so tests need no RNG crate.
    fn unit_vectors(rows: usize, dim: usize, mut seed: u64) -> VectorMatrix {
        let mut values = Vec::with_capacity(rows * dim);
        for _ in 0..rows * dim {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            values.push((seed % 2001) as f32 / 1000.0 - 1.0);
        }
        let mut matrix = VectorMatrix::from_values(dim, values).expect("whole rows");
        for row in 0..rows {
            l2_normalize(matrix.row_mut(row));
        }
        matrix
    }

    #[test]
    fn roundtrip_through_bytes_keeps_directions() {
        let matrix = unit_vectors(50, 384, 7);
        let quantized = QuantizedVectors::from_matrix(&matrix);
        let bytes = quantized.to_bytes();
        assert_eq!(bytes.len(), 12 + 50 * (384 + 4));
        let restored = QuantizedVectors::from_bytes(&bytes).expect("own bytes parse");
        assert_eq!(restored, quantized);
        let mut row = vec![0.0; 384];
        for i in 0..50 {
            restored.row_into(i, &mut row).expect("row in range");
            let similarity = cosine(&row, matrix.row(i));
            assert!(similarity >= 0.999, "row {i}: cosine {similarity}");
            assert!((restored.dot_row(i, matrix.row(i)) - dot(&row, matrix.row(i))).abs() < 1e-4);
        }
    }

    #[test]
    fn pooling_matches_the_f32_weighted_mean() {
        let matrix = unit_vectors(10, 384, 11);
        let quantized = QuantizedVectors::from_matrix(&matrix);
        let weights = [3.0, 1.0, 7.0, 2.0];
        let mut expected = vec![0.0f32; 384];
        for (offset, weight) in weights.iter().enumerate() {
            expected
                .iter_mut()
                .zip(matrix.row(2 + offset))
                .for_each(|(e, x)| *e += weight * x);
        }
        l2_normalize(&mut expected);
        let pooled = quantized.pool(2..6, &weights).expect("valid pool");
        assert!(cosine(&pooled, &expected) >= 0.999);
        assert!((dot(&pooled, &pooled) - 1.0).abs() < 1e-4);
    }

    #[test]
    fn zero_rows_and_empty_pools_give_zero_vectors() {
        let quantized = QuantizedVectors::from_matrix(&VectorMatrix::zeros(8, 2));
        assert!(quantized
            .pool(0..2, &[1.0, 1.0])
            .expect("valid")
            .iter()
            .all(|&x| x == 0.0));
        assert!(quantized
            .pool(1..1, &[])
            .expect("valid")
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn bad_pool_arguments_are_errors() {
        let quantized = QuantizedVectors::from_matrix(&unit_vectors(3, 8, 5));
        assert!(quantized.pool(0..4, &[1.0; 4]).is_err());
        assert!(quantized.pool(0..2, &[1.0]).is_err());
        assert!(quantized.row_into(0, &mut [0.0; 7]).is_err());
        assert_eq!(quantized.dot_row(9, &[1.0; 8]), 0.0);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = QuantizedVectors::from_bytes(&bytes);
        }

        #[test]
        fn truncated_bytes_are_rejected(cut in 0usize..(12 + 3 * 12)) {
            let bytes = QuantizedVectors::from_matrix(&unit_vectors(3, 8, 3)).to_bytes();
            prop_assert!(QuantizedVectors::from_bytes(&bytes[..cut]).is_err());
        }
    }
}
