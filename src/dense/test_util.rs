//! What the dense index's tests share: pseudo-random vectors, the exact answer to compare with,
//! and indexes built and reopened in a few ways.

use std::collections::HashSet;
use std::path::Path;

use super::segment::Graph;
use super::{from_stored, to_stored, DenseIndex, DenseIndexConfig, StoredElement, UnitDotDistance};
use crate::embed::{dot, l2_normalize};

/// `dim` deterministic pseudo-random components in [-1, 1] (xorshift), `seed` carried on.
pub(super) fn random_components(dim: usize, seed: &mut u64) -> Vec<f32> {
    (0..dim)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Deterministic pseudo-random unit vectors (xorshift).
pub(super) fn random_vectors(count: usize, dim: usize, mut seed: u64) -> Vec<Vec<f32>> {
    (0..count)
        .map(|_| {
            let mut vector = random_components(dim, &mut seed);
            l2_normalize(&mut vector);
            vector
        })
        .collect()
}

/// Unit vector `v` as the index holds it (the unit vector of its codes): the reference the exact
/// scan of a small segment must match.
pub(super) fn as_stored(v: &[f32]) -> Vec<f32> {
    let mut unit = v.to_vec();
    l2_normalize(&mut unit);
    from_stored(&to_stored(&unit))
}

/// The `k` best ids by exact similarity to what the index stores.
pub(super) fn exact_top(
    vectors: &[Vec<f32>],
    query: &[f32],
    k: usize,
    skip: &dyn Fn(u64) -> bool,
) -> Vec<u64> {
    let mut scored: Vec<(u64, f32)> = vectors
        .iter()
        .enumerate()
        .filter(|(id, _)| !skip(*id as u64))
        .map(|(id, v)| (id as u64, dot(&as_stored(v), query)))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.into_iter().take(k).map(|(id, _)| id).collect()
}

pub(super) fn small_index(vectors: &[Vec<f32>]) -> DenseIndex {
    let index = DenseIndex::new(DenseIndexConfig::new(vectors[0].len())).expect("valid config");
    for (id, vector) in vectors.iter().enumerate() {
        index.insert(id as u64, vector).expect("right dimension");
    }
    index
}

/// `count` vectors under ids `0..count` in an index kept in `dir`, sealed every `seal` vectors.
pub(super) fn persisted_index(dir: &Path, vectors: &[Vec<f32>], seal: usize) -> DenseIndex {
    let mut config = DenseIndexConfig::new(vectors[0].len());
    config.seal_vectors = seal;
    let (index, missing) = DenseIndex::open(dir, config, &HashSet::new()).expect("opens");
    assert!(missing.is_empty());
    index
        .insert_many(
            vectors
                .iter()
                .enumerate()
                .map(|(id, v)| (id as u64, v.as_slice())),
        )
        .expect("inserts");
    index
}

pub(super) fn reopen(
    dir: &Path,
    dim: usize,
    seal: usize,
    live: impl Iterator<Item = u64>,
) -> (DenseIndex, Vec<u64>) {
    let mut config = DenseIndexConfig::new(dim);
    config.seal_vectors = seal;
    DenseIndex::open(dir, config, &live.collect()).expect("opens")
}

/// Inserts the `missing` keys again, as the caller of `open` does, then checks that every
/// vector is found as its own nearest.
pub(super) fn insert_missing_and_find_each(
    index: &DenseIndex,
    missing: &[u64],
    vectors: &[Vec<f32>],
) {
    index
        .insert_many(
            missing
                .iter()
                .map(|id| (*id, vectors[*id as usize].as_slice())),
        )
        .expect("inserts");
    find_each(index, vectors);
}

/// Checks that every vector (under its position's key) is found as its own nearest.
pub(super) fn find_each(index: &DenseIndex, vectors: &[Vec<f32>]) {
    for (id, query) in vectors.iter().enumerate() {
        assert_eq!(
            index.search(query, 1, &|_| true).expect("ok")[0].0,
            id as u64
        );
    }
}

/// hnsw_rs's graph of `vectors` (slot = position), built as a segment builds one (M 16,
/// `ef_construction` 100).
pub(super) fn hnsw_graph(vectors: &[Vec<f32>]) -> Graph {
    let graph: Graph =
        hnsw_rs::prelude::Hnsw::new(16, vectors.len().max(1), 16, 100, UnitDotDistance);
    let codes: Vec<Vec<StoredElement>> = vectors.iter().map(|v| to_stored(v)).collect();
    let batch: Vec<(&[StoredElement], usize)> = codes
        .iter()
        .enumerate()
        .map(|(slot, c)| (c.as_slice(), slot))
        .collect();
    graph.parallel_insert_slice(&batch);
    graph
}
