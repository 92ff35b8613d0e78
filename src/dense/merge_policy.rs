//! The merge policy: which sealed segments to merge now, from what each holds (its size and its
//! dead share) and the settings alone. It knows nothing of graphs, files or locks; `merge` asks
//! it and does the work.

use super::DenseIndexConfig;

/// More sealed segments than this and the smallest are merged.
const MAX_SEALED_SEGMENTS: usize = 8;
/// How many of the smallest segments one merge past [`MAX_SEALED_SEGMENTS`] takes.
const TIERED_MERGE_WIDTH: usize = 4;
/// Segments of one tier are merged once there are this many: each tier's segments hold this
/// many times the vectors of the tier below, so a collection of `n` vectors keeps at most
/// `(factor - 1)` segments per tier, about `3 log4(n / seal_vectors)` in all, and each vector is
/// rebuilt into a graph about `log4(n / seal_vectors)` times over its life.
pub const TIER_MERGE_FACTOR: usize = 4;

/// The tier of a segment of `live` vectors: 0 up to `seal_vectors` (a sealed live segment), then
/// the least `t` with `live <= seal_vectors * TIER_MERGE_FACTOR^t`.
fn tier(live: usize, seal_vectors: usize) -> usize {
    let mut tier = 0;
    let mut bound = seal_vectors.max(1);
    while live > bound {
        bound = bound.saturating_mul(TIER_MERGE_FACTOR);
        tier += 1;
    }
    tier
}

/// What the policy knows of a sealed segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct SegmentStats {
    pub(super) id: u64,
    /// Live vectors.
    pub(super) live: usize,
    /// Share of its slots that are tombstones.
    pub(super) dead_share: f32,
}

/// The sealed segments (`sealed`, oldest first) worth merging now, if any: those past
/// `rebuild_dead_share` dead; else the segments of the lowest tier holding
/// [`TIER_MERGE_FACTOR`] or more (see [`tier`]), so that segments grow by that factor (a search
/// walks one graph per segment, and one large graph costs far less than many small ones); else,
/// past [`MAX_SEALED_SEGMENTS`], the smallest. Segments of more than a `TIER_MERGE_FACTOR`th of
/// `max_segment_vectors` merge no more.
pub(super) fn choose(sealed: &[SegmentStats], config: &DenseIndexConfig) -> Option<Vec<u64>> {
    let dead: Vec<u64> = sealed
        .iter()
        .filter(|s| s.dead_share > config.rebuild_dead_share)
        .map(|s| s.id)
        .collect();
    if !dead.is_empty() {
        return Some(dead);
    }
    let seal = config.seal_vectors;
    // A segment a merge of `TIER_MERGE_FACTOR` could not take without passing the cap is
    // left out of both rules below: it is as large as segments grow.
    let cap = config.max_segment_vectors;
    let mergeable: Vec<&SegmentStats> = sealed
        .iter()
        .filter(|s| cap == 0 || s.live <= cap / TIER_MERGE_FACTOR)
        .collect();
    let mut tiers: Vec<usize> = mergeable.iter().map(|s| tier(s.live, seal)).collect();
    tiers.sort_unstable();
    let full_tier = tiers
        .chunk_by(|a, b| a == b)
        .find(|same| same.len() >= TIER_MERGE_FACTOR)
        .map(|same| same[0]);
    if let Some(full_tier) = full_tier {
        // Four at a time, the oldest first: an open that replayed many segments (a damaged
        // manifest, an older format) merges them up tier by tier, into the layout writes
        // build, not into one graph of everything.
        return Some(
            mergeable
                .iter()
                .filter(|s| tier(s.live, seal) == full_tier)
                .take(TIER_MERGE_FACTOR)
                .map(|s| s.id)
                .collect(),
        );
    }
    if mergeable.len() > MAX_SEALED_SEGMENTS {
        let mut by_size = mergeable;
        by_size.sort_by_key(|s| s.live);
        return Some(
            by_size
                .into_iter()
                .take(TIERED_MERGE_WIDTH)
                .map(|s| s.id)
                .collect(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::test_util::{
        find_each, insert_missing_and_find_each, persisted_index, random_vectors,
    };
    use super::super::DenseIndex;
    use super::*;

    #[test]
    fn tiers_grow_by_the_merge_factor() {
        let seal = 100;
        assert_eq!(tier(0, seal), 0);
        assert_eq!(tier(13, seal), 0);
        assert_eq!(tier(100, seal), 0);
        assert_eq!(tier(101, seal), 1);
        assert_eq!(tier(400, seal), 1);
        assert_eq!(tier(401, seal), 2);
        assert_eq!(tier(usize::MAX, 1), 32);
    }

    #[test]
    fn many_segments_of_one_tier_merge_four_at_a_time_oldest_first() {
        let vectors = random_vectors(900, 16, 13);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 100);
        assert_eq!(index.sealed_segments().len(), 9);
        for expected in [vec![0, 1, 2, 3], vec![4, 5, 6, 7]] {
            let chosen = index.segments_to_merge().expect("a full tier");
            assert_eq!(chosen, expected);
            assert!(index.try_start_merge());
            index.merge_segments(&chosen).expect("merges");
        }
        // Two of tier 1 and one of tier 0: the layout writes would have built.
        assert_eq!(sealed_sizes(&index), [100, 400, 400]);
        assert!(index.segments_to_merge().is_none());
        insert_missing_and_find_each(&index, &[], &vectors);
    }

    /// Runs every merge `segments_to_merge` asks for; the sizes of the segments left, sorted.
    fn merge_until_done(index: &DenseIndex) -> Vec<usize> {
        while let Some(chosen) = index.segments_to_merge() {
            assert!(index.try_start_merge());
            index.merge_segments(&chosen).expect("merges");
        }
        sealed_sizes(index)
    }

    /// The live vectors of each sealed segment, sorted.
    fn sealed_sizes(index: &DenseIndex) -> Vec<usize> {
        let mut sizes: Vec<usize> = index
            .sealed_segments()
            .iter()
            .map(|s| s.live_count())
            .collect();
        sizes.sort_unstable();
        sizes
    }

    #[test]
    fn merges_stop_at_max_segment_vectors() {
        let vectors = random_vectors(1_700, 16, 17);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = DenseIndexConfig::new(16);
        config.seal_vectors = 100;
        config.max_segment_vectors = 400;
        let (index, _) = DenseIndex::open(dir.path(), config, &HashSet::new()).expect("opens");
        index
            .insert_many((vectors.iter().enumerate()).map(|(id, v)| (id as u64, v.as_slice())))
            .expect("inserts");
        assert_eq!(index.sealed_segments().len(), 17);
        // Four of 400 would make 1,600, past the cap; without it they merge (below).
        assert_eq!(merge_until_done(&index), [100, 400, 400, 400, 400]);
        insert_missing_and_find_each(&index, &[], &vectors);

        let uncapped = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(uncapped.path(), &vectors, 100);
        assert_eq!(merge_until_done(&index), [100, 1_600]);
    }

    #[test]
    fn a_full_tier_is_merged_into_one_segment_of_the_next() {
        let vectors = random_vectors(700, 16, 11);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors[..300], 100);
        assert!(index.segments_to_merge().is_none(), "3 segments of tier 0");
        index
            .insert_many((300..400).map(|id| (id as u64, vectors[id].as_slice())))
            .expect("inserts");
        let chosen = index.segments_to_merge().expect("a full tier");
        assert_eq!(chosen, vec![0, 1, 2, 3]);
        assert!(index.try_start_merge());
        index.merge_segments(&chosen).expect("merges");
        assert_eq!(index.sealed_segments().len(), 1);
        // Three more of tier 0 beside the merged one of tier 1: nothing to merge.
        index
            .insert_many((400..700).map(|id| (id as u64, vectors[id].as_slice())))
            .expect("inserts");
        assert_eq!(index.sealed_segments().len(), 4);
        assert!(index.segments_to_merge().is_none());
        find_each(&index, &vectors);
    }
}
