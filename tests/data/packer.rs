//! Packs scored chunks into a caller's token budget.

use std::cmp::Ordering;

/// One candidate chunk with its score.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub section: u32,
    pub start: u32,
    pub end: u32,
    pub tokens: u32,
    pub score: f32,
}

/// Picks the best candidates that fit `budget` tokens, best first.
pub fn pack(candidates: &mut [Candidate], budget: u32, out: &mut Vec<Candidate>) {
    out.clear();
    candidates.sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap_or(Ordering::Equal));
    let mut used = 0u32;
    for candidate in candidates.iter() {
        if used + candidate.tokens > budget {
            continue;
        }
        used += candidate.tokens;
        out.push(*candidate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_exceeds_the_budget() {
        let mut candidates = vec![
            Candidate { section: 0, start: 0, end: 10, tokens: 5, score: 0.9 },
            Candidate { section: 0, start: 10, end: 20, tokens: 7, score: 0.8 },
            Candidate { section: 1, start: 0, end: 4, tokens: 2, score: 0.1 },
        ];
        let mut out = Vec::new();
        pack(&mut candidates, 8, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().map(|c| c.tokens).sum::<u32>() <= 8);
    }
}
