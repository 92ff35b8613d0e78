//! A sealed segment's graph as flat arrays, and the walk over it.
//!
//! hnsw_rs builds a graph and writes and reads its files; its in-memory form suits inserts: each
//! point an `Arc` behind a lock, each neighbour an `Arc` of its own (about 1.5 KB a vector at
//! 16 connections), and a search that allocates two `Arc`s a candidate and hashes every visited
//! id. A segment that takes no more inserts (loaded from its files, or a merge read back) is
//! searched many times and changed never, so it keeps only what a search reads: its codes in
//! slot order, each layer's neighbour lists as `u32` slots, and the entry point — about
//! `dim + 8 × (2M + 1)` bytes a vector. The walk is HNSW's own (a greedy descent through the
//! upper layers, a beam of `ef` in layer 0) with a visited table and heaps reused by each thread,
//! so a search allocates only its answer.

use std::cell::RefCell;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::element::unit_similarity;
use super::segment::Graph;
use super::StoredElement;

/// One layer's neighbour lists: those of the `i`-th member are `targets[spans[i]]`.
#[derive(Debug, Default)]
pub(super) struct Adjacency {
    /// (start, length) in `targets`.
    pub(super) spans: Box<[(u32, u32)]>,
    pub(super) targets: Box<[u32]>,
}

impl Adjacency {
    fn of(&self, member: usize) -> &[u32] {
        let (start, length) = self.spans[member];
        &self.targets[start as usize..(start + length) as usize]
    }
}

/// A layer above the lowest: its members (sorted slots) and their neighbour lists.
#[derive(Debug, Default)]
pub(super) struct UpperLayer {
    pub(super) members: Box<[u32]>,
    pub(super) adjacency: Adjacency,
}

impl UpperLayer {
    fn neighbours(&self, slot: u32) -> &[u32] {
        match self.members.binary_search(&slot) {
            Ok(member) => self.adjacency.of(member),
            Err(_) => &[],
        }
    }
}

/// An upper layer as [`FlatGraph::from_graph`] meets its members, in any order.
#[derive(Default)]
struct UpperBuilder {
    /// (slot, start in `targets`, length).
    members: Vec<(u32, u32, u32)>,
    targets: Vec<u32>,
}

impl UpperBuilder {
    fn add(&mut self, slot: u32, targets: impl Iterator<Item = u32>) {
        let start = self.targets.len() as u32;
        self.targets.extend(targets);
        self.members
            .push((slot, start, self.targets.len() as u32 - start));
    }

    fn finish(mut self) -> UpperLayer {
        self.members.sort_unstable_by_key(|&(slot, _, _)| slot);
        UpperLayer {
            members: self.members.iter().map(|&(slot, _, _)| slot).collect(),
            adjacency: Adjacency {
                spans: self
                    .members
                    .iter()
                    .map(|&(_, start, len)| (start, len))
                    .collect(),
                targets: self.targets.into_boxed_slice(),
            },
        }
    }
}

/// The graph of a segment that takes no more inserts, read from hnsw_rs's (see the module doc).
#[derive(Debug)]
pub struct FlatGraph {
    pub(super) dim: usize,
    /// The codes of every slot, `dim` each, in slot order (zeros where the graph has no point).
    pub(super) codes: Box<[StoredElement]>,
    /// Whether the graph holds a point for each slot.
    pub(super) present: Box<[bool]>,
    /// Layer 0, indexed by slot.
    pub(super) layer0: Adjacency,
    /// Layers 1 and up, the lowest first.
    pub(super) upper: Vec<UpperLayer>,
    /// Where every walk starts: a point of the top layer.
    pub(super) entry: Option<u32>,
}

/// A candidate of a walk: its similarity to the query, and its slot. Ordered by similarity,
/// equal ones by the lower slot first, so a walk is the same on every run.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scored(f32, u32);

impl Eq for Scored {}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What a walk needs besides the graph, kept by each thread between walks.
#[derive(Default)]
struct Scratch {
    /// `visited[slot] == stamp` marks a slot seen by the current walk.
    visited: Vec<u32>,
    stamp: u32,
    /// The candidates to expand, best first.
    candidates: BinaryHeap<Scored>,
    /// The best `ef` found, worst first.
    found: BinaryHeap<Reverse<Scored>>,
}

impl Scratch {
    /// Starts a walk over `slots` slots: nothing visited, both heaps empty.
    fn begin(&mut self, slots: usize) {
        if self.visited.len() < slots {
            self.visited.resize(slots, 0);
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.visited.fill(0);
            self.stamp = 1;
        }
        self.candidates.clear();
        self.found.clear();
    }

    /// Marks `slot` visited; false when it already was.
    fn visit(&mut self, slot: u32) -> bool {
        let seen = &mut self.visited[slot as usize];
        if *seen == self.stamp {
            return false;
        }
        *seen = self.stamp;
        true
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl FlatGraph {
    /// The flat form of `graph`, whose points are the slots below `slots` (hnsw_rs's data id is
    /// the slot); a point at or past `slots`, or a neighbour that is no point, is left out.
    pub fn from_graph(graph: &Graph, slots: usize, dim: usize) -> Self {
        let mut codes = vec![0; slots * dim].into_boxed_slice();
        let mut present = vec![false; slots].into_boxed_slice();
        let mut layer0_spans = vec![(0u32, 0u32); slots];
        let mut layer0_targets: Vec<u32> =
            Vec::with_capacity(slots * 2 * graph.get_max_nb_connection() as usize);
        let mut upper: Vec<UpperBuilder> = Vec::new();
        let mut entry: Option<(u8, u32)> = None;
        if graph.get_nb_point() > 0 {
            for point in graph.get_point_indexation() {
                let slot = point.get_origin_id();
                let values = point.get_v();
                if slot >= slots || values.len() != dim {
                    continue;
                }
                let slot32 = slot as u32;
                codes[slot * dim..(slot + 1) * dim].copy_from_slice(values);
                present[slot] = true;
                let level = point.get_point_id().0;
                // The first point of the highest layer, as hnsw_rs takes the first to reach it.
                if entry.is_none_or(|(top, _)| level > top) {
                    entry = Some((level, slot32));
                }
                let in_range = |n: &hnsw_rs::prelude::Neighbour| n.d_id < slots;
                // hnsw_rs keeps a list for every layer the graph may have; the point is in its
                // own level's and those below.
                let neighbourhood = point.get_neighborhood_id();
                for (layer, neighbours) in neighbourhood
                    .into_iter()
                    .take(level as usize + 1)
                    .enumerate()
                {
                    let targets = neighbours
                        .iter()
                        .filter(|n| in_range(n))
                        .map(|n| n.d_id as u32);
                    if layer == 0 {
                        let start = layer0_targets.len() as u32;
                        layer0_targets.extend(targets);
                        layer0_spans[slot] = (start, layer0_targets.len() as u32 - start);
                    } else {
                        if upper.len() < layer {
                            upper.resize_with(layer, Default::default);
                        }
                        upper[layer - 1].add(slot32, targets);
                    }
                }
            }
        }
        let upper = upper.into_iter().map(UpperBuilder::finish).collect();
        Self {
            dim,
            codes,
            present,
            layer0: Adjacency {
                spans: layer0_spans.into_boxed_slice(),
                targets: layer0_targets.into_boxed_slice(),
            },
            upper,
            entry: entry.map(|(_, slot)| slot),
        }
    }

    /// The dimension of its vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Slots the graph was built for.
    pub fn slots(&self) -> usize {
        self.present.len()
    }

    /// The codes of `slot`, if the graph holds it.
    pub fn codes(&self, slot: usize) -> Option<&[StoredElement]> {
        self.present
            .get(slot)
            .copied()
            .unwrap_or(false)
            .then(|| &self.codes[slot * self.dim..(slot + 1) * self.dim])
    }

    /// Asks the CPU to bring `slot`'s codes into its cache: a walk reads the codes of a
    /// candidate's neighbours, which lie anywhere in the segment, and a read the CPU was told of
    /// beforehand no longer waits on memory.
    #[inline]
    fn prefetch(&self, slot: u32) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let start = slot as usize * self.dim;
            if let Some(codes) = self.codes.get(start..start + self.dim) {
                for line in codes.chunks(64) {
                    // SAFETY: SSE is part of x86-64; a prefetch reads nothing and cannot fault,
                    // and the address lies within `codes`.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
                }
            }
        }
    }

    fn similarity(&self, unit: &[f32], slot: u32) -> f32 {
        let start = slot as usize * self.dim;
        unit_similarity(unit, &self.codes[start..start + self.dim])
    }

    /// The `ef` slots a walk finds nearest to the unit vector `unit`, best first, as (slot,
    /// cosine): dead or not, as hnsw_rs's plain search answers.
    pub fn search(&self, unit: &[f32], ef: usize) -> Vec<(usize, f32)> {
        let Some(mut at) = self.entry else {
            return Vec::new();
        };
        let ef = ef.max(1);
        let mut best = self.similarity(unit, at);
        // Greedy through the upper layers, the top first: to the nearest neighbour while one
        // is nearer.
        for layer in self.upper.iter().rev() {
            loop {
                let mut moved = false;
                for &next in layer.neighbours(at) {
                    let similarity = self.similarity(unit, next);
                    if similarity > best {
                        (best, at, moved) = (similarity, next, true);
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            scratch.begin(self.slots());
            scratch.visit(at);
            scratch.candidates.push(Scored(best, at));
            scratch.found.push(Reverse(Scored(best, at)));
            while let Some(Scored(similarity, slot)) = scratch.candidates.pop() {
                let worst = scratch.found.peek().map_or(f32::MIN, |w| w.0 .0);
                if scratch.found.len() >= ef && similarity < worst {
                    break;
                }
                let neighbours = self.layer0.of(slot as usize);
                for &next in neighbours {
                    self.prefetch(next);
                }
                for &next in neighbours {
                    if !scratch.visit(next) {
                        continue;
                    }
                    let similarity = self.similarity(unit, next);
                    let worst = scratch.found.peek().map_or(f32::MIN, |w| w.0 .0);
                    if scratch.found.len() < ef || similarity > worst {
                        scratch.candidates.push(Scored(similarity, next));
                        scratch.found.push(Reverse(Scored(similarity, next)));
                        if scratch.found.len() > ef {
                            scratch.found.pop();
                        }
                    }
                }
            }
            let mut found: Vec<(usize, f32)> = scratch
                .found
                .drain()
                .map(|Reverse(Scored(similarity, slot))| (slot as usize, similarity))
                .collect();
            found.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            found
        })
    }

    /// The `k` slots `accept`ed nearest to `unit` by a scan of every vector the graph holds,
    /// best first, as (slot, cosine): exact, for when a walk's list holds too few accepted.
    pub fn scan(
        &self,
        unit: &[f32],
        k: usize,
        accept: &dyn Fn(usize) -> bool,
    ) -> Vec<(usize, f32)> {
        let mut scored: Vec<(usize, f32)> = (0..self.slots())
            .filter(|&slot| self.present[slot] && accept(slot))
            .map(|slot| (slot, self.similarity(unit, slot as u32)))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        scored
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use hnsw_rs::prelude::Hnsw;

    use super::super::test_util::{exact_top, hnsw_graph, random_vectors};
    use super::super::{to_stored, UnitDotDistance};
    use super::*;

    /// hnsw_rs's graph of `vectors` (slot = position) as a segment builds it, and its flat form.
    fn graphs(vectors: &[Vec<f32>]) -> (Graph, FlatGraph) {
        let graph = hnsw_graph(vectors);
        let flat = FlatGraph::from_graph(&graph, vectors.len(), vectors[0].len());
        (graph, flat)
    }

    fn recall(found: &[Vec<u64>], exact: &[Vec<u64>]) -> f64 {
        let hits: usize = found
            .iter()
            .zip(exact)
            .map(|(found, exact)| found.iter().filter(|id| exact.contains(id)).count())
            .sum();
        hits as f64 / exact.iter().map(Vec::len).sum::<usize>() as f64
    }

    #[test]
    fn the_flat_form_holds_every_slot_its_codes_and_its_links() {
        let vectors = random_vectors(1500, 24, 3);
        let (graph, flat) = graphs(&vectors);
        assert_eq!(flat.slots(), 1500);
        for (slot, vector) in vectors.iter().enumerate() {
            assert_eq!(flat.codes(slot), Some(to_stored(vector).as_slice()));
        }
        assert_eq!(flat.codes(1500), None);
        // Every layer-0 link of hnsw_rs's graph, and no other.
        for point in graph.get_point_indexation() {
            let slot = point.get_origin_id();
            let links: HashSet<u32> = point.get_neighborhood_id()[0]
                .iter()
                .map(|n| n.d_id as u32)
                .collect();
            let flat_links: HashSet<u32> = flat.layer0.of(slot).iter().copied().collect();
            assert_eq!(flat_links, links, "slot {slot}");
        }
        let entry = flat.entry.expect("a graph with points has an entry") as usize;
        let top = graph.get_max_level_observed() as usize;
        assert_eq!(flat.upper.len(), top);
        if top > 0 {
            assert!(flat.upper[top - 1].members.contains(&(entry as u32)));
        }
    }

    #[test]
    fn the_walk_finds_each_vector_and_the_exact_neighbours_as_well_as_hnsw_rs_does() {
        let vectors = random_vectors(3000, 32, 5);
        let (graph, flat) = graphs(&vectors);
        let queries = random_vectors(60, 32, 77);
        let (k, ef) = (10, 40);
        let exact: Vec<Vec<u64>> = queries
            .iter()
            .map(|q| exact_top(&vectors, q, k, &|_| false))
            .collect();
        let flat_found: Vec<Vec<u64>> = queries
            .iter()
            .map(|q| {
                let found = flat.search(q, ef);
                assert!(found.len() <= ef && found.windows(2).all(|w| w[0].1 >= w[1].1));
                found.iter().take(k).map(|(slot, _)| *slot as u64).collect()
            })
            .collect();
        let hnsw_found: Vec<Vec<u64>> = queries
            .iter()
            .map(|q| {
                let codes = super::super::query_elements(q);
                let found = graph.search(codes, k, ef);
                found.iter().map(|n| n.d_id as u64).collect()
            })
            .collect();
        let (flat_recall, hnsw_recall) = (recall(&flat_found, &exact), recall(&hnsw_found, &exact));
        assert!(flat_recall >= 0.9, "flat {flat_recall}");
        assert!(
            flat_recall >= hnsw_recall - 0.02,
            "flat {flat_recall}, hnsw_rs {hnsw_recall}"
        );
        // Every stored vector is its own nearest, with its cosine.
        for (slot, vector) in vectors.iter().enumerate().step_by(13) {
            let found = flat.search(vector, 8);
            assert_eq!(found[0].0, slot);
            assert!((found[0].1 - 1.0).abs() < 1e-2, "{}", found[0].1);
        }
    }

    #[test]
    fn walks_agree_whatever_came_before_on_the_thread() {
        let small = graphs(&random_vectors(300, 16, 1)).1;
        let large = graphs(&random_vectors(2000, 16, 2)).1;
        let query = &random_vectors(1, 16, 9)[0];
        let first = large.search(query, 30);
        // A walk of another graph, then the visited stamps about to wrap around.
        small.search(query, 30);
        SCRATCH.with(|scratch| scratch.borrow_mut().stamp = u32::MAX - 1);
        for _ in 0..3 {
            assert_eq!(large.search(query, 30), first);
        }
    }

    #[test]
    fn the_scan_is_exact_over_the_accepted_slots() {
        let vectors = random_vectors(500, 16, 4);
        let flat = graphs(&vectors).1;
        let query = &random_vectors(1, 16, 11)[0];
        let odd = |slot: usize| slot % 2 == 1;
        let scanned: Vec<u64> = flat
            .scan(query, 7, &odd)
            .iter()
            .map(|(slot, _)| *slot as u64)
            .collect();
        assert_eq!(scanned, exact_top(&vectors, query, 7, &|id| id % 2 == 0));
    }

    #[test]
    fn an_empty_graph_finds_nothing() {
        let graph: Graph = Hnsw::new(16, 10, 16, 100, UnitDotDistance);
        let flat = FlatGraph::from_graph(&graph, 10, 8);
        assert!(flat.search(&[0.5; 8], 5).is_empty());
        assert!(flat.scan(&[0.5; 8], 5, &|_| true).is_empty());
        assert_eq!(flat.codes(3), None);
    }
}
