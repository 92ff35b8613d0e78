//! The search: every segment asked for `k` neighbours of its live slots (an exact scan of a
//! small one, else a graph walk), side by side when the CPU pool has threads to spare, and the
//! answers merged by score; and the metrics of its one wait, for the segment list.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Instant;

use rayon::prelude::*;

use super::segment::{Segment, Walk};
use super::{query_elements, DenseError, DenseIndex, StoredElement};
use crate::embed::l2_normalize;

/// How long searches waited for the segment list, the one lock they take (exported as
/// `lathe_dense_wait_seconds`): the writer holds it only to swap in a new list.
pub static SEARCH_WAIT_SECONDS: LazyLock<prometheus::Histogram> = LazyLock::new(|| {
    prometheus::Histogram::with_opts(
        prometheus::HistogramOpts::new(
            "dense_wait_seconds",
            "Time a dense search waited for the dense index before searching",
        )
        .buckets(vec![
            1e-6, 1e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 1e-1, 1.0,
        ]),
    )
    .expect("static metric")
});

/// Segments of at most this many slots are searched by scanning every vector instead of walking
/// the graph (see [`DenseIndex::search`]): at this size about as cheap, and exact — the same
/// neighbours on every replica, whatever order its graph was built in.
pub const EXHAUSTIVE_SEARCH_SLOTS: usize = 1024;

/// The longest of those waits since the process started (exported as
/// `lathe_dense_wait_max_seconds`): the histogram's buckets bound it, this names it.
pub static SEARCH_WAIT_MAX_SECONDS: LazyLock<prometheus::Gauge> = LazyLock::new(|| {
    prometheus::Gauge::new(
        "dense_wait_max_seconds",
        "Longest time a dense search waited for the dense index before searching",
    )
    .expect("static metric")
});

/// [`SEARCH_WAIT_MAX_SECONDS`] in nanoseconds, for a lock-free maximum.
static SEARCH_WAIT_MAX_NANOS: AtomicU64 = AtomicU64::new(0);

/// The `k` live vectors of `segment` most similar to the unit vector `unit` that `filter`
/// accepts, as (key, similarity): an exact scan of a small segment, else a graph walk with a
/// candidate list of `ef`.
///
/// A segment read from its files is walked in its flat form ([`super::flat`]): the plain walk,
/// what is dead or rejected dropped afterwards, and when fewer than `k` are left, an exact scan
/// of its vectors (rare: a segment is rebuilt once a quarter of it is dead).
///
/// A segment built here is walked by hnsw_rs: its plain search, its whole candidate list returned, and what is dead or
/// rejected is dropped afterwards. Its filtered search is no such walk with a check: once the
/// plain search would stop, it walks on while any candidate is left and checks the filter over the
/// whole list at every step: on a graph of 320k vectors, two to three times the plain walk's time
/// at the same `ef`, and a third more for the same recall (docs/notebook/benchmarks-notebook.md, "A plain graph walk").
/// Only when the plain walk leaves fewer than `k` (more than `ef - k` of its candidates dead or
/// rejected) is the filtered search run, so a segment full of tombstones still answers in full.
fn search_segment(
    segment: &Segment,
    unit: &[f32],
    query: &[StoredElement],
    k: usize,
    ef: usize,
    filter: &(dyn Fn(u64) -> bool + Sync),
) -> Vec<(u64, f32)> {
    let accept = |slot: &usize| segment.is_live(*slot) && filter(segment.key(*slot));
    let keyed = |found: Vec<(usize, f32)>| -> Vec<(u64, f32)> {
        found
            .into_iter()
            .map(|(slot, similarity)| (segment.key(slot), similarity))
            .collect()
    };
    if let Some(nearest) = segment.nearest(unit, k, &|slot| accept(&slot)) {
        return keyed(nearest);
    }
    let graph = match &segment.walk {
        Walk::Hnsw(graph) => graph,
        Walk::Flat(flat) => {
            let mut plain = flat.search(unit, ef);
            plain.retain(|(slot, _)| accept(slot));
            plain.truncate(k);
            if plain.len() >= k || plain.len() >= segment.live_count() {
                return keyed(plain);
            }
            return keyed(flat.scan(unit, k, &|slot| accept(&slot)));
        }
    };
    let found = |neighbours: &[hnsw_rs::prelude::Neighbour]| -> Vec<(u64, f32)> {
        neighbours
            .iter()
            .filter(|neighbour| accept(&neighbour.d_id))
            .take(k)
            .map(|neighbour| (segment.key(neighbour.d_id), 1.0 - neighbour.distance))
            .collect()
    };
    let plain = found(&graph.search(query, ef, ef));
    if plain.len() >= k || plain.len() >= segment.live_count() {
        return plain;
    }
    found(&graph.search_filter(query, k, ef, Some(&accept)))
}

fn observe_search_wait(waited: std::time::Duration) {
    SEARCH_WAIT_SECONDS.observe(waited.as_secs_f64());
    let nanos = waited.as_nanos().min(u128::from(u64::MAX)) as u64;
    if nanos > SEARCH_WAIT_MAX_NANOS.fetch_max(nanos, Ordering::AcqRel) {
        SEARCH_WAIT_MAX_SECONDS.set(nanos as f64 / 1e9);
    }
}

impl DenseIndex {
    /// The `k` live vectors most similar to `query` (cosine) among ids that `filter` accepts,
    /// best first: `k` from each segment (by an exact scan for segments of at most
    /// [`EXHAUSTIVE_SEARCH_SLOTS`] slots), merged. Fewer come back when the filter rejects much.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filter: &(dyn Fn(u64) -> bool + Sync),
    ) -> Result<Vec<(u64, f32)>, DenseError> {
        self.check_dimension(query)?;
        if k == 0 || self.is_empty() {
            return Ok(Vec::new());
        }
        let mut unit = query.to_vec();
        l2_normalize(&mut unit);
        let elements = query_elements(&unit);
        let ef = self.config.ef_search.max(k);
        let waiting = Instant::now();
        let segments = self.segments();
        observe_search_wait(waiting.elapsed());
        // Segments are searched side by side when the CPU pool has threads to spare: a graph
        // walk waits on memory more than on arithmetic, so two walks on two cores take little
        // longer than one.
        let mut hits: Vec<(u64, f32)> = segments
            .par_iter()
            .with_min_len(crate::cpu_pool::min_split_len())
            .filter(|segment| segment.live_count() > 0)
            .flat_map_iter(|segment| search_segment(segment, &unit, elements, k, ef, filter))
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        // A key being replaced can be live in two segments for an instant: keep its best.
        let mut seen = HashSet::with_capacity(hits.len());
        hits.retain(|(id, _)| seen.insert(*id));
        hits.truncate(k);
        Ok(hits)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{
        as_stored, exact_top, persisted_index, random_vectors, reopen, small_index,
    };
    use super::super::DenseIndexConfig;
    use super::*;
    use crate::embed::dot;

    #[test]
    fn finds_the_exact_neighbours_of_a_small_set() {
        let vectors = random_vectors(300, 32, 1);
        let index = small_index(&vectors);
        for query_id in [0usize, 17, 123, 299] {
            let hits = index
                .search(&vectors[query_id], 5, &|_| true)
                .expect("dim ok");
            assert_eq!(hits[0].0, query_id as u64);
            // Itself, up to the codes' rounding (a step of 1/127 of the largest value).
            assert!((hits[0].1 - 1.0).abs() < 1e-3, "{}", hits[0].1);
            let ids: Vec<u64> = hits.iter().map(|h| h.0).collect();
            assert_eq!(ids, exact_top(&vectors, &vectors[query_id], 5, &|_| false));
        }
    }

    /// A graph walk (a segment past the exact scan's size) whose nearest candidates are nearly
    /// all dead or rejected still answers `k` live, accepted neighbours: the plain walk's list
    /// runs short of them, and the filtered walk takes over.
    #[test]
    fn a_walk_among_mostly_dead_neighbours_still_answers_in_full() {
        let vectors = random_vectors(3 * EXHAUSTIVE_SEARCH_SLOTS, 16, 7);
        let mut config = DenseIndexConfig::new(16);
        config.ef_search = 32;
        let index = DenseIndex::new(config).expect("valid config");
        for (id, vector) in vectors.iter().enumerate() {
            index.insert(id as u64, vector).expect("right dimension");
        }
        let query = &vectors[0];
        // Many more dead than a candidate list of 32 holds, all of them the query's nearest.
        let dead = exact_top(&vectors, &as_stored(query), 200, &|_| false);
        for id in &dead {
            assert!(index.delete(*id));
        }
        for (accept, name) in [
            (&(|_: u64| true) as &(dyn Fn(u64) -> bool + Sync), "all"),
            (&|id: u64| id.is_multiple_of(2), "even"),
        ] {
            let hits = index.search(query, 10, accept).expect("dim ok");
            assert_eq!(hits.len(), 10, "{name}: {hits:?}");
            assert!(
                hits.iter().all(|(id, _)| !dead.contains(id) && accept(*id)),
                "{name}: {hits:?}"
            );
        }
    }

    #[test]
    fn small_segments_answer_exactly_whatever_order_they_were_built_in() {
        // Replicas insert the same vectors in batches of their own, on the rayon pool: graphs
        // differ, answers must not. 1,000 vectors in 64 dimensions in clusters of 100 around 10
        // centres (as sections of one template or topic are) are what an approximate walk gets
        // wrong: without the scan this test fails.
        let centres = random_vectors(10, 64, 7);
        let noise = random_vectors(1_000, 64, 8);
        let vectors: Vec<Vec<f32>> = noise
            .iter()
            .enumerate()
            .map(|(i, noise)| {
                let centre = &centres[i % 10];
                let mut vector: Vec<f32> =
                    centre.iter().zip(noise).map(|(c, n)| c + 0.2 * n).collect();
                l2_normalize(&mut vector);
                vector
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let seal = EXHAUSTIVE_SEARCH_SLOTS - 100;
        let one_batch = persisted_index(&dir.path().join("one"), &vectors, seal);
        let config = DenseIndexConfig::new(64);
        let reversed = DenseIndex::new(config).unwrap();
        for chunk in vectors
            .iter()
            .enumerate()
            .rev()
            .collect::<Vec<_>>()
            .chunks(37)
        {
            reversed
                .insert_many(chunk.iter().map(|(id, v)| (*id as u64, v.as_slice())))
                .unwrap();
        }
        one_batch.seal();
        drop(one_batch);
        let (reloaded, missing) = reopen(&dir.path().join("one"), 64, seal, 0..1_000);
        assert!(missing.is_empty(), "every vector is in a sealed segment");
        let skip_odd = |id: u64| id % 2 == 1;
        let close = |got: &[(u64, f32)], wanted: Vec<u64>, query: &[f32]| {
            // Exact: the i-th similarity is the i-th best (ids may swap only on ties).
            let mut unit = query.to_vec();
            l2_normalize(&mut unit);
            for (hit, id) in got.iter().zip(&wanted) {
                assert!(
                    (hit.1 - dot(&as_stored(&vectors[*id as usize]), &unit)).abs() < 1e-5,
                    "{got:?} vs {wanted:?}"
                );
            }
            assert_eq!(got.len(), wanted.len());
        };
        for query in centres.iter().chain(&random_vectors(30, 64, 99)) {
            let query = query.as_slice();
            let built = reversed.search(query, 10, &|_| true).unwrap();
            // The same answer, bit for bit, from graphs built in other orders.
            assert_eq!(built, reloaded.search(query, 10, &|_| true).unwrap());
            close(&built, exact_top(&vectors, query, 10, &|_| false), query);
            let accept_even = |id: u64| !skip_odd(id);
            let even = reloaded.search(query, 10, &accept_even).unwrap();
            assert_eq!(even, reversed.search(query, 10, &accept_even).unwrap());
            assert!(even.iter().all(|hit| !skip_odd(hit.0)));
            close(&even, exact_top(&vectors, query, 10, &skip_odd), query);
        }
    }
}
