//! The diversify stage: with a `diversity` above 0, the scored candidates are reordered by
//! maximal marginal relevance (Carbonell & Goldstein, 1998) before packing, so that one document
//! or one repeated passage does not take the whole budget.
//!
//! Greedily, the next candidate is the one with the highest
//! `(1 - diversity) * relevance - diversity * (highest similarity to a candidate already taken)`,
//! where relevance is the score rescaled to 0..1 over the candidates considered. Similarity is the
//! cosine of the chunks' pooled sentence vectors (the score stage's vectors); a chunk without a
//! vector (no dense index, or no model) counts as 1 similar to chunks of its own document and 0
//! to others. Only the best [`MMR_POOL`] candidates are reordered (the work grows with its
//! square); the rest follow in score order.

use super::Candidate;
use crate::index::SectionHit;

/// How many of the best candidates MMR reorders.
pub const MMR_POOL: usize = 256;

/// Reorders `candidates` (sorted best first) by MMR with trade-off `diversity` in 0..=1;
/// `vectors` holds the pooled vector of each of the first candidates (see
/// [`super::score::chunk_vectors`]). Nothing changes at 0.
pub fn diversify(
    candidates: &mut [Candidate],
    vectors: &[Option<Vec<f32>>],
    hits: &[SectionHit],
    diversity: f32,
) {
    let pool = candidates.len().min(vectors.len()).min(MMR_POOL);
    if diversity <= 0.0 || pool < 2 {
        return;
    }
    let relevance = rescaled_scores(&candidates[..pool]);
    let similarity = |a: usize, b: usize| match (&vectors[a], &vectors[b]) {
        (Some(x), Some(y)) => crate::embed::dot(x, y),
        _ => {
            let same_document = hits[candidates[a].hit_index as usize].doc_id
                == hits[candidates[b].hit_index as usize].doc_id;
            if same_document {
                1.0
            } else {
                0.0
            }
        }
    };
    let mut closest = vec![f32::NEG_INFINITY; pool];
    let mut taken = vec![false; pool];
    let mut order = Vec::with_capacity(pool);
    for _ in 0..pool {
        let mut best: Option<(usize, f32)> = None;
        for i in (0..pool).filter(|&i| !taken[i]) {
            let redundancy = closest[i].max(0.0);
            let value = (1.0 - diversity) * relevance[i] - diversity * redundancy;
            // Strictly greater: ties keep score order.
            if best.is_none_or(|(_, best_value)| value > best_value) {
                best = Some((i, value));
            }
        }
        let Some((chosen, _)) = best else { break };
        taken[chosen] = true;
        order.push(chosen);
        for i in (0..pool).filter(|&i| !taken[i]) {
            closest[i] = closest[i].max(similarity(chosen, i));
        }
    }
    let reordered: Vec<Candidate> = order.iter().map(|&i| candidates[i]).collect();
    candidates[..pool].copy_from_slice(&reordered);
}

/// Scores rescaled to 0..1 (all 1 when they are equal).
fn rescaled_scores(candidates: &[Candidate]) -> Vec<f32> {
    let (low, high) = candidates
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), c| {
            (lo.min(c.score), hi.max(c.score))
        });
    let span = high - low;
    candidates
        .iter()
        .map(|c| {
            if span > 1e-9 {
                (c.score - low) / span
            } else {
                1.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Strategy;
    use crate::types::ScoreParts;

    fn hit(doc_id: &str) -> SectionHit {
        SectionHit {
            doc_id: doc_id.into(),
            ..crate::query::test_section_hit(1.0, &"x".repeat(100))
        }
    }

    fn candidate(hit_index: u32, start: u32, score: f32) -> Candidate {
        Candidate {
            hit_index,
            start,
            end: start + 10,
            token_count: 3,
            header: None,
            strategy: Strategy::Sentence,
            score,
            parts: ScoreParts::default(),
        }
    }

    fn starts(candidates: &[Candidate]) -> Vec<u32> {
        candidates.iter().map(|c| c.start).collect()
    }

    #[test]
    fn without_vectors_the_second_document_comes_before_more_of_the_first() {
        let hits = vec![hit("a"), hit("b")];
        let scored = vec![
            candidate(0, 0, 1.0),
            candidate(0, 10, 0.9),
            candidate(0, 20, 0.8),
            candidate(1, 30, 0.5),
        ];
        let vectors = vec![None; scored.len()];
        let mut off = scored.clone();
        diversify(&mut off, &vectors, &hits, 0.0);
        assert_eq!(starts(&off), [0, 10, 20, 30]);
        let mut diverse = scored.clone();
        diversify(&mut diverse, &vectors, &hits, 0.5);
        assert_eq!(starts(&diverse), [0, 30, 10, 20]);
    }

    #[test]
    fn near_duplicate_vectors_are_pushed_back() {
        let hits = vec![hit("a")];
        let scored = vec![
            candidate(0, 0, 1.0),
            candidate(0, 10, 0.95),
            candidate(0, 20, 0.6),
        ];
        let vectors = vec![
            Some(vec![1.0, 0.0]),
            Some(vec![1.0, 0.0]),
            Some(vec![0.0, 1.0]),
        ];
        let mut diverse = scored.clone();
        diversify(&mut diverse, &vectors, &hits, 0.5);
        assert_eq!(starts(&diverse), [0, 20, 10]);
        // A permutation: nothing lost, nothing repeated.
        let mut sorted = starts(&diverse);
        sorted.sort_unstable();
        assert_eq!(sorted, starts(&scored));
    }
}
