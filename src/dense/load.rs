//! Opening an index kept in a folder: the manifest read, the segments it lists loaded and
//! verified (side by side), the damaged and the unlisted files removed, then the slots of the
//! caller's live keys marked live and the live keys found in no segment handed back.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use super::persist::{self, Manifest, SegmentEntry};
use super::segment::Segment;
use super::{validate, DenseError, DenseIndex, DenseIndexConfig};

impl DenseIndex {
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
        let (read, manifest_damaged) = read_listed_manifest(dir, config.dim);
        // A folder without a manifest (a new collection's) stays so: an absent manifest reads
        // as an empty one, and the first seal writes it.
        let absent = read.is_none();
        let listed = read.unwrap_or_default();
        persist::remove_unlisted(dir, &listed);
        let segments = load_listed_segments(dir, &listed, config.dim, config.load_threads);
        if segments.kept != listed && !absent {
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
}

/// The manifest in `dir` when it holds vectors of `dim` columns, else an empty one (`None` when
/// there is no manifest file); with 1 when it was damaged (logged), to count.
fn read_listed_manifest(dir: &Path, dim: usize) -> (Option<Manifest>, u64) {
    match persist::read_manifest(dir) {
        Ok(Some(manifest)) if manifest.dim == dim => (Some(manifest), 0),
        Ok(Some(manifest)) => {
            tracing::warn!(dir = %dir.display(), stored = manifest.dim, wanted = dim, "dense segments hold vectors of another dimension; rebuilding them");
            (Some(Manifest::default()), 0)
        }
        Ok(None) => (None, 0),
        Err(error @ DenseError::Outdated { .. }) => {
            tracing::warn!(dir = %dir.display(), %error, "rebuilding the dense segments from the stored vectors, once");
            (Some(Manifest::default()), 0)
        }
        Err(error) => {
            tracing::error!(dir = %dir.display(), %error, "the dense manifest is damaged; rebuilding the dense segments from the stored vectors");
            (Some(Manifest::default()), 1)
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
    let threads = match (threads, listed.segments.len()) {
        // One segment or none (most collections): no need to ask how many cores there are.
        (_, 0 | 1) => 1,
        (0, segments) => std::thread::available_parallelism().map_or(1, |n| n.get().min(segments)),
        (threads, segments) => threads.min(segments),
    };
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

#[cfg(test)]
mod tests {
    use super::super::test_util::{
        insert_missing_and_find_each, persisted_index, random_vectors, reopen,
    };
    use super::*;

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

    #[test]
    fn a_new_folder_gets_no_manifest_until_the_first_seal() {
        let vectors = random_vectors(3, 16, 7);
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = dir.path().join(persist::MANIFEST_FILE);
        let index = persisted_index(dir.path(), &vectors, 100);
        assert!(!manifest.exists(), "an empty index wrote a manifest");
        drop(index);
        let (reopened, mut missing) = reopen(dir.path(), 16, 100, 0..3);
        assert!(
            !manifest.exists(),
            "reopening an empty folder wrote a manifest"
        );
        missing.sort_unstable();
        assert_eq!(missing, [0, 1, 2]);
        insert_missing_and_find_each(&reopened, &missing, &vectors);
        reopened.seal();
        assert!(manifest.exists(), "the first seal lists its segment");
    }

    #[test]
    fn a_clean_close_seals_a_live_segment_only_from_its_threshold_and_the_rest_is_replayed() {
        let vectors = random_vectors(40, 16, 8);
        for (threshold, sealed) in [(41, false), (40, true)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut config = DenseIndexConfig::new(16);
            config.close_seal_min_vectors = threshold;
            let (index, _) = DenseIndex::open(dir.path(), config, &HashSet::new()).unwrap();
            let keyed = vectors.iter().enumerate();
            index
                .insert_many(keyed.map(|(id, v)| (id as u64, v.as_slice())))
                .unwrap();
            index.seal_at_close();
            assert_eq!(index.counters().seals, u64::from(sealed), "{threshold}");
            drop(index);
            let (reopened, mut missing) = reopen(dir.path(), 16, 100, 0..40);
            missing.sort_unstable();
            let expected: Vec<u64> = if sealed {
                Vec::new()
            } else {
                (0..40).collect()
            };
            assert_eq!(missing, expected, "{threshold}");
            insert_missing_and_find_each(&reopened, &missing, &vectors);
        }
    }

    /// A folder holding `vectors` (keys 0..) in sealed segments of 100, the index closed.
    fn sealed_index_dir(vectors: &[Vec<f32>]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), vectors, 100);
        index.seal();
        drop(index);
        dir
    }

    #[test]
    fn a_damaged_segment_is_dropped_and_its_live_keys_come_back_as_missing() {
        let vectors = random_vectors(200, 16, 6);
        let dir = sealed_index_dir(&vectors);
        let data = dir.path().join("seg-0.flat");
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
            !dir.path().join("seg-0.flat").exists(),
            "the old segments' files are removed"
        );
        insert_missing_and_find_each(&reopened, &missing, &vectors);
        reopened.seal();
        drop(reopened);
        let (again, missing) = reopen(dir.path(), 16, 100, 0..200);
        assert!(missing.is_empty(), "sealed in the current format");
        insert_missing_and_find_each(&again, &missing, &vectors);
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

    /// Segments read from their files (at open, or a merge's read back) are walked in their
    /// flat form: hnsw_rs's graph and the map of its data file are let go, so no dense file
    /// stays mapped (a file changed or cut under the server cannot reach a search), and the
    /// walk finds each vector's own slot.
    #[cfg(target_os = "linux")]
    #[test]
    fn loaded_and_merged_segments_are_flat_and_map_no_file() {
        let vectors = random_vectors(2400, 16, 12);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 600);
        index.seal();
        let sealed = index.sealed_segments();
        assert_eq!(sealed.len(), 4);
        assert!(sealed.iter().all(|s| s.graph().is_some()), "built here");
        drop(sealed);
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());
        drop(index);

        let (index, missing) = reopen(dir.path(), 16, 600, 0..2400);
        assert!(missing.is_empty(), "{missing:?}");
        assert!(index.sealed_segments().iter().all(|s| s.graph().is_none()));
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());

        // A merge serves its segment from its dump, read back flat.
        let chosen = index.segments_to_merge().expect("a full tier");
        assert_eq!(chosen, vec![0, 1, 2, 3]);
        assert!(index.try_start_merge());
        index.merge_segments(&chosen).expect("merges");
        let sealed = index.sealed_segments();
        assert_eq!(sealed.len(), 1);
        assert!(sealed[0].graph().is_none());
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());
        drop(sealed);
        // 2,400 vectors: past the exact scan, so the flat graph answers.
        for (id, query) in vectors.iter().enumerate().step_by(7) {
            assert_eq!(
                index.search(query, 1, &|_| true).expect("ok")[0].0,
                id as u64
            );
        }
        drop(index);
        assert_eq!(mapped_files(dir.path()), Vec::<String>::new());
    }
}
