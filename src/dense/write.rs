//! The writer side's work on the live segment: inserts (checked, normalised, quantized, put in
//! the graph and published slot by slot), deletes (tombstones), and seals, which persist every
//! sealed segment not yet on disk and list it in the manifest. All of it under the writer lock.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};

use super::segment::Segment;
use super::{locate, persist, to_stored, DenseError, DenseIndex, Files, StoredElement, WriterSide};
use crate::embed::l2_normalize;

impl DenseIndex {
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
                live.building_graph().insert_slice(graph_batch[0]);
            } else {
                live.building_graph().parallel_insert_slice(&graph_batch);
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

    /// Seals the live segment (persisting it when the index has a folder), unless it is empty.
    /// A seal never fails: a segment whose files cannot be written stays in memory, is counted,
    /// and is tried again at the next seal; its keys are replayed at the next open meanwhile.
    pub fn seal(&self) {
        let mut writer = self.writer_side();
        self.seal_locked(&mut writer);
    }

    /// [`Self::seal`] at a clean close, except that a live segment of fewer than
    /// `close_seal_min_vectors` stays unsealed: the next open inserts its vectors again from the
    /// stored ones, which costs less than writing its files, and a collection closed and opened
    /// often does not gather a tiny segment at each close.
    pub fn seal_at_close(&self) {
        let mut writer = self.writer_side();
        if self.live_segment().reserved() >= self.config.close_seal_min_vectors {
            self.seal_locked(&mut writer);
        } else {
            self.persist_sealed(&mut writer);
        }
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

    /// Stops every later change to the index's files, once the changes under way (a seal's or
    /// a merge's dump, a manifest write) have ended: from then on seals and merges go on in
    /// memory only. Before its collection's folder is deleted or renamed away, so that no
    /// background task recreates it (or writes into a new collection of the same name).
    pub fn close_files(&self) {
        *self
            .files_closed
            .write()
            .unwrap_or_else(PoisonError::into_inner) = true;
    }

    /// Undoes [`Self::close_files`] (a delete the filesystem refused: the collection stays).
    pub fn reopen_files(&self) {
        *self
            .files_closed
            .write()
            .unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Whether [`Self::close_files`] ran (and no reopen since).
    pub fn files_are_closed(&self) -> bool {
        *self
            .files_closed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The index's folder, to change its files in while the returned guard lives; `None` when
    /// the index is in memory only or its files are closed.
    pub(super) fn files(&self) -> Option<Files<'_>> {
        let dir = self.dir.as_deref()?;
        let closed = self
            .files_closed
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        (!*closed).then_some(Files { dir, _open: closed })
    }

    /// Writes every sealed segment not yet on disk and lists them in the manifest.
    fn persist_sealed(&self, writer: &mut MutexGuard<'_, WriterSide>) {
        let Some(files) = self.files() else {
            return;
        };
        let dir = files.dir;
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
                    self.count_persist_failure();
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
                self.count_persist_failure();
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

    fn checked_unit_vector(&self, id: u64, vector: &[f32]) -> Result<Vec<f32>, DenseError> {
        self.check_dimension(vector)?;
        if !vector.iter().all(|x| x.is_finite()) {
            return Err(DenseError::NonFiniteVector { id });
        }
        let mut unit = vector.to_vec();
        l2_normalize(&mut unit);
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{random_vectors, small_index};

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
}
