//! What a graph holds for a vector, and how it compares two.
//!
//! A graph holds each vector as its int8 codes ([`crate::embed::quantize_row`]): the codes the
//! section's own stored vector keeps beside its text, `dim` bytes (256 a 256-d vector, half of
//! the half floats held before). Two stored vectors compare by the cosine of their codes,
//! computed in integers: exactly the similarity of the vectors they stand for, since a code
//! vector's scale cancels out of its cosine.
//!
//! A query is not quantized. It reaches hnsw_rs as the bytes of its `f32` values ([`query_elements`]:
//! `4 × dim` elements against a stored vector's `dim`, which is how the distance tells the two
//! apart), and compares as `q · c / |c|` in `f32`. So a search ranks the stored vectors exactly as
//! a scan over them would; only the graph walk is approximate.

#[cfg(target_arch = "x86_64")]
use std::sync::LazyLock;

use hnsw_rs::prelude::Distance;

use crate::embed::{l2_normalize, quantize_row};

/// One element of a stored vector: an int8 code.
pub type StoredElement = i8;

/// The stored form (codes) of `vector`, of any length.
pub fn to_stored(vector: &[f32]) -> Vec<StoredElement> {
    let mut codes = Vec::with_capacity(vector.len());
    quantize_row(vector, &mut codes);
    codes
}

/// The unit vector the codes stand for (zero for codes all zero).
pub fn from_stored(codes: &[StoredElement]) -> Vec<f32> {
    let mut unit: Vec<f32> = codes.iter().map(|&code| f32::from(code)).collect();
    l2_normalize(&mut unit);
    unit
}

/// The unit vector `unit` as a graph search takes it: its values' bytes (see the module doc).
pub fn query_elements(unit: &[f32]) -> &[StoredElement] {
    bytemuck::cast_slice(unit)
}

/// `1 - cosine`, clamped to [0, 2]: of two stored vectors, or of a query (the bytes of its `f32`
/// values) and a stored vector. hnsw_rs's own `DistDot` asserts
/// `a·b <= 1`, which rounding breaks for a vector compared with itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitDotDistance;

impl Distance<StoredElement> for UnitDotDistance {
    fn eval(&self, a: &[StoredElement], b: &[StoredElement]) -> f32 {
        let similarity = if a.len() == b.len() {
            codes_cosine(a, b)
        } else if a.len() == 4 * b.len() {
            query_similarity(a, b)
        } else if b.len() == 4 * a.len() {
            query_similarity(b, a)
        } else {
            0.0
        };
        (1.0 - similarity).clamp(0.0, 2.0)
    }
}

/// The cosine of two code vectors (0 when either is all zero).
fn codes_cosine(a: &[StoredElement], b: &[StoredElement]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let sums = if *HAS_AVX2_FMA {
        // SAFETY: the features the function is compiled for were detected on this CPU.
        unsafe { x86::code_sums(a, b) }
    } else {
        code_sums(a, b)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let sums = code_sums(a, b);
    let CodeSums { ab, aa, bb } = sums;
    let norms = (aa as f64 * bb as f64).sqrt();
    if norms > 0.0 {
        (ab as f64 / norms) as f32
    } else {
        0.0
    }
}

/// `q · c / |c|` for the unit query whose values' bytes are `query` (0 when `c` is all zero).
fn query_similarity(query: &[StoredElement], codes: &[StoredElement]) -> f32 {
    // `query_elements` hands out the bytes of an `f32` slice, so they are aligned; a copy
    // serves any other caller.
    let owned: Vec<f32>;
    let query: &[f32] = match bytemuck::try_cast_slice(query) {
        Ok(values) => values,
        Err(_) => {
            owned = bytemuck::pod_collect_to_vec(query);
            &owned
        }
    };
    unit_similarity(query, codes)
}

/// `q · c / |c|` of the unit query `query` and the codes `codes` (0 when `c` is all zero): the
/// cosine of the query and the vector the codes stand for.
pub(super) fn unit_similarity(query: &[f32], codes: &[StoredElement]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let (dot, norm2) = if *HAS_AVX2_FMA {
        // SAFETY: the features the function is compiled for were detected on this CPU.
        unsafe { x86::query_sums(query, codes) }
    } else {
        query_sums(query, codes)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (dot, norm2) = query_sums(query, codes);
    if norm2 > 0.0 {
        dot / norm2.sqrt()
    } else {
        0.0
    }
}

/// `a · b`, `a · a` and `b · b` of two code vectors, exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CodeSums {
    ab: i64,
    aa: i64,
    bb: i64,
}

/// [`CodeSums`] over the common length, one element at a time (where there is no AVX2).
fn code_sums(a: &[StoredElement], b: &[StoredElement]) -> CodeSums {
    let mut sums = CodeSums {
        ab: 0,
        aa: 0,
        bb: 0,
    };
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (i64::from(x), i64::from(y));
        sums.ab += x * y;
        sums.aa += x * x;
        sums.bb += y * y;
    }
    sums
}

/// `q · c` and `c · c` over the common length, in eight lanes (where there is no AVX2).
fn query_sums(query: &[f32], codes: &[StoredElement]) -> (f32, f32) {
    const LANES: usize = 8;
    let (mut qc, mut cc) = ([0.0f32; LANES], [0.0f32; LANES]);
    let mut q_chunks = query.chunks_exact(LANES);
    let mut c_chunks = codes.chunks_exact(LANES);
    for (q, c) in (&mut q_chunks).zip(&mut c_chunks) {
        for lane in 0..LANES {
            let c = f32::from(c[lane]);
            qc[lane] += q[lane] * c;
            cc[lane] += c * c;
        }
    }
    for (&q, &c) in q_chunks.remainder().iter().zip(c_chunks.remainder()) {
        let c = f32::from(c);
        qc[0] += q * c;
        cc[0] += c * c;
    }
    (qc.iter().sum(), cc.iter().sum())
}

/// Whether this CPU has AVX2 and FMA (checked once; every x86-64 server of the last decade).
#[cfg(target_arch = "x86_64")]
static HAS_AVX2_FMA: LazyLock<bool> =
    LazyLock::new(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256, __m256i, _mm256_add_epi32, _mm256_add_ps, _mm256_castps256_ps128,
        _mm256_castsi256_si128, _mm256_cvtepi32_ps, _mm256_cvtepi8_epi16, _mm256_cvtepi8_epi32,
        _mm256_extractf128_ps, _mm256_extracti128_si256, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_madd_epi16, _mm256_setzero_ps, _mm256_setzero_si256, _mm_add_epi32, _mm_add_ps,
        _mm_add_ss, _mm_cvtss_f32, _mm_loadl_epi64, _mm_loadu_si128, _mm_movehl_ps, _mm_shuffle_ps,
        _mm_storeu_si128,
    };

    use super::{CodeSums, StoredElement};

    /// [`super::code_sums`]: sixteen codes at a time widened to `i16` and multiplied-added in
    /// pairs into `i32` lanes (exact: a lane gains at most 2 × 127² a step, so it holds for
    /// dimensions up to about a million).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn code_sums(a: &[StoredElement], b: &[StoredElement]) -> CodeSums {
        let len = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut ab, mut aa, mut bb) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: `i + 16 <= len`, within both slices; unaligned loads are fine.
            let (x, y) = unsafe {
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i).cast::<__m128i>())),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i).cast::<__m128i>())),
                )
            };
            ab = _mm256_add_epi32(ab, _mm256_madd_epi16(x, y));
            aa = _mm256_add_epi32(aa, _mm256_madd_epi16(x, x));
            bb = _mm256_add_epi32(bb, _mm256_madd_epi16(y, y));
            i += 16;
        }
        let tail = super::code_sums(&a[i..len], &b[i..len]);
        CodeSums {
            ab: sum_i32(ab) + tail.ab,
            aa: sum_i32(aa) + tail.aa,
            bb: sum_i32(bb) + tail.bb,
        }
    }

    /// [`super::query_sums`]: eight codes at a time widened to `f32`, four multiply-adds of
    /// each sum in flight.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn query_sums(query: &[f32], codes: &[StoredElement]) -> (f32, f32) {
        let len = query.len().min(codes.len());
        let (pq, pc) = (query.as_ptr(), codes.as_ptr());
        let mut dots = [_mm256_setzero_ps(); 4];
        let mut norms = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= len {
            for lane in 0..4 {
                let at = i + 8 * lane;
                // SAFETY: `at + 8 <= len`, within both slices; unaligned loads are fine.
                let (q, c) = unsafe {
                    (
                        _mm256_loadu_ps(pq.add(at)),
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            pc.add(at).cast::<__m128i>(),
                        ))),
                    )
                };
                dots[lane] = _mm256_fmadd_ps(q, c, dots[lane]);
                norms[lane] = _mm256_fmadd_ps(c, c, norms[lane]);
            }
            i += 32;
        }
        let (tail_dot, tail_norm) = super::query_sums(&query[i..len], &codes[i..len]);
        (sum_f32(dots) + tail_dot, sum_f32(norms) + tail_norm)
    }

    #[target_feature(enable = "avx2,fma")]
    fn sum_f32(lanes: [__m256; 4]) -> f32 {
        let sum = _mm256_add_ps(
            _mm256_add_ps(lanes[0], lanes[1]),
            _mm256_add_ps(lanes[2], lanes[3]),
        );
        let quad = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 0b01)))
    }

    #[target_feature(enable = "avx2,fma")]
    fn sum_i32(lanes: __m256i) -> i64 {
        let quad = _mm_add_epi32(
            _mm256_castsi256_si128(lanes),
            _mm256_extracti128_si256(lanes, 1),
        );
        let mut values = [0i32; 4];
        // SAFETY: `values` holds four `i32`, 16 writable bytes.
        unsafe { _mm_storeu_si128(values.as_mut_ptr().cast::<__m128i>(), quad) };
        values.iter().map(|&v| i64::from(v)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::random_components;
    use super::*;
    use crate::embed::{cosine, dot};

    /// Deterministic pseudo-random vectors (xorshift), components in [-1, 1].
    fn vector(dim: usize, mut seed: u64) -> Vec<f32> {
        random_components(dim, &mut seed)
    }

    fn unit(dim: usize, seed: u64) -> Vec<f32> {
        let mut v = vector(dim, seed);
        l2_normalize(&mut v);
        v
    }

    #[test]
    fn codes_do_not_depend_on_the_vectors_scale() {
        let v = vector(256, 1);
        let scaled: Vec<f32> = v.iter().map(|x| x * 0.01).collect();
        assert_eq!(to_stored(&v), to_stored(&scaled));
        let codes = to_stored(&v);
        assert_eq!(codes.iter().map(|c| c.unsigned_abs()).max(), Some(127));
        // What the codes stand for is the vector, within a step of 1/127 of its largest value.
        let back = from_stored(&codes);
        assert!(cosine(&back, &v) > 0.9999, "{}", cosine(&back, &v));
    }

    #[test]
    fn two_stored_vectors_compare_by_the_exact_cosine_of_what_they_stand_for() {
        // Dimensions below, at and past one lane block, and the models' 256 and 384.
        for dim in [1, 7, 8, 9, 100, 256, 384] {
            for seed in 0..20 {
                let (a, b) = (
                    to_stored(&vector(dim, seed + 10)),
                    to_stored(&vector(dim, seed + 99)),
                );
                let want = 1.0 - dot(&from_stored(&a), &from_stored(&b));
                let got = UnitDotDistance.eval(&a, &b);
                assert!(
                    (got - want.clamp(0.0, 2.0)).abs() < 1e-5,
                    "{dim}: {got} vs {want}"
                );
            }
            let a = to_stored(&vector(dim, 3));
            assert!(UnitDotDistance.eval(&a, &a) < 1e-6, "{dim}: itself");
        }
    }

    #[test]
    fn a_query_compares_unquantized_with_what_the_codes_stand_for() {
        for dim in [1, 7, 8, 9, 100, 256, 384] {
            for seed in 0..20 {
                let query = unit(dim, seed + 7);
                let codes = to_stored(&vector(dim, seed + 500));
                let want = 1.0 - dot(&query, &from_stored(&codes));
                // Either argument order: hnsw_rs passes the query first, but need not.
                let got = UnitDotDistance.eval(query_elements(&query), &codes);
                let swapped = UnitDotDistance.eval(&codes, query_elements(&query));
                assert!(
                    (got - want.clamp(0.0, 2.0)).abs() < 1e-5,
                    "{dim}: {got} vs {want}"
                );
                assert_eq!(got, swapped);
            }
        }
    }

    #[test]
    fn all_zero_codes_are_unlike_everything() {
        let zero = vec![0i8; 16];
        let other = to_stored(&vector(16, 4));
        assert_eq!(UnitDotDistance.eval(&zero, &other), 1.0);
        assert_eq!(UnitDotDistance.eval(&zero, &zero), 1.0);
        assert_eq!(
            UnitDotDistance.eval(query_elements(&unit(16, 5)), &zero),
            1.0
        );
        assert!(from_stored(&zero).iter().all(|x| *x == 0.0));
    }

    #[test]
    fn unaligned_query_bytes_read_the_same() {
        let query = unit(33, 8);
        let codes = to_stored(&vector(33, 9));
        let mut shifted: Vec<i8> = vec![0];
        shifted.extend_from_slice(query_elements(&query));
        let aligned = UnitDotDistance.eval(query_elements(&query), &codes);
        assert_eq!(UnitDotDistance.eval(&shifted[1..], &codes), aligned);
    }

    #[test]
    fn the_vector_kernels_and_the_portable_ones_agree_at_every_length() {
        for len in 0..100 {
            let a = to_stored(&vector(len, len as u64 + 40));
            let b = to_stored(&vector(len, len as u64 + 140));
            let query = unit(len, len as u64 + 240);
            let (query_dot, norm2) = query_sums(&query, &b);
            #[cfg(target_arch = "x86_64")]
            if *HAS_AVX2_FMA {
                // SAFETY: detected just above.
                assert_eq!(
                    unsafe { x86::code_sums(&a, &b) },
                    code_sums(&a, &b),
                    "{len}"
                );
                let (vector_dot, vector_norm2) = unsafe { x86::query_sums(&query, &b) };
                assert!((vector_dot - query_dot).abs() < 1e-4, "{len}");
                assert!(
                    (vector_norm2 - norm2).abs() < 1e-3 * norm2.max(1.0),
                    "{len}"
                );
            }
            if len > 0 {
                let want = cosine(&from_stored(&a), &from_stored(&b));
                assert!((codes_cosine(&a, &b) - want).abs() < 1e-5, "{len}");
                let want = dot(&query, &from_stored(&b));
                let got = query_similarity(query_elements(&query), &b);
                assert!((got - want).abs() < 1e-5, "{len}");
            }
        }
    }
}
