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
//!
//! # Files
//! `mod.rs` is the index's public face: its types, its settings, the segment list and the
//! writer lock, and the few reads every side shares. The work is in rooms of their own:
//! `search` (the search and its wait metrics), `write` (inserts, deletes, seals and their
//! persisting), `merge` (the mechanics of a merge: read, build, dump, swap), `merge_policy`
//! (which segments to merge, from their sizes and dead shares alone), `load` (open: the manifest,
//! the segments it lists, the live keys); below them `segment` (one graph and its slots),
//! `element` (the int8 codes and their distance) and `persist` (the files and the manifest).

mod element;
mod flat;
mod flat_file;
mod load;
mod merge;
mod merge_policy;
mod persist;
mod scrub;
mod search;
mod segment;
#[cfg(test)]
mod test_util;
mod write;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

pub use element::{from_stored, query_elements, to_stored, StoredElement, UnitDotDistance};
pub use load::LoadedIndex;
pub use merge_policy::TIER_MERGE_FACTOR;
use persist::Manifest;
pub use persist::{listed_files, MANIFEST_FILE};
pub use search::{EXHAUSTIVE_SEARCH_SLOTS, SEARCH_WAIT_MAX_SECONDS, SEARCH_WAIT_SECONDS};
use segment::Segment;

/// Largest allowed `seal_vectors`: a live segment preallocates its slot tables.
pub const MAX_SEAL_VECTORS: usize = 10_000_000;

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
    /// A clean close seals the live segment only when it holds at least this many vectors
    /// (see [`DenseIndex::seal_at_close`]).
    pub close_seal_min_vectors: usize,
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
            close_seal_min_vectors: 1,
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
    /// True once [`Self::close_files`] ran: no file of the index is written or removed again.
    /// Held shared while a seal or merge changes files, so that closing waits for them.
    files_closed: RwLock<bool>,
    counters: AtomicCounters,
}

/// The folder of a [`DenseIndex`], held open against [`DenseIndex::close_files`] while it lives.
struct Files<'a> {
    dir: &'a Path,
    _open: std::sync::RwLockReadGuard<'a, bool>,
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
            files_closed: RwLock::new(false),
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

    /// Live vectors of each segment, oldest first, the live segment last.
    pub fn segment_sizes(&self) -> Vec<usize> {
        self.segments().iter().map(|s| s.live_count()).collect()
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

    /// An error unless `vector` has the index's dimensions.
    fn check_dimension(&self, vector: &[f32]) -> Result<(), DenseError> {
        if vector.len() != self.config.dim {
            return Err(DenseError::DimensionMismatch {
                expected: self.config.dim,
                got: vector.len(),
            });
        }
        Ok(())
    }

    /// Counts a seal or merge whose files (or the manifest listing them) could not be written.
    fn count_persist_failure(&self) {
        self.counters
            .persist_failures
            .fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::test_util::{random_vectors, reopen};
    use super::*;

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
