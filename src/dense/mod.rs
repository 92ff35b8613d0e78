//! Dense vector index: HNSW graph (hnsw_rs) over unit vectors, with tombstones.
//!
//! hnsw_rs cannot delete a point, so a deleted or replaced id leaves a dead slot that searches
//! filter out; once [`DenseIndex::dead_share`] passes the configured share,
//! [`DenseIndex::needs_rebuild`] says so and [`DenseIndex::compact`] (or
//! [`DenseIndex::rebuild`]) builds a fresh graph of the live vectors.
//!
//! A collection's dense index is never saved: the section vectors are stored with the sections
//! in tantivy, the one source of truth, and the graph is rebuilt from them when the collection
//! opens (see `index::dense_upkeep`). The graph build costs about 50 s for 10k vectors on 2
//! cores (ef_construction 200): fine for small collections, a known cost for large ones.
//!
//! [`DenseIndex::save`] and [`DenseIndex::load`] keep a standalone index (the live vectors as
//! f16 and their ids, in one file of our own format, the graph rebuilt at load); the server does
//! not use them, only tests and tools that keep an index of their own.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use half::f16;
use hnsw_rs::prelude::{Distance, Hnsw};

use crate::embed::{dot, l2_normalize};

/// File holding the live vectors of a saved index.
const VECTORS_FILE_NAME: &str = "dense_vectors.bin";
/// Format name and version at the start of the vectors file.
const VECTORS_MAGIC: &[u8; 4] = b"LDV1";

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
    /// Expected number of vectors, to size tables up front.
    pub capacity_hint: usize,
    /// Share of dead slots past which [`DenseIndex::needs_rebuild`] turns true.
    pub rebuild_dead_share: f32,
}

impl DenseIndexConfig {
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            max_nb_connection: 16,
            ef_construction: 200,
            ef_search: 64,
            max_layer: 16,
            capacity_hint: 10_000,
            rebuild_dead_share: 0.25,
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

/// `1 - a·b` for unit vectors, clamped to [0, 2]. hnsw_rs's own `DistDot` asserts `a·b <= 1`,
/// which rounding breaks for a vector compared with itself, and `DistCosine` recomputes norms.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitDotDistance;

impl Distance<f32> for UnitDotDistance {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).clamp(0.0, 2.0)
    }
}

/// Approximate nearest-neighbour index of unit vectors keyed by `u64` ids.
pub struct DenseIndex {
    config: DenseIndexConfig,
    graph: Hnsw<'static, f32, UnitDotDistance>,
    /// External id of each graph slot (hnsw_rs's data id is the slot number).
    slot_ids: Vec<u64>,
    slot_live: Vec<bool>,
    /// Live slot of each live id.
    live_slots: HashMap<u64, usize>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DenseIndex")
            .field("config", &self.config)
            .field("slots", &self.slot_ids.len())
            .field("live", &self.live_slots.len())
            .finish_non_exhaustive()
    }
}

impl DenseIndex {
    pub fn new(config: DenseIndexConfig) -> Result<Self, DenseError> {
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
        let graph = new_graph(&config, config.capacity_hint);
        Ok(Self {
            config,
            graph,
            slot_ids: Vec::new(),
            slot_live: Vec::new(),
            live_slots: HashMap::new(),
        })
    }

    pub fn config(&self) -> &DenseIndexConfig {
        &self.config
    }

    /// Number of live vectors.
    pub fn len(&self) -> usize {
        self.live_slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live_slots.is_empty()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.live_slots.contains_key(&id)
    }

    /// Share of graph slots that are tombstones (0 for an empty graph).
    pub fn dead_share(&self) -> f32 {
        if self.slot_ids.is_empty() {
            return 0.0;
        }
        (self.slot_ids.len() - self.live_slots.len()) as f32 / self.slot_ids.len() as f32
    }

    /// True once the dead share passed the configured threshold.
    pub fn needs_rebuild(&self) -> bool {
        self.dead_share() > self.config.rebuild_dead_share
    }

    /// Adds `vector` under `id` (normalised here); an id already present is replaced.
    pub fn insert(&mut self, id: u64, vector: &[f32]) -> Result<(), DenseError> {
        let unit = self.checked_unit_vector(id, vector)?;
        let slot = self.claim_slot(id);
        self.graph.insert_slice((&unit, slot));
        Ok(())
    }

    /// Adds many vectors, building the graph on the rayon pool. All vectors are checked before any
    /// is added; a repeated id keeps its last vector.
    pub fn insert_many<'v>(
        &mut self,
        items: impl IntoIterator<Item = (u64, &'v [f32])>,
    ) -> Result<(), DenseError> {
        let mut units: Vec<(u64, Vec<f32>)> = Vec::new();
        for (id, vector) in items {
            units.push((id, self.checked_unit_vector(id, vector)?));
        }
        let mut batch: Vec<(&[f32], usize)> = Vec::with_capacity(units.len());
        for (id, unit) in &units {
            let slot = self.claim_slot(*id);
            batch.push((unit.as_slice(), slot));
        }
        // Slots of ids repeated inside this batch are already dead: indexing them is harmless and
        // keeps the slot numbers dense.
        self.graph.parallel_insert_slice(&batch);
        Ok(())
    }

    /// Tombstones `id`; returns whether it was live.
    pub fn delete(&mut self, id: u64) -> bool {
        match self.live_slots.remove(&id) {
            Some(slot) => {
                self.slot_live[slot] = false;
                true
            }
            None => false,
        }
    }

    /// The `k` live vectors most similar to `query` (cosine) among ids that `filter` accepts,
    /// best first. Fewer come back when the filter rejects much of the graph.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filter: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<(u64, f32)>, DenseError> {
        if query.len() != self.config.dim {
            return Err(DenseError::DimensionMismatch {
                expected: self.config.dim,
                got: query.len(),
            });
        }
        if k == 0 || self.live_slots.is_empty() {
            return Ok(Vec::new());
        }
        let mut unit = query.to_vec();
        l2_normalize(&mut unit);
        let accept = |slot: &usize| {
            let live = self.slot_live.get(*slot).copied().unwrap_or(false);
            live && filter(self.slot_ids[*slot])
        };
        let ef = self.config.ef_search.max(k);
        let neighbours = self.graph.search_filter(&unit, k, ef, Some(&accept));
        let mut hits: Vec<(u64, f32)> = neighbours
            .iter()
            .filter(|neighbour| accept(&neighbour.d_id))
            .map(|neighbour| (self.slot_ids[neighbour.d_id], 1.0 - neighbour.distance))
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hits.truncate(k);
        Ok(hits)
    }

    /// Replaces the whole content by `live` (a fresh graph, no tombstones).
    pub fn rebuild(
        &mut self,
        live: impl IntoIterator<Item = (u64, Vec<f32>)>,
    ) -> Result<(), DenseError> {
        let mut fresh = Self::new(self.config.clone())?;
        let live: Vec<(u64, Vec<f32>)> = live.into_iter().collect();
        fresh.graph = new_graph(&self.config, live.len().max(self.config.capacity_hint));
        fresh.insert_many(live.iter().map(|(id, vector)| (*id, vector.as_slice())))?;
        *self = fresh;
        Ok(())
    }

    /// Rebuilds the graph from its own live vectors, dropping tombstones.
    pub fn compact(&mut self) -> Result<(), DenseError> {
        let live = self.live_vectors();
        self.rebuild(live)
    }

    /// Copies of the live vectors with their ids, in no particular order.
    pub fn live_vectors(&self) -> Vec<(u64, Vec<f32>)> {
        let mut live = Vec::with_capacity(self.live_slots.len());
        // hnsw_rs's point iterator unwraps the entry point: only walk a non-empty graph.
        if self.graph.get_nb_point() == 0 {
            return live;
        }
        for point in self.graph.get_point_indexation() {
            let slot = point.get_origin_id();
            if self.slot_live.get(slot).copied().unwrap_or(false) {
                live.push((self.slot_ids[slot], point.get_v().to_vec()));
            }
        }
        live
    }

    /// Writes the live vectors and ids to `dir` (created if missing), atomically replacing an
    /// earlier save.
    pub fn save(&self, dir: &Path) -> Result<(), DenseError> {
        std::fs::create_dir_all(dir).map_err(|error| DenseError::io(dir, error))?;
        let final_path = dir.join(VECTORS_FILE_NAME);
        let temporary_path = dir.join(format!("{VECTORS_FILE_NAME}.tmp"));
        let live = self.live_vectors();
        let write = || -> std::io::Result<()> {
            let file = File::create(&temporary_path)?;
            let mut writer = BufWriter::new(file);
            writer.write_all(VECTORS_MAGIC)?;
            writer.write_all(&(self.config.dim as u32).to_le_bytes())?;
            writer.write_all(&(live.len() as u64).to_le_bytes())?;
            for (id, vector) in &live {
                writer.write_all(&id.to_le_bytes())?;
                for &x in vector {
                    writer.write_all(&f16::from_f32(x).to_le_bytes())?;
                }
            }
            let file = writer.into_inner().map_err(|error| error.into_error())?;
            file.sync_all()
        };
        write().map_err(|error| DenseError::io(&temporary_path, error))?;
        std::fs::rename(&temporary_path, &final_path)
            .map_err(|error| DenseError::io(&final_path, error))
    }

    /// Loads what [`Self::save`] wrote into `dir` and rebuilds the graph. `config.dim` must match
    /// the saved vectors.
    pub fn load(dir: &Path, config: DenseIndexConfig) -> Result<Self, DenseError> {
        let path = dir.join(VECTORS_FILE_NAME);
        let file = File::open(&path).map_err(|error| DenseError::io(&path, error))?;
        let file_len = file
            .metadata()
            .map_err(|error| DenseError::io(&path, error))?
            .len();
        let mut reader = BufReader::new(file);
        let mut header = [0u8; 16];
        reader
            .read_exact(&mut header)
            .map_err(|_| DenseError::corrupt(&path, "shorter than its header"))?;
        if &header[..4] != VECTORS_MAGIC {
            return Err(DenseError::corrupt(&path, "wrong magic bytes"));
        }
        let dim = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let count = u64::from_le_bytes([
            header[8], header[9], header[10], header[11], header[12], header[13], header[14],
            header[15],
        ]);
        if dim != config.dim {
            return Err(DenseError::DimensionMismatch {
                expected: config.dim,
                got: dim,
            });
        }
        let record_len = 8 + 2 * dim as u64;
        if count
            .checked_mul(record_len)
            .and_then(|body| body.checked_add(16))
            != Some(file_len)
        {
            return Err(DenseError::corrupt(
                &path,
                format!("{file_len} bytes do not hold {count} vectors of {dim}"),
            ));
        }
        let mut record = vec![0u8; record_len as usize];
        let mut live = Vec::with_capacity(count as usize);
        for _ in 0..count {
            reader
                .read_exact(&mut record)
                .map_err(|error| DenseError::io(&path, error))?;
            let mut id_bytes = [0u8; 8];
            id_bytes.copy_from_slice(&record[..8]);
            let vector: Vec<f32> = record[8..]
                .chunks_exact(2)
                .map(|half| f16::from_le_bytes([half[0], half[1]]).to_f32())
                .collect();
            live.push((u64::from_le_bytes(id_bytes), vector));
        }
        let mut index = Self::new(config)?;
        index.rebuild(live)?;
        Ok(index)
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

    /// Gives `id` a new slot, tombstoning its previous one.
    fn claim_slot(&mut self, id: u64) -> usize {
        let slot = self.slot_ids.len();
        self.slot_ids.push(id);
        self.slot_live.push(true);
        if let Some(previous) = self.live_slots.insert(id, slot) {
            self.slot_live[previous] = false;
        }
        slot
    }
}

fn new_graph(config: &DenseIndexConfig, capacity: usize) -> Hnsw<'static, f32, UnitDotDistance> {
    Hnsw::new(
        config.max_nb_connection,
        capacity.max(1),
        config.max_layer,
        config.ef_construction,
        UnitDotDistance,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .map(|(id, v)| (id as u64, dot(v, query)))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored.into_iter().take(k).map(|(id, _)| id).collect()
    }

    fn small_index(vectors: &[Vec<f32>]) -> DenseIndex {
        let mut index =
            DenseIndex::new(DenseIndexConfig::new(vectors[0].len())).expect("valid config");
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
            assert!((hits[0].1 - 1.0).abs() < 1e-5);
            let ids: Vec<u64> = hits.iter().map(|h| h.0).collect();
            assert_eq!(ids, exact_top(&vectors, &vectors[query_id], 5, &|_| false));
        }
    }

    #[test]
    fn deleted_ids_never_come_back() {
        let vectors = random_vectors(200, 16, 2);
        let mut index = small_index(&vectors);
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

    #[test]
    fn filters_and_replacements_are_respected() {
        let vectors = random_vectors(100, 16, 3);
        let mut index = small_index(&vectors);
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
        let mut index = DenseIndex::new(DenseIndexConfig::new(4)).expect("valid");
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

    #[test]
    fn save_and_load_give_the_same_results() {
        let vectors = random_vectors(500, 64, 4);
        let mut index = small_index(&vectors);
        index.delete(7);
        let dir = tempfile::tempdir().expect("tempdir");
        index.save(dir.path()).expect("saves");
        let loaded = DenseIndex::load(dir.path(), DenseIndexConfig::new(64)).expect("loads");
        assert_eq!(loaded.len(), 499);
        assert!(!loaded.contains(7));
        for query in vectors.iter().step_by(25) {
            let before = index.search(query, 5, &|_| true).expect("ok");
            let after = loaded.search(query, 5, &|_| true).expect("ok");
            let before_ids: Vec<u64> = before.iter().map(|h| h.0).collect();
            let after_ids: Vec<u64> = after.iter().map(|h| h.0).collect();
            assert_eq!(before_ids, after_ids);
            for (b, a) in before.iter().zip(&after) {
                assert!(
                    (b.1 - a.1).abs() < 2e-3,
                    "f16 storage moved a similarity too far"
                );
            }
        }
        assert!(matches!(
            DenseIndex::load(dir.path(), DenseIndexConfig::new(32)),
            Err(DenseError::DimensionMismatch { .. })
        ));
    }

    #[test]
    fn corrupt_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(VECTORS_FILE_NAME);
        for bytes in [
            &b""[..],
            b"LDV1",
            b"XXXX\x04\0\0\0\x01\0\0\0\0\0\0\0",
            b"LDV1\x04\0\0\0\x09\0\0\0\0\0\0\0abc",
        ] {
            std::fs::write(&path, bytes).expect("write");
            assert!(DenseIndex::load(dir.path(), DenseIndexConfig::new(4)).is_err());
        }
        assert!(DenseIndex::load(&dir.path().join("missing"), DenseIndexConfig::new(4)).is_err());
    }
}
