//! What the queue tells: operations as they stand (with a running one's progress and the time
//! left), whether a write is visible yet, and the waits on both.

use redb::{ReadableDatabase, ReadableTable};

use super::{codec, proto, AtQueue, Depth, State, WriteQueue, OPERATIONS};
use crate::error::Result;
use crate::types::{Operation, OperationState};

impl WriteQueue {
    /// The operation `id`, with its progress when running; `None` when unknown (never queued
    /// here, or pruned).
    pub fn operation(&self, id: u64) -> Result<Option<Operation>> {
        let txn = self.db.begin_read().at(&self.path)?;
        let operations = txn.open_table(OPERATIONS).at(&self.path)?;
        let Some(record) = operations.get(id).at(&self.path)? else {
            return Ok(None);
        };
        let record = codec::decode_record(record.value())?;
        Ok(Some(self.with_progress(&self.lock(), id, &record)))
    }

    /// Up to `limit` operations of `collection`, newest first.
    pub fn operations(&self, collection: &str, limit: usize) -> Result<Vec<Operation>> {
        let txn = self.db.begin_read().at(&self.path)?;
        let table = txn.open_table(OPERATIONS).at(&self.path)?;
        let mut found = Vec::new();
        for entry in table.iter().at(&self.path)?.rev() {
            let (id, record) = entry.at(&self.path)?;
            let record = codec::decode_record(record.value())?;
            if record.collection == collection {
                found.push((id.value(), record));
                if found.len() == limit {
                    break;
                }
            }
        }
        let state = self.lock();
        Ok(found
            .iter()
            .map(|(id, record)| self.with_progress(&state, *id, record))
            .collect())
    }

    /// The record as it stands, with what only memory knows: a running operation's progress,
    /// and for a pending one, the time left at the collection's recent rate.
    pub(super) fn with_progress(
        &self,
        state: &State,
        id: u64,
        record: &proto::OperationRecord,
    ) -> Operation {
        let mut operation = codec::operation(id, record);
        if operation.state.ended() {
            return operation;
        }
        let running = state.running.get(&id);
        if let Some(running) = running {
            operation.state = OperationState::Running;
            operation.started_unix_ms = running.started_unix_ms;
            operation.documents_done = running.documents_done;
            operation.bytes_done = running.bytes_done;
            if let Some(error) = &running.retrying {
                operation.error = format!("retrying: {error}");
            }
            let seconds = running.started.elapsed().as_secs_f64();
            if seconds > 0.0 {
                operation.bytes_per_second = running.bytes_done as f64 / seconds;
            }
        }
        let rate = match operation.bytes_per_second {
            rate if rate > 0.0 => Some(rate),
            _ => state.rates.get(&record.collection).copied(),
        };
        if let Some(rate) = rate.filter(|rate| *rate > 0.0) {
            // Everything of the collection up to and including this write, less what is done.
            let ahead: u64 = state
                .pending
                .get(&record.collection)
                .map_or(0, |p| p.range(..=id).map(|(_, p)| p.bytes).sum());
            let done: u64 = state
                .running
                .iter()
                .filter(|(running_id, _)| **running_id <= id)
                .map(|(_, r)| r.bytes_done)
                .sum();
            operation.eta_seconds = Some(ahead.saturating_sub(done) as f64 / rate);
        }
        operation
    }

    /// Whether every write of `collection` up to `id` has left the queue.
    pub fn visible(&self, collection: &str, id: u64) -> bool {
        self.lock()
            .pending
            .get(collection)
            .is_none_or(|p| p.keys().next().is_none_or(|first| *first > id))
    }

    /// Resolves once every write of `collection` up to `id` has left the queue (applied, failed
    /// or purged).
    pub async fn wait_visible(&self, collection: &str, id: u64) {
        let mut changes = self.changes.subscribe();
        while !self.visible(collection, id) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Resolves with the operation `id` once it has ended.
    pub async fn wait_ended(&self, id: u64) -> Result<Option<Operation>> {
        let mut changes = self.changes.subscribe();
        loop {
            let operation = self.operation(id)?;
            match &operation {
                Some(operation) if !operation.state.ended() => {}
                _ => return Ok(operation),
            }
            if changes.changed().await.is_err() {
                return self.operation(id);
            }
        }
    }

    /// Each collection's pending writes.
    pub fn depth(&self) -> Vec<Depth> {
        let state = self.lock();
        state
            .pending
            .iter()
            .map(|(collection, pending)| Depth {
                collection: collection.clone(),
                documents: pending.values().map(|p| u64::from(p.documents)).sum(),
                bytes: pending.values().map(|p| p.bytes).sum(),
                oldest_unix_ms: pending
                    .values()
                    .map(|p| p.created_unix_ms)
                    .min()
                    .unwrap_or(0),
            })
            .collect()
    }
}
