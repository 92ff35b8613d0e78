//! The coarse stage: retrieval of whole sections: BM25 (tantivy) and, with the neural stage, the
//! nearest section vectors (hnsw), fused by weighted reciprocal rank fusion. Both legs return
//! where their sections lie; only the `top_k` the fusion keeps are read, each once.

use std::collections::HashMap;

use crate::cpu_pool;
use crate::error::Result;
use crate::index::{CollectionIndex, FoundSection, SectionHit, Snapshot};
use crate::types::Filter;

/// Weighted reciprocal rank fusion: `Σ weight / (k + rank)`, rank counted from 1.
#[derive(Clone, Copy, Debug)]
pub struct Fusion {
    pub k: f32,
    pub lexical_weight: f32,
    pub dense_weight: f32,
}

/// The top `top_k` sections for the analysed `terms` (and the query vector, when given), best
/// first. Each hit's `score` is its fused score (its BM25 score when there is no dense leg).
#[tracing::instrument(level = "debug", skip_all, fields(top_k, dense = query_vector.is_some()))]
pub fn retrieve(
    index: &CollectionIndex,
    snapshot: &Snapshot,
    terms: &[String],
    query_vector: Option<&[f32]>,
    filter: &Filter,
    top_k: usize,
    fusion: Fusion,
) -> Result<Vec<SectionHit>> {
    let Some(query_vector) = query_vector.filter(|_| index.has_dense()) else {
        let lexical = index.find(snapshot, terms, filter, top_k)?;
        return index.read_found(snapshot, &lexical);
    };
    // The two legs run side by side when the CPU pool has threads to spare.
    let (lexical, dense) = cpu_pool::join(
        || index.find(snapshot, terms, filter, top_k),
        || index.find_dense(snapshot, query_vector, filter, top_k),
    );
    index.read_found(snapshot, &fuse(lexical?, dense?, top_k, fusion))
}

/// What the fusion reads and writes of a leg's result.
pub trait Ranked {
    fn section_key(&self) -> u64;
    fn score(&self) -> f32;
    fn score_mut(&mut self) -> &mut f32;
}

impl Ranked for FoundSection {
    fn section_key(&self) -> u64 {
        self.section_key
    }
    fn score(&self) -> f32 {
        self.score
    }
    fn score_mut(&mut self) -> &mut f32 {
        &mut self.score
    }
}

/// The two legs' results fused by weighted reciprocal rank, best `top_k` first (ties by key),
/// each scored by its fused score.
pub fn fuse<T: Ranked>(lexical: Vec<T>, dense: Vec<T>, top_k: usize, fusion: Fusion) -> Vec<T> {
    let mut fused: Vec<T> = Vec::with_capacity(lexical.len() + dense.len());
    let mut position: HashMap<u64, usize> = HashMap::with_capacity(lexical.len() + dense.len());
    for (leg, weight) in [
        (lexical, fusion.lexical_weight),
        (dense, fusion.dense_weight),
    ] {
        for (rank, mut hit) in leg.into_iter().enumerate() {
            let contribution = weight / (fusion.k + rank as f32 + 1.0);
            match position.get(&hit.section_key()) {
                Some(&i) => *fused[i].score_mut() += contribution,
                None => {
                    position.insert(hit.section_key(), fused.len());
                    *hit.score_mut() = contribution;
                    fused.push(hit);
                }
            }
        }
    }
    fused.sort_by(|a, b| {
        b.score()
            .total_cmp(&a.score())
            .then(a.section_key().cmp(&b.section_key()))
    });
    fused.truncate(top_k);
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Ranked for SectionHit {
        fn section_key(&self) -> u64 {
            self.section_key
        }
        fn score(&self) -> f32 {
            self.score
        }
        fn score_mut(&mut self) -> &mut f32 {
            &mut self.score
        }
    }

    fn hit(key: u64) -> SectionHit {
        SectionHit {
            score: 0.0,
            doc_id: format!("d{key}"),
            ordinal: 0,
            version: 0,
            doc_title: String::new(),
            heading_path: Vec::new(),
            text: String::new(),
            gap_after: String::new(),
            byte_start: 0,
            char_start: 0,
            metadata: Default::default(),
            section_key: key,
            sentences: Vec::new(),
            sentence_vectors: Vec::new(),
        }
    }

    #[test]
    fn a_section_found_by_both_legs_ranks_above_one_found_by_a_single_leg() {
        let fusion = Fusion {
            k: 60.0,
            lexical_weight: 1.0,
            dense_weight: 1.0,
        };
        let fused = fuse(
            vec![hit(1), hit(2), hit(3)],
            vec![hit(3), hit(4)],
            3,
            fusion,
        );
        let keys: Vec<u64> = fused.iter().map(|h| h.section_key).collect();
        // 3: 1/63 + 1/61; 1: 1/61; 2 and 4 tie at 1/62 and the tie goes to the lower key.
        assert_eq!(keys, vec![3, 1, 2]);
        assert!((fused[0].score - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-6);
    }

    #[test]
    fn weights_tilt_the_fusion() {
        let fusion = Fusion {
            k: 60.0,
            lexical_weight: 0.1,
            dense_weight: 1.0,
        };
        let fused = fuse(vec![hit(1)], vec![hit(2)], 2, fusion);
        assert_eq!(fused[0].section_key, 2);
    }
}
