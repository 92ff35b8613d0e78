//! One segment of a dense index: an hnsw graph of a fixed number of slots, the key each slot
//! holds and whether it is live. Readers need no lock: a slot's key is written before its graph
//! insert, and its live flag is set (and cleared) with atomic stores, so a search filters on
//! plain loads while the writer inserts (hnsw_rs's `insert_slice` and `search_filter` take `&self`
//! and lock internally).

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use hnsw_rs::prelude::{Hnsw, HnswIo, ReloadOptions};

use super::flat::FlatGraph;
use super::{
    from_stored, DenseIndexConfig, StoredElement, UnitDotDistance, EXHAUSTIVE_SEARCH_SLOTS,
};

/// The graph of one segment as hnsw_rs types it. A graph built here owns its vectors; a loaded
/// one borrows them from its mapped data file, which [`SegmentGraph`] keeps alive for it.
pub type Graph = Hnsw<'static, StoredElement, UnitDotDistance>;

/// A segment's graph and, for a graph loaded from its dump, the `HnswIo` that holds the memory
/// map of the dump's data file: the vectors stay in the page cache, where the kernel may drop
/// them, rather than in the process's own memory.
///
/// hnsw_rs's loaded graph borrows the `HnswIo` (`Hnsw<'b>`). The two are kept together here,
/// the borrow typed `'static`, and dropped in order: the graph, then the map. Nothing taken from
/// the graph (an `Arc<Point>` of its point iterator) may outlive it; the dense module only
/// reads points within a borrow of their segment.
pub struct SegmentGraph {
    graph: ManuallyDrop<Graph>,
    /// Leaked from a `Box` by [`SegmentGraph::load_mapped`], freed by `drop` after the graph.
    mapping: Option<NonNull<HnswIo>>,
}

// SAFETY: the graph is `Send` and `Sync` itself (hnsw_rs locks internally; asserted below), and
// the mapped vectors it reads are never written. The `HnswIo` is touched only by `drop`, which
// has the value to itself, and it is `Send` (asserted below).
unsafe impl Send for SegmentGraph {}
unsafe impl Sync for SegmentGraph {}

const _: () = {
    const fn assert_send<T: Send>() {}
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send::<HnswIo>();
    assert_send_sync::<Graph>();
};

impl SegmentGraph {
    /// A graph that owns its vectors (built in this process).
    pub fn owned(graph: Graph) -> Self {
        Self {
            graph: ManuallyDrop::new(graph),
            mapping: None,
        }
    }

    /// Loads the dump `basename` in `dir`, the vectors mapped from its data file. hnsw_rs
    /// panics rather than failing on some malformed dumps: a panic is an error here too.
    pub fn load_mapped(dir: &Path, basename: &str) -> anyhow::Result<Self> {
        let options = ReloadOptions::default().set_mmap(true);
        let loader = Box::new(HnswIo::new_with_options(dir, basename, options));
        let mapping = NonNull::from(Box::leak(loader));
        let loaded = crate::panic_log::catch(|| {
            // SAFETY: the loader stays allocated, and is not touched, until `drop` frees it,
            // after the graph that borrows it.
            let loader: &'static mut HnswIo = unsafe { &mut *mapping.as_ptr() };
            loader.load_hnsw::<StoredElement, UnitDotDistance>()
        })
        .unwrap_or_else(|panic| {
            Err(anyhow::anyhow!(
                "hnsw_rs could not read the dump `{basename}` in {} (it panicked: {panic})",
                dir.display()
            ))
        });
        match loaded {
            Ok(graph) => Ok(Self {
                graph: ManuallyDrop::new(graph),
                mapping: Some(mapping),
            }),
            Err(error) => {
                // SAFETY: no graph borrows the loader any more (a partial one was dropped
                // with the error or the unwinding).
                drop(unsafe { Box::from_raw(mapping.as_ptr()) });
                Err(error)
            }
        }
    }
}

impl Deref for SegmentGraph {
    type Target = Graph;

    fn deref(&self) -> &Graph {
        &self.graph
    }
}

impl Drop for SegmentGraph {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and never used after.
        unsafe { ManuallyDrop::drop(&mut self.graph) };
        if let Some(mapping) = self.mapping.take() {
            // SAFETY: leaked by `load_mapped`; the graph, its only borrower, is gone.
            drop(unsafe { Box::from_raw(mapping.as_ptr()) });
        }
    }
}

/// How a segment's vectors are searched: hnsw_rs's graph while the segment is built in this
/// process (it takes inserts, and is what its files are written from), the flat form once it
/// was read from its files (loaded at open, or a merge's result read back).
pub enum Walk {
    Hnsw(SegmentGraph),
    Flat(FlatGraph),
}

/// The dimension of `graph`'s vectors (0 for a graph without points).
pub fn graph_dim(graph: &Graph) -> usize {
    if graph.get_nb_point() > 0 {
        graph.get_point_indexation().get_data_dimension()
    } else {
        0
    }
}

pub struct Segment {
    /// Unique within the index, never reused: names the segment's files.
    pub id: u64,
    pub walk: Walk,
    /// The key of each slot (hnsw_rs's data id is the slot number).
    slot_keys: Vec<AtomicU64>,
    slot_live: Vec<AtomicBool>,
    /// The handed-out slots sorted by key, set once the segment takes no more keys (sealed,
    /// loaded or merged): how the index's writer side finds a key's slot in it, at 4 bytes a
    /// slot (a map of every key to its place took 52 MB at a million).
    key_order: OnceLock<Box<[u32]>>,
    /// Slots handed out so far (only the index's writer side hands them out).
    reserved: AtomicUsize,
    /// Live slots.
    live: AtomicUsize,
    /// Set once the segment's files are on disk and listed in the manifest.
    persisted: AtomicBool,
    /// The unit vectors of the first [`EXHAUSTIVE_SEARCH_SLOTS`] slots, each set before its slot
    /// goes live: a segment that small is searched by scanning them (see [`Segment::nearest`]).
    small_vectors: Vec<OnceLock<Box<[f32]>>>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Segment")
            .field("id", &self.id)
            .field("slots", &self.reserved())
            .field("live", &self.live_count())
            .finish_non_exhaustive()
    }
}

impl Segment {
    /// An empty segment of `capacity` slots with a fresh graph.
    pub fn empty(id: u64, config: &DenseIndexConfig, capacity: usize) -> Self {
        let graph = Hnsw::new(
            config.max_nb_connection,
            capacity.max(1),
            config.max_layer,
            config.ef_construction,
            UnitDotDistance,
        );
        Self::with_graph(id, SegmentGraph::owned(graph), vec![0; capacity], false)
    }

    /// A segment over `graph` whose slots hold `keys`, every slot dead until marked live. A
    /// `filled` graph (read from its files) takes no inserts: it is kept in its flat form, and
    /// hnsw_rs's (with the map of its data file) is dropped.
    pub fn with_graph(id: u64, graph: SegmentGraph, keys: Vec<u64>, filled: bool) -> Self {
        let walk = if filled {
            Walk::Flat(FlatGraph::from_graph(&graph, keys.len(), graph_dim(&graph)))
        } else {
            Walk::Hnsw(graph)
        };
        Self::with_walk(id, walk, keys, filled)
    }

    /// A segment read from its flat file, whose slots hold `keys`, every slot dead until marked
    /// live.
    pub fn with_flat(id: u64, flat: FlatGraph, keys: Vec<u64>) -> Self {
        Self::with_walk(id, Walk::Flat(flat), keys, true)
    }

    fn with_walk(id: u64, walk: Walk, keys: Vec<u64>, filled: bool) -> Self {
        let capacity = keys.len();
        let segment = Self {
            id,
            walk,
            slot_keys: keys.into_iter().map(AtomicU64::new).collect(),
            slot_live: (0..capacity).map(|_| AtomicBool::new(false)).collect(),
            key_order: OnceLock::new(),
            reserved: AtomicUsize::new(if filled { capacity } else { 0 }),
            live: AtomicUsize::new(0),
            persisted: AtomicBool::new(false),
            small_vectors: (0..capacity.min(EXHAUSTIVE_SEARCH_SLOTS))
                .map(|_| OnceLock::new())
                .collect(),
        };
        // A small loaded graph: keep its vectors for the exact scan (nothing inserts meanwhile).
        if let Walk::Flat(flat) = &segment.walk {
            if capacity <= EXHAUSTIVE_SEARCH_SLOTS {
                for slot in 0..flat.slots() {
                    if let Some(codes) = flat.codes(slot) {
                        segment.keep_vector(slot, codes);
                    }
                }
            }
        }
        if filled {
            segment.order_keys();
        }
        segment
    }

    /// Sorts the handed-out slots by key, for [`Segment::live_slot_of`]; call once the segment
    /// takes no more keys (a later call changes nothing).
    pub fn order_keys(&self) {
        self.key_order.get_or_init(|| {
            let reserved = self.reserved();
            // Slots are hnsw_rs data ids below a segment's capacity, far from `u32::MAX`.
            debug_assert!(u32::try_from(reserved).is_ok());
            let mut order: Box<[u32]> = (0..reserved as u32).collect();
            order.sort_unstable_by_key(|&slot| self.key(slot as usize));
            order
        });
    }

    /// The live slot holding `key`, found by binary search in the key order; `None` when no
    /// live slot holds it or the keys are not ordered yet (a live segment).
    pub fn live_slot_of(&self, key: u64) -> Option<usize> {
        let order = self.key_order.get()?;
        let first = order.partition_point(|&slot| self.key(slot as usize) < key);
        order[first..]
            .iter()
            .map(|&slot| slot as usize)
            .take_while(|&slot| self.key(slot) == key)
            .find(|&slot| self.is_live(slot))
    }

    /// Keeps `slot`'s vector, widened, for the exact scan (a no-op past the first
    /// [`EXHAUSTIVE_SEARCH_SLOTS`] slots); call before the slot goes live. The scan reads the
    /// stored values, as the graph does, whether the segment was built here or loaded.
    pub fn keep_vector(&self, slot: usize, stored: &[StoredElement]) {
        if let Some(cell) = self.small_vectors.get(slot) {
            let _ = cell.set(from_stored(stored).into_boxed_slice());
        }
    }

    /// The `k` live slots `accept`ed nearest to `unit` by a scan of every vector, best first,
    /// as (slot, cosine); `None` when the segment is too large for a scan (use the graph).
    /// Exact, so the same on every replica whatever order the graph was built in.
    pub fn nearest(
        &self,
        unit: &[f32],
        k: usize,
        accept: &dyn Fn(usize) -> bool,
    ) -> Option<Vec<(usize, f32)>> {
        let reserved = self.reserved();
        if reserved > self.small_vectors.len() {
            return None;
        }
        let mut scored: Vec<(usize, f32)> = Vec::with_capacity(reserved);
        for (slot, cell) in self.small_vectors[..reserved].iter().enumerate() {
            let Some(vector) = cell.get() else { continue };
            if self.is_live(slot) && accept(slot) {
                let dot = vector.iter().zip(unit).map(|(a, b)| a * b).sum::<f32>();
                scored.push((slot, dot));
            }
        }
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        Some(scored)
    }

    pub fn capacity(&self) -> usize {
        self.slot_keys.len()
    }

    /// Slots handed out (live or dead).
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    pub fn free(&self) -> usize {
        self.capacity() - self.reserved()
    }

    pub fn live_count(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Share of handed-out slots that are dead.
    pub fn dead_share(&self) -> f32 {
        let reserved = self.reserved();
        if reserved == 0 {
            return 0.0;
        }
        (reserved - self.live_count()) as f32 / reserved as f32
    }

    pub fn is_persisted(&self) -> bool {
        self.persisted.load(Ordering::Acquire)
    }

    pub fn mark_persisted(&self) {
        self.persisted.store(true, Ordering::Release);
    }

    /// Hands out the next `count` slots for `keys` (still dead); their first slot.
    /// The caller is the only one handing out slots (the index's writer side).
    pub fn reserve(&self, keys: &[u64]) -> usize {
        let first = self.reserved();
        for (offset, key) in keys.iter().enumerate() {
            self.slot_keys[first + offset].store(*key, Ordering::Release);
        }
        self.reserved.store(first + keys.len(), Ordering::Release);
        first
    }

    pub fn key(&self, slot: usize) -> u64 {
        self.slot_keys[slot].load(Ordering::Acquire)
    }

    pub fn is_live(&self, slot: usize) -> bool {
        self.slot_live
            .get(slot)
            .is_some_and(|live| live.load(Ordering::Acquire))
    }

    pub fn set_live(&self, slot: usize) {
        if !self.slot_live[slot].swap(true, Ordering::AcqRel) {
            self.live.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub fn set_dead(&self, slot: usize) {
        if self.slot_live[slot].swap(false, Ordering::AcqRel) {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The keys of the live slots, in slot order.
    pub fn live_keys(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.reserved())
            .filter(|&slot| self.is_live(slot))
            .map(|slot| self.key(slot))
    }

    /// The keys of every handed-out slot, in slot order.
    pub fn keys(&self) -> Vec<u64> {
        (0..self.reserved()).map(|slot| self.key(slot)).collect()
    }

    /// hnsw_rs's graph of a segment built in this process (made by [`Segment::empty`]: the
    /// live segment, a merge's result before it is read back); `None` for a flat one.
    pub fn graph(&self) -> Option<&SegmentGraph> {
        match &self.walk {
            Walk::Hnsw(graph) => Some(graph),
            Walk::Flat(_) => None,
        }
    }

    /// The graph of a segment made by [`Segment::empty`], to insert into.
    pub fn building_graph(&self) -> &SegmentGraph {
        self.graph()
            .expect("a segment made by Segment::empty holds hnsw_rs's graph")
    }

    /// Copies of the live vectors with their slots, as stored.
    pub fn live_vectors(&self) -> Vec<(usize, Vec<StoredElement>)> {
        let mut live = Vec::with_capacity(self.live_count());
        match &self.walk {
            Walk::Flat(flat) => {
                for slot in 0..flat.slots() {
                    if let Some(codes) = flat.codes(slot).filter(|_| self.is_live(slot)) {
                        live.push((slot, codes.to_vec()));
                    }
                }
            }
            // hnsw_rs's point iterator unwraps the entry point: only walk a non-empty graph.
            Walk::Hnsw(graph) if graph.get_nb_point() > 0 => {
                for point in graph.get_point_indexation() {
                    let slot = point.get_origin_id();
                    if self.is_live(slot) {
                        live.push((slot, point.get_v().to_vec()));
                    }
                }
            }
            Walk::Hnsw(_) => {}
        }
        live
    }
}
