//! The mechanics of a merge: the live vectors of the chosen sealed segments read, a graph built
//! of them without the writer lock, dumped and read back, and swapped in under the lock, where a
//! key moves to the merged segment only if it still lives where the merge read it. Which
//! segments to merge is `merge_policy`'s to say.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::merge_policy::{self, SegmentStats};
use super::persist::{self, SegmentEntry};
use super::segment::Segment;
use super::{DenseError, DenseIndex, StoredElement, WriterSide, EXHAUSTIVE_SEARCH_SLOTS};

/// Where a key's vector is: a segment and a slot in it.
type Location = (Arc<Segment>, usize);

impl DenseIndex {
    /// Seals the live segment and merges every sealed segment into one, dropping tombstones.
    pub fn compact(&self) -> Result<(), DenseError> {
        self.seal();
        let ids: Vec<u64> = self.sealed_segments().iter().map(|s| s.id).collect();
        self.merge_segments(&ids)
    }

    /// The sealed segments worth merging now, if any: those past the dead share; else the
    /// segments of the lowest tier holding [`TIER_MERGE_FACTOR`] or more, so that segments grow
    /// by that factor (a search walks one graph per segment, and one large graph costs far less
    /// than many small ones); else, past `MAX_SEALED_SEGMENTS`, the smallest. Segments of more
    /// than a `TIER_MERGE_FACTOR`th of `max_segment_vectors` merge no more. The choice is
    /// `merge_policy::choose`'s, from each segment's size and dead share alone.
    ///
    /// [`TIER_MERGE_FACTOR`]: super::TIER_MERGE_FACTOR
    pub fn segments_to_merge(&self) -> Option<Vec<u64>> {
        let sealed: Vec<SegmentStats> = self
            .sealed_segments()
            .iter()
            .map(|s| SegmentStats {
                id: s.id,
                live: s.live_count(),
                dead_share: s.dead_share(),
            })
            .collect();
        merge_policy::choose(&sealed, &self.config)
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
        if chosen.is_empty() || self.files_are_closed() {
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
        if let Some(files) = self.files() {
            for entry in &removed_entries {
                persist::remove_segment_files(files.dir, entry);
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
        merged.building_graph().parallel_insert_slice(&batch);
        merged
    }

    /// Dumps a non-empty merged segment into the index's folder; None in memory, when it is
    /// empty or when writing fails (logged and counted: it stays in memory).
    fn dump_merged_segment(&self, merged: &Segment) -> Option<SegmentEntry> {
        let files = self.files()?;
        if merged.reserved() == 0 {
            return None;
        }
        match persist::dump_segment(files.dir, merged) {
            Ok(entry) => Some(entry),
            Err(error) => {
                tracing::error!(%error, "writing a merged dense segment failed; it stays in memory");
                self.count_persist_failure();
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
        let Some(files) = self.files() else {
            return Vec::new();
        };
        let dir = files.dir;
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
                self.count_persist_failure();
                removed_entries.clear();
            }
        }
        removed_entries
    }
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
    use super::super::test_util::{persisted_index, random_vectors, reopen};
    use super::*;

    fn ids_of(hits: &[(u64, f32)]) -> Vec<u64> {
        hits.iter().map(|hit| hit.0).collect()
    }

    /// Checks that the 10 nearest of every vector (under its position's key) are all `live`,
    /// a live one's own key first.
    fn find_only_the_live(index: &DenseIndex, vectors: &[Vec<f32>], live: &dyn Fn(u64) -> bool) {
        for (id, query) in vectors.iter().enumerate() {
            let hits = index.search(query, 10, &|_| true).expect("ok");
            assert!(hits.iter().all(|(hit, _)| live(*hit)), "{hits:?}");
            if live(id as u64) {
                assert_eq!(hits[0].0, id as u64);
            }
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
        assert!(!dir.path().join("seg-0.flat").exists());
        let live = |id: u64| id >= 200 || id % 2 == 1;
        find_only_the_live(&index, &vectors, &live);
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

    /// A delete renames the collection's folder away once the files are closed: a seal or a
    /// merge after that works in memory and never writes (or recreates the folder), while the
    /// index still answers.
    #[test]
    fn once_its_files_are_closed_seals_and_merges_write_nothing() {
        let vectors = random_vectors(400, 16, 9);
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("dense");
        let index = persisted_index(&dir, &vectors[..300], 100);
        for id in (0..200u64).filter(|id| id % 2 == 0) {
            index.delete(id);
        }
        let chosen = index.segments_to_merge().expect("dead segments to merge");
        index.close_files();
        std::fs::rename(&dir, root.path().join("gone")).expect("rename");
        index
            .insert_many((300..400u64).map(|id| (id, vectors[id as usize].as_slice())))
            .expect("inserts");
        index.seal();
        assert!(index.try_start_merge());
        index
            .merge_segments(&chosen)
            .expect("a closed merge is no error");
        assert!(!dir.exists(), "the folder was recreated");
        assert_eq!(index.counters().merges, 0);
        assert_eq!(index.len(), 300);
        assert_eq!(
            ids_of(&index.search(&vectors[399], 1, &|_| true).expect("ok")),
            vec![399]
        );

        // A refused delete reopens them: the next seal is written again.
        std::fs::rename(root.path().join("gone"), &dir).expect("rename back");
        index.reopen_files();
        index.seal();
        let manifest = persist::read_manifest(&dir).expect("reads").expect("there");
        assert!(manifest.segments.iter().any(|s| s.id >= 3), "{manifest:?}");
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
        find_only_the_live(&index, &vectors, &live);
    }
}
