//! The diversify stage: with a `diversity` above 0, the scored candidates are reordered by
//! maximal marginal relevance (Carbonell & Goldstein, 1998) before packing, so that one document
//! or one repeated passage does not take the whole budget.
//!
//! Greedily, the next candidate is the one with the highest
//! `(1 - diversity) * relevance - diversity * (highest similarity to a candidate already taken)`,
//! where relevance is the score rescaled to 0..1 over the candidates considered. Similarity is the
//! cosine of the chunks' pooled sentence vectors (the score stage's vectors); a chunk without a
//! vector (no dense index, or no model) counts as 1 similar to chunks of its own document and 0
//! to others. Only the best [`MMR_POOL`] candidates are considered, and picks stop once they
//! fill twice the budget as pack would fill it (each pick compares every candidate left with
//! the one picked, so the work grows with the pool times the picks); the rest follow in score
//! order.
//!
//! A request that leaves `diversity` unset gets MMR only when its query is ambiguous
//! ([`is_ambiguous`]): selective diversification (Santos, Macdonald and Ounis, 2010). A query
//! whose best chunks single out one document keeps its ranking; one whose best chunks are spread
//! evenly over many documents ("What is the conclusion of this study?" over a collection of
//! papers) is answered from more of them, since no one of them is the likely one.

use super::Candidate;
use crate::index::SectionHit;

/// How many of the best candidates MMR reorders.
pub const MMR_POOL: usize = 256;

/// Reorders `candidates` (sorted best first) by MMR with trade-off `diversity` in 0..=1 for a
/// token `budget`: picks stop once they fill twice the budget, each counted where it fits what is
/// left, as pack counts it, until no candidate would fit (pack takes at most the budget; later
/// picks could matter only where it skips many picks, e.g. those overlapping spans it took).
/// `vectors` holds the pooled vector of each of the first candidates
/// (see [`super::score::chunk_vectors`]). Nothing changes at 0.
pub fn diversify(
    candidates: &mut [Candidate],
    vectors: &[Option<Vec<f32>>],
    hits: &[SectionHit],
    diversity: f32,
    budget: u32,
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
    // Picks fill twice the budget as pack fills the budget (each taken where it fits what is
    // left), and stop once no candidate of the pool would fit what is left.
    let smallest = candidates[..pool]
        .iter()
        .map(|c| u64::from(c.token_count))
        .min()
        .unwrap_or(0);
    let mut room = 2 * u64::from(budget);
    while room >= smallest {
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
        let tokens = u64::from(candidates[chosen].token_count);
        if tokens <= room {
            room -= tokens;
        }
        for i in (0..pool).filter(|&i| !taken[i]) {
            closest[i] = closest[i].max(similarity(chosen, i));
        }
    }
    order.extend((0..pool).filter(|&i| !taken[i]));
    let reordered: Vec<Candidate> = order.iter().map(|&i| candidates[i]).collect();
    candidates[..pool].copy_from_slice(&reordered);
}

/// The documents [`is_ambiguous`] compares: the best and the one this far down the ranking.
pub const AMBIGUOUS_DOCUMENTS: usize = 5;

/// Whether the candidates (sorted best first) leave the query's document open: the best chunk of
/// the [`AMBIGUOUS_DOCUMENTS`]-th best document scores within `gap` of the best chunk of all. A
/// query whose candidates come from fewer documents is never ambiguous.
pub fn is_ambiguous(candidates: &[Candidate], hits: &[SectionHit], gap: f32) -> bool {
    let Some(best) = candidates.first() else {
        return false;
    };
    let mut documents: [&str; AMBIGUOUS_DOCUMENTS] = [""; AMBIGUOUS_DOCUMENTS];
    let mut seen = 0;
    for candidate in candidates {
        let document = hits[candidate.hit_index as usize].doc_id.as_str();
        if documents[..seen].contains(&document) {
            continue;
        }
        documents[seen] = document;
        seen += 1;
        if seen == AMBIGUOUS_DOCUMENTS {
            // Sorted best first: this is the document's best chunk.
            return best.score - candidate.score < gap;
        }
    }
    false
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
        diversify(&mut off, &vectors, &hits, 0.0, u32::MAX);
        assert_eq!(starts(&off), [0, 10, 20, 30]);
        let mut diverse = scored.clone();
        diversify(&mut diverse, &vectors, &hits, 0.5, u32::MAX);
        assert_eq!(starts(&diverse), [0, 30, 10, 20]);
    }

    #[test]
    fn a_query_is_ambiguous_when_its_fifth_document_scores_close_to_its_best() {
        let hits: Vec<SectionHit> = ["a", "a", "b", "c", "d", "e", "f"]
            .into_iter()
            .map(hit)
            .collect();
        // Best first: a (three chunks of two sections), b, c, d, then e at `fifth` and f below.
        let ranked = |fifth: f32| {
            let mut scored = vec![
                candidate(0, 0, 2.0),
                candidate(1, 0, 1.9),
                candidate(2, 0, 1.8),
                candidate(3, 0, 1.7),
                candidate(0, 10, 1.65),
                candidate(4, 0, 1.6),
                candidate(5, 0, fifth),
                candidate(6, 0, fifth - 0.5),
            ];
            scored.sort_by(|x, y| y.score.total_cmp(&x.score));
            scored
        };
        assert!(is_ambiguous(&ranked(1.55), &hits, 0.5));
        // The gap is counted from e (the fifth document), not f or a second chunk of a.
        assert!(!is_ambiguous(&ranked(1.45), &hits, 0.5));
        assert!(!is_ambiguous(&ranked(1.55), &hits, 0.45));
        // Four documents in all: never ambiguous, however close their scores.
        let few = [
            candidate(0, 0, 1.0),
            candidate(2, 0, 1.0),
            candidate(3, 0, 1.0),
            candidate(4, 0, 1.0),
        ];
        assert!(!is_ambiguous(&few, &hits, 0.5));
        assert!(!is_ambiguous(&[], &hits, 0.5));
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
        diversify(&mut diverse, &vectors, &hits, 0.5, u32::MAX);
        assert_eq!(starts(&diverse), [0, 20, 10]);
        // A permutation: nothing lost, nothing repeated.
        let mut sorted = starts(&diverse);
        sorted.sort_unstable();
        assert_eq!(sorted, starts(&scored));
    }

    #[test]
    fn picks_stop_once_they_fill_twice_the_budget_as_pack_would() {
        let hits = vec![hit("a"), hit("b"), hit("c")];
        let mut scored = vec![
            candidate(0, 0, 1.0),
            candidate(0, 10, 0.9),
            candidate(0, 20, 0.8),
            candidate(1, 30, 0.5),
            candidate(2, 40, 0.3),
        ];
        let vectors = vec![None; scored.len()];
        let reordered = |candidates: &[Candidate], budget: u32| {
            let mut candidates = candidates.to_vec();
            diversify(&mut candidates, &vectors, &hits, 0.5, budget);
            starts(&candidates)
        };
        assert_eq!(reordered(&scored, u32::MAX), [0, 30, 40, 10, 20]);
        // Two picks of 3 tokens hold twice a budget of 3: the rest keep score order.
        assert_eq!(reordered(&scored, 3), [0, 30, 10, 20, 40]);
        // A pick larger than the budget will not be packed, so it does not count.
        scored[0].token_count = 50;
        assert_eq!(reordered(&scored, 3), [0, 30, 40, 10, 20]);
    }
}
