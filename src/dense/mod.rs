//! Dense vector index: hnsw graphs (hnsw_rs) over vectors held as int8 codes (see `element`),
//! in segments, with tombstones.
//!
//! # Layout
//! A [`DenseIndex`] is a list of **sealed** segments and one **live** segment (the last), each an
//! hnsw graph of a fixed number of slots (see `segment`). New vectors go into the live segment;
//! once it is full (`seal_vectors`, or at a clean shutdown) it is sealed: its graph is dumped
//! with hnsw_rs's `hnswio` under the index's folder and listed in `manifest.json` (see
//! `persist`), and an empty live segment takes its place. A search asks every segment for `k`
//! neighbours (side by side when the CPU pool is idle) and merges them by score.
//!
//! hnsw_rs cannot delete a point: a deleted or replaced key leaves a dead slot that searches
//! filter out. A segment whose dead share passes `rebuild_dead_share`, four segments of one size
//! tier (so that segments grow fourfold and stay few), or the smallest ones when there are many,
//! are rebuilt from their live vectors by [`DenseIndex::merge_segments`] (on a
//! thread of the caller's choosing, never under a lock a search takes) and swapped in.
//!
//! Concurrency: searches take no lock but the one around the segment list, for the time of an
//! `Arc` clone. The writer side (inserts, deletes, seals, the swap at the end of a merge) is
//! serialised by a mutex that searches never take; a slot becomes visible by an atomic store
//! once its vector is in the graph.
//!
//! Durability: the manifest is not the truth about which keys are live; the caller's store is
//! (tantivy, for a collection). [`DenseIndex::open`] loads the sealed segments, marks live the
//! slots of keys the caller says are live and returns the live keys found in no segment, for
//! the caller to insert again (those written after the last seal).

mod element;
mod persist;
mod segment;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use rayon::prelude::*;

use crate::embed::l2_normalize;
pub use element::{from_stored, query_elements, to_stored, StoredElement, UnitDotDistance};
use persist::{Manifest, SegmentEntry};
use segment::Segment;

/// Largest allowed `seal_vectors`: a live segment preallocates its slot tables.
pub const MAX_SEAL_VECTORS: usize = 10_000_000;
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
/// The walk is hnsw_rs's plain search, its whole candidate list returned, and what is dead or
/// rejected is dropped afterwards. Its filtered search is no such walk with a check: once the
/// plain search would stop, it walks on while any candidate is left and checks the filter over the
/// whole list at every step: on a graph of 320k vectors, two to three times the plain walk's time
/// at the same `ef`, and a third more for the same recall (BENCHMARKS.md, "A plain graph walk").
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
    if let Some(nearest) = segment.nearest(unit, k, &|slot| accept(&slot)) {
        return nearest
            .into_iter()
            .map(|(slot, similarity)| (segment.key(slot), similarity))
            .collect();
    }
    let found = |neighbours: &[hnsw_rs::prelude::Neighbour]| -> Vec<(u64, f32)> {
        neighbours
            .iter()
            .filter(|neighbour| accept(&neighbour.d_id))
            .take(k)
            .map(|neighbour| (segment.key(neighbour.d_id), 1.0 - neighbour.distance))
            .collect()
    };
    let plain = found(&segment.graph.search(query, ef, ef));
    if plain.len() >= k || plain.len() >= segment.live_count() {
        return plain;
    }
    found(&segment.graph.search_filter(query, k, ef, Some(&accept)))
}

fn observe_search_wait(waited: std::time::Duration) {
    SEARCH_WAIT_SECONDS.observe(waited.as_secs_f64());
    let nanos = waited.as_nanos().min(u128::from(u64::MAX)) as u64;
    if nanos > SEARCH_WAIT_MAX_NANOS.fetch_max(nanos, Ordering::AcqRel) {
        SEARCH_WAIT_MAX_SECONDS.set(nanos as f64 / 1e9);
    }
}

/// Settings of a [`DenseIndex`].
#[derive(Clone, Debug, PartialEq)]
pub struct DenseIndexConfig {
    pub dim: usize,
    /// Neighbours kept per node and layer (M); at most 256.
    pub max_nb_connection: usize,
    /// Candidate list size while building.
    pub ef_construction: usize,
    /// Candidate list size while searching (raised to k when k is larger).
    pub ef_search: usize,
    /// Layers of the graph.
    pub max_layer: usize,
    /// Slots of the live segment: once full it is sealed (persisted, when the index has a folder).
    pub seal_vectors: usize,
    /// Share of dead slots past which a sealed segment is rebuilt (and
    /// [`DenseIndex::needs_rebuild`] turns true).
    pub rebuild_dead_share: f32,
    /// Sealed segments [`DenseIndex::load`] loads at once (0: one per core).
    pub load_threads: usize,
    /// Vectors a merge may build one segment of (0: no limit). Past it, segments stay side by
    /// side: a search walks more graphs, each smaller, and finds more of the exact neighbours.
    pub max_segment_vectors: usize,
}

impl DenseIndexConfig {
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            max_nb_connection: 16,
            ef_construction: 100,
            ef_search: 640,
            max_layer: 16,
            seal_vectors: 20_000,
            rebuild_dead_share: 0.25,
            load_threads: 0,
            max_segment_vectors: 0,
        }
    }
}

/// Errors of the dense index.
#[derive(Debug, thiserror::Error)]
pub enum DenseError {
    #[error("vector has {got} dimensions, the index holds {expected}")]
    DimensionMismatch { expected: usize, got: usize },
    #[error("vector for id {id} holds a NaN or infinite value")]
    NonFiniteVector { id: u64 },
    #[error("invalid configuration `{name}`: {message}")]
    InvalidConfig { name: &'static str, message: String },
    #[error("cannot access `{path}`: {message}")]
    Io { path: PathBuf, message: String },
    #[error("`{path}` is not a valid dense index file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("`{path}` lists segments of format {version}, older than this build's")]
    Outdated { path: PathBuf, version: u32 },
}

impl DenseError {
    fn io(path: &Path, error: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            message: error.to_string(),
        }
    }

    fn corrupt(path: &Path, message: impl Into<String>) -> Self {
        Self::Corrupt {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}

/// What the index did since it was created or opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DenseCounters {
    /// Vectors inserted into a graph (by writes, or replayed at open).
    pub inserted: u64,
    /// Sealed segments loaded from disk at open.
    pub loaded_segments: u64,
    /// Sealed segments found damaged at open (dropped; their live keys were replayed).
    pub damaged_segments: u64,
    /// Live segments sealed.
    pub seals: u64,
    /// Seals or merges whose files could not be written (the segment stays in memory only).
    pub persist_failures: u64,
    /// Merges finished.
    pub merges: u64,
}

#[derive(Default)]
struct AtomicCounters {
    inserted: AtomicU64,
    loaded_segments: AtomicU64,
    damaged_segments: AtomicU64,
    seals: AtomicU64,
    persist_failures: AtomicU64,
    merges: AtomicU64,
}

/// Where a key's vector is: a segment and a slot in it.
type Location = (Arc<Segment>, usize);

/// What only the writer side (inserts, deletes, seals, merge swaps) reads and changes.
struct WriterSide {
    /// The slot in the live segment of each key written there since it was made, the newest
    /// copy's. A sealed segment finds a key's slot by its own key order
    /// ([`Segment::live_slot_of`]), so no map of every key is kept.
    live_slots: HashMap<u64, usize>,
    next_segment_id: u64,
    /// What `manifest.json` lists now.
    manifest: Manifest,
}

impl WriterSide {
    fn next_id(&mut self) -> u64 {
        let id = self.next_segment_id;
        self.next_segment_id += 1;
        id
    }
}

/// Approximate nearest-neighbour index of unit vectors keyed by `u64` ids.
pub struct DenseIndex {
    config: DenseIndexConfig,
    /// Where sealed segments are kept; `None`: in memory only.
    dir: Option<PathBuf>,
    /// Sealed segments, then the live one (always present, always last).
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    writer: Mutex<WriterSide>,
    /// Live keys.
    live_keys: AtomicUsize,
    /// True while a merge runs (at most one at a time).
    merging: AtomicBool,
    counters: AtomicCounters,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DenseIndex")
            .field("config", &self.config)
            .field("segments", &self.segments().len())
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

impl DenseIndex {
    /// An empty index kept in memory only.
    pub fn new(config: DenseIndexConfig) -> Result<Self, DenseError> {
        validate(&config)?;
        Ok(Self::assemble(
            config,
            None,
            Vec::new(),
            0,
            Manifest::default(),
            0,
        ))
    }

    /// Opens the index kept in `dir` (created when absent): loads its sealed segments, marks live
    /// the slots whose keys `live_keys` holds (the newest copy of a key wins) and returns the
    /// index with the live keys found in no segment, which the caller inserts again. A damaged
    /// segment is dropped (logged and counted), so its keys come back in that list.
    pub fn open(
        dir: &Path,
        config: DenseIndexConfig,
        live_keys: &HashSet<u64>,
    ) -> Result<(Self, Vec<u64>), DenseError> {
        Ok(Self::load(dir, config)?.open(live_keys))
    }

    /// The first half of [`DenseIndex::open`], which needs no live keys (so it can run while
    /// the caller opens the store that has them): reads the manifest, loads and verifies every
    /// segment it lists, side by side, and drops (and unlists) the damaged ones.
    pub fn load(dir: &Path, config: DenseIndexConfig) -> Result<LoadedIndex, DenseError> {
        let started = Instant::now();
        validate(&config)?;
        std::fs::create_dir_all(dir).map_err(|error| DenseError::io(dir, error))?;
        let (listed, manifest_damaged) = read_listed_manifest(dir, config.dim);
        persist::remove_unlisted(dir, &listed);
        let segments = load_listed_segments(dir, &listed, config.dim, config.load_threads);
        if segments.kept != listed {
            persist::write_manifest(dir, &segments.kept)?;
        }
        Ok(LoadedIndex {
            dir: dir.to_path_buf(),
            config,
            segments,
            manifest_damaged,
            took: started.elapsed(),
        })
    }

    fn assemble(
        config: DenseIndexConfig,
        dir: Option<PathBuf>,
        mut segments: Vec<Arc<Segment>>,
        live_keys: usize,
        manifest: Manifest,
        next_segment_id: u64,
    ) -> Self {
        let mut writer = WriterSide {
            live_slots: HashMap::new(),
            next_segment_id,
            manifest,
        };
        segments.push(Arc::new(Segment::empty(
            writer.next_id(),
            &config,
            config.seal_vectors,
        )));
        let live_keys = AtomicUsize::new(live_keys);
        Self {
            config,
            dir,
            segments: RwLock::new(Arc::new(segments)),
            writer: Mutex::new(writer),
            live_keys,
            merging: AtomicBool::new(false),
            counters: AtomicCounters::default(),
        }
    }

    pub fn config(&self) -> &DenseIndexConfig {
        &self.config
    }

    /// Number of live vectors.
    pub fn len(&self) -> usize {
        self.live_keys.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, id: u64) -> bool {
        let writer = self.writer_side();
        locate(&self.segments(), &writer, id).is_some()
    }

    /// How many of `ids` are live (one lock for all of them): both sides sorted and walked
    /// together, rather than a search of every segment for each id.
    pub fn count_contained(&self, ids: impl IntoIterator<Item = u64>) -> u64 {
        let mut ids: Vec<u64> = ids.into_iter().collect();
        ids.sort_unstable();
        let mut live: Vec<u64> = {
            let _writer = self.writer_side();
            self.segments()
                .iter()
                .flat_map(|segment| segment.live_keys())
                .collect()
        };
        live.sort_unstable();
        let mut live = live.into_iter().peekable();
        let mut count = 0;
        for id in ids {
            while live.next_if(|&key| key < id).is_some() {}
            if live.peek() == Some(&id) {
                count += 1;
            }
        }
        count
    }

    pub fn counters(&self) -> DenseCounters {
        let counters = &self.counters;
        DenseCounters {
            inserted: counters.inserted.load(Ordering::Relaxed),
            loaded_segments: counters.loaded_segments.load(Ordering::Relaxed),
            damaged_segments: counters.damaged_segments.load(Ordering::Relaxed),
            seals: counters.seals.load(Ordering::Relaxed),
            persist_failures: counters.persist_failures.load(Ordering::Relaxed),
            merges: counters.merges.load(Ordering::Relaxed),
        }
    }

    /// Number of segments, the live one included.
    pub fn segment_count(&self) -> usize {
        self.segments().len()
    }

    /// Share of all graph slots that are tombstones (0 for an empty index).
    pub fn dead_share(&self) -> f32 {
        let segments = self.segments();
        let slots: usize = segments.iter().map(|s| s.reserved()).sum();
        if slots == 0 {
            return 0.0;
        }
        let live: usize = segments.iter().map(|s| s.live_count()).sum();
        (slots - live) as f32 / slots as f32
    }

    /// True once the dead share passed the configured threshold.
    pub fn needs_rebuild(&self) -> bool {
        self.dead_share() > self.config.rebuild_dead_share
    }

    /// Adds `vector` under `id` (normalised here); an id already present is replaced.
    pub fn insert(&self, id: u64, vector: &[f32]) -> Result<(), DenseError> {
        self.insert_many([(id, vector)])
    }

    /// Adds many vectors (building the graph on the rayon pool when there are several). All
    /// vectors are checked before any is added; a repeated id keeps its last vector. The live
    /// segment is sealed whenever it fills up.
    pub fn insert_many<'v>(
        &self,
        items: impl IntoIterator<Item = (u64, &'v [f32])>,
    ) -> Result<(), DenseError> {
        let mut units: Vec<(u64, Vec<StoredElement>)> = Vec::new();
        for (id, vector) in items {
            units.push((id, to_stored(&self.checked_unit_vector(id, vector)?)));
        }
        if units.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer_side();
        let mut start = 0;
        while start < units.len() {
            // One list for the batch: its last segment takes the slots, and `publish` finds
            // the copies the batch replaces in the same list.
            let segments = self.segments();
            let live = &segments[segments.len() - 1];
            if live.free() == 0 {
                self.seal_locked(&mut writer);
                continue;
            }
            let end = (start + live.free()).min(units.len());
            let batch = &units[start..end];
            let keys: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
            let first = live.reserve(&keys);
            let graph_batch: Vec<(&[StoredElement], usize)> = batch
                .iter()
                .enumerate()
                .map(|(offset, (_, vector))| (vector.as_slice(), first + offset))
                .collect();
            for &(vector, slot) in &graph_batch {
                live.keep_vector(slot, vector);
            }
            if graph_batch.len() == 1 {
                live.graph.insert_slice(graph_batch[0]);
            } else {
                live.graph.parallel_insert_slice(&graph_batch);
            }
            for (offset, key) in keys.iter().enumerate() {
                self.publish(&mut writer, &segments, first + offset, *key);
            }
            start = end;
        }
        // Sealed as soon as it is full, not at the next insert: a crash then replays less.
        if self.live_segment().free() == 0 {
            self.seal_locked(&mut writer);
        }
        self.counters
            .inserted
            .fetch_add(units.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Tombstones `id`; returns whether it was live.
    pub fn delete(&self, id: u64) -> bool {
        let mut writer = self.writer_side();
        match locate(&self.segments(), &writer, id) {
            Some((segment, slot)) => {
                segment.set_dead(slot);
                writer.live_slots.remove(&id);
                self.live_keys.fetch_sub(1, Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// The `k` live vectors most similar to `query` (cosine) among ids that `filter` accepts,
    /// best first: `k` from each segment (by an exact scan for segments of at most
    /// [`EXHAUSTIVE_SEARCH_SLOTS`] slots), merged. Fewer come back when the filter rejects much.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filter: &(dyn Fn(u64) -> bool + Sync),
    ) -> Result<Vec<(u64, f32)>, DenseError> {
        if query.len() != self.config.dim {
            return Err(DenseError::DimensionMismatch {
                expected: self.config.dim,
                got: query.len(),
            });
        }
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

    /// Seals the live segment (persisting it when the index has a folder), unless it is empty.
    /// A seal never fails: a segment whose files cannot be written stays in memory, is counted,
    /// and is tried again at the next seal; its keys are replayed at the next open meanwhile.
    pub fn seal(&self) {
        let mut writer = self.writer_side();
        self.seal_locked(&mut writer);
    }

    /// Seals the live segment and merges every sealed segment into one, dropping tombstones.
    pub fn compact(&self) -> Result<(), DenseError> {
        self.seal();
        let ids: Vec<u64> = self.sealed_segments().iter().map(|s| s.id).collect();
        self.merge_segments(&ids)
    }

    /// The sealed segments worth merging now, if any: those past the dead share; else the
    /// segments of the lowest tier holding [`TIER_MERGE_FACTOR`] or more (see [`tier`]), so that
    /// segments grow by that factor (a search walks one graph per segment, and one large graph
    /// costs far less than many small ones); else, past [`MAX_SEALED_SEGMENTS`], the smallest.
    /// Segments of more than a `TIER_MERGE_FACTOR`th of `max_segment_vectors` merge no more.
    pub fn segments_to_merge(&self) -> Option<Vec<u64>> {
        let sealed = self.sealed_segments();
        let dead: Vec<u64> = sealed
            .iter()
            .filter(|s| s.dead_share() > self.config.rebuild_dead_share)
            .map(|s| s.id)
            .collect();
        if !dead.is_empty() {
            return Some(dead);
        }
        let seal = self.config.seal_vectors;
        // A segment a merge of `TIER_MERGE_FACTOR` could not take without passing the cap is
        // left out of both rules below: it is as large as segments grow.
        let cap = self.config.max_segment_vectors;
        let mergeable: Vec<&Arc<Segment>> = sealed
            .iter()
            .filter(|s| cap == 0 || s.live_count() <= cap / TIER_MERGE_FACTOR)
            .collect();
        let mut tiers: Vec<usize> = mergeable
            .iter()
            .map(|s| tier(s.live_count(), seal))
            .collect();
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
                    .filter(|s| tier(s.live_count(), seal) == full_tier)
                    .take(TIER_MERGE_FACTOR)
                    .map(|s| s.id)
                    .collect(),
            );
        }
        if mergeable.len() > MAX_SEALED_SEGMENTS {
            let mut by_size = mergeable;
            by_size.sort_by_key(|s| s.live_count());
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

    /// Claims the right to run a merge; `false` when one runs. [`Self::merge_segments`] gives it
    /// back.
    pub fn try_start_merge(&self) -> bool {
        !self.merging.swap(true, Ordering::AcqRel)
    }

    /// Gives back the right claimed by [`Self::try_start_merge`] without merging.
    pub fn abandon_merge(&self) {
        self.merging.store(false, Ordering::Release);
    }

    /// Rebuilds the sealed segments `ids` into one from their live vectors and swaps it in. The
    /// graph is built without the writer lock; writes that land meanwhile are kept: at the swap,
    /// a key moves to the merged segment only if it still lives where the merge read it, so a
    /// key deleted or replaced meanwhile stays dead in the merged segment.
    pub fn merge_segments(&self, ids: &[u64]) -> Result<(), DenseError> {
        let result = self.merge_segments_inner(ids, &|| {});
        self.merging.store(false, Ordering::Release);
        result
    }

    /// [`Self::merge_segments`]; `after_read` runs once the live vectors are read (tests write
    /// there, to land writes in the middle of a merge).
    fn merge_segments_inner(&self, ids: &[u64], after_read: &dyn Fn()) -> Result<(), DenseError> {
        let started = Instant::now();
        let chosen: Vec<Arc<Segment>> = self
            .sealed_segments()
            .into_iter()
            .filter(|segment| ids.contains(&segment.id))
            .collect();
        if chosen.is_empty() {
            return Ok(());
        }
        let (sources, vectors) = read_live_vectors(&chosen);
        after_read();
        let merged = self.build_merged_segment(&sources, vectors);
        // Written before the swap, listed in the manifest at the swap.
        let entry = self.dump_merged_segment(&merged);
        let merged = self.read_back(merged, entry.as_ref());
        let mut writer = self.writer_side();
        move_unchanged_keys(&sources, &merged);
        let removed_entries = self.list_merged_in_manifest(&mut writer, ids, &merged, entry);
        self.replace_segments(|segments| {
            let position = segments
                .iter()
                .position(|s| ids.contains(&s.id))
                .unwrap_or(0);
            segments.retain(|s| !ids.contains(&s.id));
            if merged.reserved() > 0 {
                segments.insert(position.min(segments.len() - 1), Arc::clone(&merged));
            }
        });
        drop(writer);
        if let Some(dir) = &self.dir {
            for entry in &removed_entries {
                persist::remove_segment_files(dir, entry);
            }
        }
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            segments = chosen.len(),
            vectors = sources.len(),
            seconds = started.elapsed().as_secs_f32(),
            "dense segments merged"
        );
        Ok(())
    }

    /// A new segment (not yet live in any slot) holding `vectors`, slot `i` keyed by the key of
    /// `sources[i]`. Built without the writer lock but for taking its id.
    fn build_merged_segment(
        &self,
        sources: &[(u64, Location)],
        vectors: Vec<Vec<StoredElement>>,
    ) -> Arc<Segment> {
        let id = self.writer_side().next_id();
        let merged = Arc::new(Segment::empty(id, &self.config, sources.len()));
        let keys: Vec<u64> = sources.iter().map(|(key, _)| *key).collect();
        merged.reserve(&keys);
        merged.order_keys();
        let batch: Vec<(&[StoredElement], usize)> = vectors
            .iter()
            .enumerate()
            .map(|(slot, vector)| (vector.as_slice(), slot))
            .collect();
        for &(vector, slot) in batch.iter().take(EXHAUSTIVE_SEARCH_SLOTS) {
            merged.keep_vector(slot, vector);
        }
        merged.graph.parallel_insert_slice(&batch);
        merged
    }

    /// Dumps a non-empty merged segment into the index's folder; None in memory, when it is
    /// empty or when writing fails (logged and counted: it stays in memory).
    fn dump_merged_segment(&self, merged: &Segment) -> Option<SegmentEntry> {
        let dir = self.dir.as_ref()?;
        if merged.reserved() == 0 {
            return None;
        }
        match persist::dump_segment(dir, merged) {
            Ok(entry) => Some(entry),
            Err(error) => {
                tracing::error!(%error, "writing a merged dense segment failed; it stays in memory");
                self.counters
                    .persist_failures
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// `merged` as loaded from its dump `entry`, its vectors mapped from the data file as those
    /// of the segments loaded at open are, rather than held; `merged` itself when there is no
    /// dump or it does not load. The loaded segment has the same slots and keys, all dead. The
    /// files were checksummed as they were written, just before.
    fn read_back(&self, merged: Arc<Segment>, entry: Option<&SegmentEntry>) -> Arc<Segment> {
        let (Some(dir), Some(entry)) = (&self.dir, entry) else {
            return merged;
        };
        match persist::load_segment_unverified(dir, entry, self.config.dim) {
            Ok(loaded) => Arc::new(loaded),
            Err(error) => {
                tracing::warn!(%error, "reading a merged dense segment back failed; it stays in memory");
                merged
            }
        }
    }

    /// Replaces the merged segments `ids` by `merged` in the manifest (under the writer lock);
    /// returns the entries whose files may now be removed (none when the manifest write failed).
    fn list_merged_in_manifest(
        &self,
        writer: &mut WriterSide,
        ids: &[u64],
        merged: &Segment,
        entry: Option<SegmentEntry>,
    ) -> Vec<SegmentEntry> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let mut manifest = writer.manifest.clone();
        let mut removed_entries: Vec<SegmentEntry> = manifest
            .segments
            .iter()
            .filter(|e| ids.contains(&e.id))
            .cloned()
            .collect();
        manifest.segments.retain(|e| !ids.contains(&e.id));
        if let Some(entry) = entry {
            merged.mark_persisted();
            manifest.segments.push(entry);
        }
        // The chosen segments' keys now live in the merged segment: a manifest still listing
        // them would be as good (open takes the live keys from the caller), so a failure
        // here only leaves stale files, removed at the next open.
        match persist::write_manifest(dir, &manifest) {
            Ok(()) => writer.manifest = manifest,
            Err(error) => {
                tracing::error!(%error, "updating the dense manifest after a merge failed");
                self.counters
                    .persist_failures
                    .fetch_add(1, Ordering::Relaxed);
                removed_entries.clear();
            }
        }
        removed_entries
    }

    /// Copies of the live vectors with their ids, in no particular order.
    pub fn live_vectors(&self) -> Vec<(u64, Vec<f32>)> {
        let mut live = Vec::with_capacity(self.len());
        for segment in self.segments().iter() {
            for (slot, vector) in segment.live_vectors() {
                live.push((segment.key(slot), from_stored(&vector)));
            }
        }
        live
    }

    fn seal_locked(&self, writer: &mut MutexGuard<'_, WriterSide>) {
        let live = self.live_segment();
        if live.reserved() > 0 {
            live.order_keys();
            writer.live_slots.clear();
            let fresh = Arc::new(Segment::empty(
                writer.next_id(),
                &self.config,
                self.config.seal_vectors,
            ));
            self.replace_segments(|segments| segments.push(fresh));
            self.counters.seals.fetch_add(1, Ordering::Relaxed);
        }
        self.persist_sealed(writer);
    }

    /// Writes every sealed segment not yet on disk and lists them in the manifest.
    fn persist_sealed(&self, writer: &mut MutexGuard<'_, WriterSide>) {
        let Some(dir) = &self.dir else {
            return;
        };
        let pending: Vec<Arc<Segment>> = self
            .sealed_segments()
            .into_iter()
            .filter(|s| !s.is_persisted())
            .collect();
        if pending.is_empty() {
            return;
        }
        let mut manifest = writer.manifest.clone();
        let mut written = Vec::new();
        for segment in &pending {
            match persist::dump_segment(dir, segment) {
                Ok(entry) => {
                    manifest.segments.push(entry);
                    written.push(Arc::clone(segment));
                }
                Err(error) => {
                    tracing::error!(segment = segment.id, %error, "writing a sealed dense segment failed; it stays in memory");
                    self.counters
                        .persist_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The manifest lists segments in the order of the segment list.
        let order: HashMap<u64, usize> = self
            .segments()
            .iter()
            .enumerate()
            .map(|(position, s)| (s.id, position))
            .collect();
        manifest
            .segments
            .sort_by_key(|e| order.get(&e.id).copied().unwrap_or(usize::MAX));
        match persist::write_manifest(dir, &manifest) {
            Ok(()) => {
                writer.manifest = manifest;
                for segment in written {
                    segment.mark_persisted();
                }
            }
            Err(error) => {
                tracing::error!(%error, "writing the dense manifest failed; the sealed segments stay in memory");
                self.counters
                    .persist_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Makes `slot` of the live segment (the last of `segments`, the list now) the live copy
    /// of `key`, tombstoning the one before.
    fn publish(&self, writer: &mut WriterSide, segments: &[Arc<Segment>], slot: usize, key: u64) {
        let previous = locate(segments, writer, key);
        if let Some(live) = segments.last() {
            live.set_live(slot);
        }
        writer.live_slots.insert(key, slot);
        match previous {
            Some((previous, previous_slot)) => previous.set_dead(previous_slot),
            None => {
                self.live_keys.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    fn writer_side(&self) -> MutexGuard<'_, WriterSide> {
        // A panic while holding it leaves whole values behind (each change is one store).
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The segment list now: the lock is held for the clone of an `Arc` only.
    fn segments(&self) -> Arc<Vec<Arc<Segment>>> {
        Arc::clone(&self.segments.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn sealed_segments(&self) -> Vec<Arc<Segment>> {
        let segments = self.segments();
        segments[..segments.len() - 1].to_vec()
    }

    fn live_segment(&self) -> Arc<Segment> {
        let segments = self.segments();
        Arc::clone(&segments[segments.len() - 1])
    }

    /// Swaps in a changed copy of the segment list (only under the writer lock).
    fn replace_segments(&self, change: impl FnOnce(&mut Vec<Arc<Segment>>)) {
        let mut next: Vec<Arc<Segment>> = self.segments().as_ref().clone();
        change(&mut next);
        let previous = std::mem::replace(
            &mut *self.segments.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(next),
        );
        // Dropping the last reference to a merged-away graph takes time: not under the lock.
        drop(previous);
    }

    fn checked_unit_vector(&self, id: u64, vector: &[f32]) -> Result<Vec<f32>, DenseError> {
        if vector.len() != self.config.dim {
            return Err(DenseError::DimensionMismatch {
                expected: self.config.dim,
                got: vector.len(),
            });
        }
        if !vector.iter().all(|x| x.is_finite()) {
            return Err(DenseError::NonFiniteVector { id });
        }
        let mut unit = vector.to_vec();
        l2_normalize(&mut unit);
        Ok(unit)
    }
}

fn validate(config: &DenseIndexConfig) -> Result<(), DenseError> {
    if config.dim == 0 {
        return Err(DenseError::InvalidConfig {
            name: "dim",
            message: "must be positive".to_owned(),
        });
    }
    // hnsw_rs exits the process (not panics) on more than 256 connections.
    if config.max_nb_connection == 0 || config.max_nb_connection > 256 {
        return Err(DenseError::InvalidConfig {
            name: "max_nb_connection",
            message: format!("must lie in 1..=256, got {}", config.max_nb_connection),
        });
    }
    if config.seal_vectors == 0 || config.seal_vectors > MAX_SEAL_VECTORS {
        return Err(DenseError::InvalidConfig {
            name: "seal_vectors",
            message: format!(
                "must lie in 1..={MAX_SEAL_VECTORS}, got {}",
                config.seal_vectors
            ),
        });
    }
    let least_cap = config.seal_vectors.saturating_mul(TIER_MERGE_FACTOR);
    if config.max_segment_vectors != 0 && config.max_segment_vectors < least_cap {
        return Err(DenseError::InvalidConfig {
            name: "max_segment_vectors",
            message: format!(
                "must be 0 (no limit) or at least {TIER_MERGE_FACTOR} × seal_vectors = {least_cap}, got {}",
                config.max_segment_vectors
            ),
        });
    }
    Ok(())
}

/// The manifest in `dir` when it holds vectors of `dim` columns, else an empty one; with 1 when
/// it was damaged (logged), to count.
fn read_listed_manifest(dir: &Path, dim: usize) -> (Manifest, u64) {
    match persist::read_manifest(dir) {
        Ok(Some(manifest)) if manifest.dim == dim => (manifest, 0),
        Ok(Some(manifest)) => {
            tracing::warn!(dir = %dir.display(), stored = manifest.dim, wanted = dim, "dense segments hold vectors of another dimension; rebuilding them");
            (Manifest::default(), 0)
        }
        Ok(None) => (Manifest::default(), 0),
        Err(error @ DenseError::Outdated { .. }) => {
            tracing::warn!(dir = %dir.display(), %error, "rebuilding the dense segments from the stored vectors, once");
            (Manifest::default(), 0)
        }
        Err(error) => {
            tracing::error!(dir = %dir.display(), %error, "the dense manifest is damaged; rebuilding the dense segments from the stored vectors");
            (Manifest::default(), 1)
        }
    }
}

/// Sealed segments loaded by [`DenseIndex::load`], every slot still dead.
pub struct LoadedIndex {
    dir: PathBuf,
    config: DenseIndexConfig,
    segments: LoadedSegments,
    manifest_damaged: u64,
    took: std::time::Duration,
}

impl LoadedIndex {
    /// How long [`DenseIndex::load`] took.
    pub fn took(&self) -> std::time::Duration {
        self.took
    }

    pub fn dim(&self) -> usize {
        self.config.dim
    }

    /// The second half of [`DenseIndex::open`]: marks live the slots of `live_keys` and returns
    /// the index with the live keys found in no segment.
    pub fn open(self, live_keys: &HashSet<u64>) -> (DenseIndex, Vec<u64>) {
        let Self {
            dir,
            config,
            segments: loaded,
            manifest_damaged,
            took: _,
        } = self;
        let (located, missing) = mark_live_keys(&loaded.segments, live_keys);
        let loaded_count = loaded.segments.len() as u64;
        let damaged = manifest_damaged + loaded.damaged;
        let index = DenseIndex::assemble(
            config,
            Some(dir),
            loaded.segments,
            located,
            loaded.kept,
            loaded.next_segment_id,
        );
        index
            .counters
            .loaded_segments
            .store(loaded_count, Ordering::Relaxed);
        index
            .counters
            .damaged_segments
            .store(damaged, Ordering::Relaxed);
        (index, missing)
    }
}

/// The segments a manifest lists that loaded, the manifest of just those, the next free
/// segment id and how many were damaged.
struct LoadedSegments {
    segments: Vec<Arc<Segment>>,
    kept: Manifest,
    next_segment_id: u64,
    damaged: u64,
}

/// Loads every segment `listed` names, `threads` at once (0: one per core); a damaged one is
/// logged, its files removed and left out.
fn load_listed_segments(
    dir: &Path,
    listed: &Manifest,
    dim: usize,
    threads: usize,
) -> LoadedSegments {
    let mut loaded = LoadedSegments {
        segments: Vec::new(),
        kept: Manifest {
            version: persist::MANIFEST_VERSION,
            dim,
            segments: Vec::new(),
        },
        next_segment_id: 0,
        damaged: 0,
    };
    // Each load is one thread reading and verifying its files, then rebuilding the graph's
    // structures from them.
    let load = |entry: &SegmentEntry| persist::load_segment(dir, entry, dim);
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        threads => threads,
    }
    .min(listed.segments.len());
    let one_at_a_time = || listed.segments.iter().map(load).collect();
    let results: Vec<Result<Segment, DenseError>> = if threads > 1 {
        match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
            Ok(pool) => pool.install(|| {
                listed
                    .segments
                    .par_iter()
                    .with_max_len(1)
                    .map(load)
                    .collect()
            }),
            Err(error) => {
                tracing::warn!(%error, "loading the dense segments one at a time");
                one_at_a_time()
            }
        }
    } else {
        one_at_a_time()
    };
    for (entry, result) in listed.segments.iter().zip(results) {
        loaded.next_segment_id = loaded.next_segment_id.max(entry.id + 1);
        match result {
            Ok(segment) => {
                loaded.segments.push(Arc::new(segment));
                loaded.kept.segments.push(entry.clone());
            }
            Err(error) => {
                tracing::error!(segment = entry.id, %error, "a dense segment is damaged; dropping it and inserting its live vectors again from the stored sections");
                loaded.damaged += 1;
                persist::remove_segment_files(dir, entry);
            }
        }
    }
    loaded
}

/// Marks live the slot of each key in `live_keys`; returns how many were found and the keys
/// found in no segment.
fn mark_live_keys(segments: &[Arc<Segment>], live_keys: &HashSet<u64>) -> (usize, Vec<u64>) {
    // Newest first: a key stored twice (written again after a seal) takes its newest vector.
    let mut located: HashSet<u64> = HashSet::with_capacity(live_keys.len());
    for segment in segments.iter().rev() {
        for slot in (0..segment.reserved()).rev() {
            let key = segment.key(slot);
            if live_keys.contains(&key) && located.insert(key) {
                segment.set_live(slot);
            }
        }
    }
    let missing = live_keys
        .iter()
        .filter(|key| !located.contains(key))
        .copied()
        .collect();
    (located.len(), missing)
}

/// Where `key`'s live copy is, among `segments` (the list now, the live segment last).
fn locate<'s>(
    segments: &'s [Arc<Segment>],
    writer: &WriterSide,
    key: u64,
) -> Option<(&'s Arc<Segment>, usize)> {
    let (live, sealed) = segments.split_last()?;
    if let Some(&slot) = writer.live_slots.get(&key) {
        if live.is_live(slot) {
            return Some((live, slot));
        }
    }
    // At most one slot of the index holds a key live, so the order of the search is free.
    sealed
        .iter()
        .rev()
        .find_map(|segment| Some((segment, segment.live_slot_of(key)?)))
}

/// The live vectors of the `chosen` segments, each with its key and where it was read.
fn read_live_vectors(chosen: &[Arc<Segment>]) -> (Vec<(u64, Location)>, Vec<Vec<StoredElement>>) {
    let mut sources: Vec<(u64, Location)> = Vec::new();
    let mut vectors: Vec<Vec<StoredElement>> = Vec::new();
    for segment in chosen {
        for (slot, vector) in segment.live_vectors() {
            sources.push((segment.key(slot), (Arc::clone(segment), slot)));
            vectors.push(vector);
        }
    }
    (sources, vectors)
}

/// Makes live in `merged` each key that still lives where the merge read it; a key deleted or
/// written again meanwhile (its sealed source slot dead) stays dead in `merged`. Call under the
/// writer lock, with the swap that drops the sources from the list.
fn move_unchanged_keys(sources: &[(u64, Location)], merged: &Segment) {
    for (slot, (_, (source, source_slot))) in sources.iter().enumerate() {
        if source.is_live(*source_slot) {
            // The source slot stays live until the list swap drops its segment, so the key
            // never goes missing from searches (they keep the best of two copies).
            merged.set_live(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::dot;

    /// Deterministic pseudo-random unit vectors (xorshift).
    fn random_vectors(count: usize, dim: usize, mut seed: u64) -> Vec<Vec<f32>> {
        (0..count)
            .map(|_| {
                let mut vector: Vec<f32> = (0..dim)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (seed % 2001) as f32 / 1000.0 - 1.0
                    })
                    .collect();
                l2_normalize(&mut vector);
                vector
            })
            .collect()
    }

    /// Unit vector `v` as the index holds it (the unit vector of its codes): the reference the exact
    /// scan of a small segment must match.
    fn as_stored(v: &[f32]) -> Vec<f32> {
        let mut unit = v.to_vec();
        l2_normalize(&mut unit);
        from_stored(&to_stored(&unit))
    }

    /// The `k` best ids by exact similarity to what the index stores.
    fn exact_top(
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

    fn small_index(vectors: &[Vec<f32>]) -> DenseIndex {
        let index = DenseIndex::new(DenseIndexConfig::new(vectors[0].len())).expect("valid config");
        for (id, vector) in vectors.iter().enumerate() {
            index.insert(id as u64, vector).expect("right dimension");
        }
        index
    }

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

    #[test]
    fn deleted_ids_never_come_back() {
        let vectors = random_vectors(200, 16, 2);
        let index = small_index(&vectors);
        for id in (0..200u64).filter(|id| id % 3 == 0) {
            assert!(index.delete(id));
        }
        assert!(!index.delete(0));
        assert!((index.dead_share() - 67.0 / 200.0).abs() < 1e-6);
        assert!(index.needs_rebuild());
        for query in &vectors {
            let hits = index.search(query, 10, &|_| true).expect("dim ok");
            assert!(hits.iter().all(|(id, _)| id % 3 != 0), "{hits:?}");
            assert_eq!(hits.len(), 10);
        }
        index.compact().expect("compacts");
        assert_eq!(index.dead_share(), 0.0);
        assert_eq!(index.len(), 133);
        for query in &vectors {
            let hits = index.search(query, 10, &|_| true).expect("dim ok");
            assert!(hits.iter().all(|(id, _)| id % 3 != 0));
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
    fn filters_and_replacements_are_respected() {
        let vectors = random_vectors(100, 16, 3);
        let index = small_index(&vectors);
        let hits = index
            .search(&vectors[4], 10, &|id| id % 2 == 0)
            .expect("dim ok");
        assert!(hits.iter().all(|(id, _)| id % 2 == 0));
        assert_eq!(hits[0].0, 4);
        // Replacing id 4 by the vector of id 5: a query for the old vector no longer finds 4 first.
        index.insert(4, &vectors[5]).expect("dim ok");
        assert_eq!(index.len(), 100);
        let hits = index.search(&vectors[5], 2, &|_| true).expect("dim ok");
        let mut ids: Vec<u64> = hits.iter().map(|h| h.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![4, 5]);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let index = DenseIndex::new(DenseIndexConfig::new(4)).expect("valid");
        assert!(index
            .search(&[1.0, 0.0, 0.0, 0.0], 3, &|_| true)
            .expect("dim ok")
            .is_empty());
        assert!(matches!(
            index.insert(1, &[1.0, 2.0]),
            Err(DenseError::DimensionMismatch { .. })
        ));
        assert!(matches!(
            index.insert(1, &[f32::NAN, 0.0, 0.0, 0.0]),
            Err(DenseError::NonFiniteVector { id: 1 })
        ));
        assert!(index.search(&[1.0], 3, &|_| true).is_err());
        index
            .insert(1, &[0.0; 4])
            .expect("a zero vector is allowed");
        index.insert(2, &[1.0, 0.0, 0.0, 0.0]).expect("ok");
        assert_eq!(
            index
                .search(&[1.0, 0.0, 0.0, 0.0], 0, &|_| true)
                .expect("ok"),
            vec![]
        );
        assert_eq!(
            index
                .search(&[1.0, 0.0, 0.0, 0.0], 1, &|_| true)
                .expect("ok")[0]
                .0,
            2
        );
        let mut config = DenseIndexConfig::new(4);
        config.max_nb_connection = 300;
        assert!(DenseIndex::new(config).is_err());
    }

    /// `count` vectors under ids `0..count` in an index kept in `dir`, sealed every `seal` vectors.
    fn persisted_index(dir: &Path, vectors: &[Vec<f32>], seal: usize) -> DenseIndex {
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

    fn reopen(
        dir: &Path,
        dim: usize,
        seal: usize,
        live: impl Iterator<Item = u64>,
    ) -> (DenseIndex, Vec<u64>) {
        let mut config = DenseIndexConfig::new(dim);
        config.seal_vectors = seal;
        DenseIndex::open(dir, config, &live.collect()).expect("opens")
    }

    /// Every key live exactly once, wherever its copies are: random writes, deletes, seals and
    /// merges against a model of the live set (keys from a small range, so most writes replace
    /// a key in a sealed segment, in the live one, or one written twice in a batch).
    #[test]
    fn each_live_key_is_found_once_through_writes_deletes_seals_merges_and_a_reopen() {
        const KEYS: u64 = 60;
        let dim = 8;
        let vectors = random_vectors(KEYS as usize * 8, dim, 23);
        let dir = tempfile::tempdir().unwrap();
        let mut config = DenseIndexConfig::new(dim);
        config.seal_vectors = 7;
        let (index, _) = DenseIndex::open(dir.path(), config, &HashSet::new()).unwrap();
        let mut model: HashMap<u64, usize> = HashMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let check = |index: &DenseIndex, model: &HashMap<u64, usize>, step: usize| {
            assert_eq!(index.len(), model.len(), "step {step}");
            let live_slots: usize = index.segments().iter().map(|s| s.live_count()).sum();
            assert_eq!(live_slots, model.len(), "one live slot a key, step {step}");
            for key in 0..KEYS {
                assert_eq!(
                    index.contains(key),
                    model.contains_key(&key),
                    "{key}, step {step}"
                );
            }
            assert_eq!(index.count_contained(0..KEYS * 2), model.len() as u64);
            assert_eq!(
                index.count_contained([3, 3, 3]),
                3 * u64::from(model.contains_key(&3))
            );
            for (&key, &vector) in model {
                let hits = index.search(&vectors[vector], 1, &|_| true).unwrap();
                assert_eq!(hits[0].0, key, "step {step}");
            }
        };
        for step in 0..400 {
            match next(10) {
                0..=4 => {
                    // Key k takes one of the vectors 8k..8k+8: distinct across keys.
                    let batch: Vec<(u64, usize)> = (0..1 + next(9))
                        .map(|_| {
                            let key = next(KEYS);
                            (key, (key * 8 + next(8)) as usize)
                        })
                        .collect();
                    index
                        .insert_many(batch.iter().map(|&(key, v)| (key, vectors[v].as_slice())))
                        .unwrap();
                    model.extend(batch);
                }
                5..=7 => {
                    let key = next(KEYS);
                    assert_eq!(
                        index.delete(key),
                        model.remove(&key).is_some(),
                        "step {step}"
                    );
                }
                8 => index.seal(),
                _ => {
                    if let Some(ids) = index.segments_to_merge() {
                        assert!(index.try_start_merge());
                        index.merge_segments(&ids).unwrap();
                    }
                }
            }
            check(&index, &model, step);
        }
        let counters = index.counters();
        assert!(counters.seals > 20 && counters.merges > 5, "{counters:?}");
        index.compact().unwrap();
        assert_eq!(index.len(), model.len());
        index.seal();
        drop(index);
        let live: HashSet<u64> = model.keys().copied().collect();
        let (reopened, missing) = reopen(dir.path(), dim, 7, live.iter().copied());
        assert!(missing.is_empty());
        assert_eq!(reopened.len(), model.len());
        for key in 0..KEYS {
            assert_eq!(reopened.contains(key), model.contains_key(&key), "{key}");
        }
        // A key deleted after the reopen is found through the loaded segment's key order.
        let key = *model.keys().next().unwrap();
        assert!(reopened.delete(key));
        assert!(!reopened.contains(key));
        assert_eq!(reopened.len(), model.len() - 1);
    }

    #[test]
    fn segments_loaded_side_by_side_open_the_index_loaded_one_at_a_time() {
        let vectors = random_vectors(700, 16, 11);
        let dir = tempfile::tempdir().unwrap();
        let index = persisted_index(dir.path(), &vectors, 100);
        index.seal();
        drop(index);
        let live: HashSet<u64> = (0..700u64).filter(|id| id % 3 != 0).collect();
        let open = |threads: usize| {
            let mut config = DenseIndexConfig::new(16);
            config.seal_vectors = 100;
            config.load_threads = threads;
            DenseIndex::open(dir.path(), config, &live).expect("opens")
        };
        let (one_at_a_time, missing) = open(1);
        assert!(missing.is_empty());
        assert_eq!(one_at_a_time.sealed_segments().len(), 7);
        for threads in [0, 3, 64] {
            let (side_by_side, missing) = open(threads);
            assert!(missing.is_empty(), "{threads} threads");
            assert_eq!(side_by_side.len(), live.len(), "{threads} threads");
            for query in &vectors[..20] {
                assert_eq!(
                    side_by_side.search(query, 10, &|_| true).unwrap(),
                    one_at_a_time.search(query, 10, &|_| true).unwrap(),
                    "{threads} threads"
                );
            }
        }
    }

    fn ids_of(hits: &[(u64, f32)]) -> Vec<u64> {
        hits.iter().map(|hit| hit.0).collect()
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

    #[test]
    fn a_sealed_index_reopens_without_inserting_and_searches_the_same() {
        let vectors = random_vectors(500, 32, 4);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 200);
        assert!(index.delete(7));
        // A clean close seals what the live segment holds.
        index.seal();
        let before: Vec<Vec<(u64, f32)>> = vectors
            .iter()
            .step_by(25)
            .map(|query| index.search(query, 5, &|_| true).expect("ok"))
            .collect();
        drop(index);

        let (reopened, missing) = reopen(dir.path(), 32, 200, (0..500).filter(|id| *id != 7));
        assert!(missing.is_empty(), "{missing:?}");
        let counters = reopened.counters();
        assert_eq!(counters.inserted, 0, "nothing is inserted at a clean open");
        assert_eq!(counters.loaded_segments, 3);
        assert_eq!(counters.damaged_segments, 0);
        assert_eq!(reopened.len(), 499);
        assert!(!reopened.contains(7));
        for (query, before) in vectors.iter().step_by(25).zip(&before) {
            let after = reopened.search(query, 5, &|_| true).expect("ok");
            assert_eq!(&after, before);
        }
    }

    #[test]
    fn tombstones_survive_reopen_and_unsealed_keys_come_back_as_missing() {
        let vectors = random_vectors(250, 16, 5);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 100);
        // Ids 200..250 sit in the live segment, never sealed: as after kill -9.
        assert_eq!(index.counters().seals, 2);
        drop(index);
        // The caller's store deleted every third id (after the seal) and holds one id more.
        let live = (0..250u64).filter(|id| id % 3 != 0).chain([1_000]);
        let (reopened, mut missing) = reopen(dir.path(), 16, 100, live);
        missing.sort_unstable();
        let mut wanted: Vec<u64> = (200..250u64).filter(|id| id % 3 != 0).collect();
        wanted.push(1_000);
        assert_eq!(missing, wanted);
        for query in &vectors {
            let hits = reopened.search(query, 10, &|_| true).expect("ok");
            assert!(
                hits.iter().all(|(id, _)| id % 3 != 0 && *id < 200),
                "{hits:?}"
            );
        }
        assert_eq!(reopened.counters().inserted, 0);
    }

    /// A folder holding `vectors` (keys 0..) in sealed segments of 100, the index closed.
    fn sealed_index_dir(vectors: &[Vec<f32>]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), vectors, 100);
        index.seal();
        drop(index);
        dir
    }

    /// Inserts the `missing` keys again, as the caller of `open` does, then checks that every
    /// vector is found as its own nearest.
    fn insert_missing_and_find_each(index: &DenseIndex, missing: &[u64], vectors: &[Vec<f32>]) {
        index
            .insert_many(
                missing
                    .iter()
                    .map(|id| (*id, vectors[*id as usize].as_slice())),
            )
            .expect("inserts");
        for (id, query) in vectors.iter().enumerate() {
            assert_eq!(
                index.search(query, 1, &|_| true).expect("ok")[0].0,
                id as u64
            );
        }
    }

    #[test]
    fn a_damaged_segment_is_dropped_and_its_live_keys_come_back_as_missing() {
        let vectors = random_vectors(200, 16, 6);
        let dir = sealed_index_dir(&vectors);
        let data = dir.path().join("seg-0.hnsw.data");
        let mut bytes = std::fs::read(&data).expect("dumped");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&data, &bytes).expect("write");

        let (reopened, mut missing) = reopen(dir.path(), 16, 100, 0..200);
        missing.sort_unstable();
        assert_eq!(missing, (0..100).collect::<Vec<u64>>());
        assert_eq!(reopened.counters().damaged_segments, 1);
        assert!(!data.exists(), "the damaged segment's files are removed");
        insert_missing_and_find_each(&reopened, &missing, &vectors);
        drop(reopened);
        // The manifest no longer lists it: a second open finds nothing damaged.
        let (again, _) = reopen(dir.path(), 16, 100, 0..200);
        assert_eq!(again.counters().damaged_segments, 0);
    }

    #[test]
    fn an_index_of_an_older_format_is_rebuilt_from_the_stored_vectors_not_counted_damaged() {
        let vectors = random_vectors(200, 16, 12);
        let dir = sealed_index_dir(&vectors);
        // What a build with half-float graphs left: its manifest says format 2.
        let manifest_path = dir.path().join(persist::MANIFEST_FILE);
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
        manifest["version"] = 2.into();
        std::fs::write(&manifest_path, manifest.to_string()).unwrap();

        let (reopened, mut missing) = reopen(dir.path(), 16, 100, 0..200);
        missing.sort_unstable();
        assert_eq!(
            missing,
            (0..200).collect::<Vec<u64>>(),
            "every key replayed"
        );
        assert_eq!(reopened.counters().damaged_segments, 0);
        assert!(
            !dir.path().join("seg-0.hnsw.data").exists(),
            "the old segments' files are removed"
        );
        insert_missing_and_find_each(&reopened, &missing, &vectors);
        reopened.seal();
        drop(reopened);
        let (again, missing) = reopen(dir.path(), 16, 100, 0..200);
        assert!(missing.is_empty(), "sealed in the current format");
        insert_missing_and_find_each(&again, &missing, &vectors);
    }

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
    fn a_cap_below_one_merge_of_sealed_segments_is_refused() {
        let mut config = DenseIndexConfig::new(16);
        config.seal_vectors = 100;
        config.max_segment_vectors = 399;
        let dir = tempfile::tempdir().expect("tempdir");
        let Err(error) = DenseIndex::open(dir.path(), config.clone(), &HashSet::new()) else {
            panic!("a cap of 399 with seal_vectors 100 was accepted");
        };
        assert!(error.to_string().contains("max_segment_vectors"), "{error}");
        config.max_segment_vectors = 400;
        assert!(DenseIndex::open(dir.path(), config, &HashSet::new()).is_ok());
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
        for (id, query) in vectors.iter().enumerate() {
            assert_eq!(
                index.search(query, 1, &|_| true).expect("ok")[0].0,
                id as u64
            );
        }
    }

    #[test]
    fn a_merge_keeps_every_live_key_and_drops_the_dead() {
        let vectors = random_vectors(400, 16, 7);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 100);
        index.seal();
        for id in (0..200u64).filter(|id| id % 2 == 0) {
            assert!(index.delete(id));
        }
        // Segments 0 and 1 are half dead; 2 and 3 whole.
        let chosen = index.segments_to_merge().expect("dead segments to merge");
        assert_eq!(chosen, vec![0, 1]);
        assert!(index.try_start_merge());
        assert!(!index.try_start_merge(), "one merge at a time");
        index.merge_segments(&chosen).expect("merges");
        assert!(index.try_start_merge());
        index.merge_segments(&[]).expect("nothing to merge");
        assert_eq!(index.counters().merges, 1);
        assert_eq!(index.len(), 300);
        assert!(index.segments_to_merge().is_none());
        assert!(!dir.path().join("seg-0.hnsw.data").exists());
        let live = |id: u64| id >= 200 || id % 2 == 1;
        for (id, query) in vectors.iter().enumerate() {
            let hits = index.search(query, 10, &|_| true).expect("ok");
            assert!(hits.iter().all(|(hit, _)| live(*hit)), "{hits:?}");
            if live(id as u64) {
                assert_eq!(hits[0].0, id as u64);
            }
        }
        let before = ids_of(&index.search(&vectors[1], 10, &|_| true).expect("ok"));
        drop(index);
        let (reopened, missing) = reopen(dir.path(), 16, 100, (0..400).filter(|id| live(*id)));
        assert!(missing.is_empty(), "{missing:?}");
        assert_eq!(reopened.counters().loaded_segments, 3);
        assert_eq!(
            ids_of(&reopened.search(&vectors[1], 10, &|_| true).expect("ok")),
            before
        );
    }

    /// The names of the files in `dir` this process has mapped now, sorted.
    #[cfg(target_os = "linux")]
    fn mapped_files(dir: &Path) -> Vec<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("reads the maps");
        let dir = dir.to_str().expect("a UTF-8 temporary path");
        let mut names: Vec<String> = maps
            .lines()
            .filter_map(|line| line.split_once(dir))
            .map(|(_, rest)| {
                let rest = rest.trim_start_matches('/');
                rest.trim_end_matches(" (deleted)").to_string()
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn loaded_and_merged_segments_map_their_vectors_and_unmap_them_once_dropped() {
        let vectors = random_vectors(2400, 16, 12);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 600);
        index.seal();
        let sealed = index.sealed_segments();
        assert_eq!(sealed.len(), 4);
        assert!(sealed.iter().all(|s| !s.graph.is_mapped()), "built here");
        drop(sealed);
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());
        drop(index);

        let (index, missing) = reopen(dir.path(), 16, 600, 0..2400);
        assert!(missing.is_empty(), "{missing:?}");
        assert!(index.sealed_segments().iter().all(|s| s.graph.is_mapped()));
        let loaded: Vec<String> = (0..4).map(|id| format!("seg-{id}.hnsw.data")).collect();
        assert_eq!(mapped_files(dir.path()), loaded);

        // A merge serves its segment from its dump, and lets go of the merged ones' files.
        let chosen = index.segments_to_merge().expect("a full tier");
        assert_eq!(chosen, vec![0, 1, 2, 3]);
        assert!(index.try_start_merge());
        index.merge_segments(&chosen).expect("merges");
        let sealed = index.sealed_segments();
        assert_eq!(sealed.len(), 1);
        assert!(sealed[0].graph.is_mapped());
        assert_eq!(
            mapped_files(dir.path()),
            [format!("seg-{}.hnsw.data", sealed[0].id)]
        );
        drop(sealed);
        // 2,400 vectors: past the exact scan, so the mapped graph answers.
        for (id, query) in vectors.iter().enumerate().step_by(7) {
            assert_eq!(
                index.search(query, 1, &|_| true).expect("ok")[0].0,
                id as u64
            );
        }
        drop(index);
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn writes_that_land_during_a_merge_are_kept() {
        let vectors = random_vectors(600, 16, 8);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors[..400], 100);
        for id in (0..400u64).filter(|id| id % 2 == 0) {
            index.delete(id);
        }
        let chosen = index.segments_to_merge().expect("dead segments to merge");
        // Deletes and inserts land after the merge read the live vectors, before its swap.
        let during = || {
            for id in (0..400u64).filter(|id| id % 4 == 1) {
                assert!(index.delete(id));
            }
            index
                .insert_many((400..600).map(|id| (id as u64, vectors[id].as_slice())))
                .expect("inserts");
            // Written again: the copy the merge read must stay dead in the merged segment.
            for id in (0..400u64).filter(|id| id % 8 == 3) {
                index.insert(id, &vectors[id as usize]).expect("inserts");
            }
        };
        index
            .merge_segments_inner(&chosen, &during)
            .expect("merges");
        let live = |id: u64| id >= 400 || id % 4 == 3;
        assert_eq!(index.len(), (0..600u64).filter(|id| live(*id)).count());
        let live_slots: usize = index.segments().iter().map(|s| s.live_count()).sum();
        assert_eq!(live_slots, index.len(), "one live slot a key");
        for (id, query) in vectors.iter().enumerate() {
            let hits = index.search(query, 10, &|_| true).expect("ok");
            assert!(hits.iter().all(|(hit, _)| live(*hit)), "{hits:?}");
            if live(id as u64) {
                assert_eq!(hits[0].0, id as u64);
            }
        }
    }

    #[test]
    fn bad_settings_name_themselves() {
        let mut config = DenseIndexConfig::new(4);
        config.seal_vectors = 0;
        let error = DenseIndex::new(config).expect_err("refused").to_string();
        assert!(
            error.contains("seal_vectors") && error.contains("1..="),
            "{error}"
        );
    }
}
