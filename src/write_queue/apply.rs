//! The index worker's side of the queue: take the oldest write, report progress, end it.

use std::time::{Instant, SystemTime};

use redb::{ReadableDatabase, ReadableTable};

use super::{codec, unix_ms, AtQueue, QueuedWrite, Running, WriteQueue, OPERATIONS, QUEUE};
use crate::error::{LatheError, Result};

impl WriteQueue {
    /// The oldest write of `collection`, marked running. Blocking (it reads the database).
    pub fn next(&self, collection: &str) -> Result<Option<(u64, QueuedWrite)>> {
        let Some(id) = self
            .lock()
            .pending
            .get(collection)
            .and_then(|p| p.keys().next().copied())
        else {
            return Ok(None);
        };
        let txn = self.db.begin_read().at(&self.path)?;
        let queue = txn.open_table(QUEUE).at(&self.path)?;
        let Some(bytes) = queue.get(id).at(&self.path)? else {
            return Err(LatheError::internal(format!(
                "{}: queued write {id} is missing",
                self.path.display()
            )));
        };
        let write = codec::decode_write(bytes.value())?;
        self.lock().running.insert(
            id,
            Running {
                started: Instant::now(),
                started_unix_ms: unix_ms(SystemTime::now()),
                documents_done: 0,
                bytes_done: 0,
                retrying: None,
            },
        );
        self.changed();
        Ok(Some((id, write)))
    }

    /// A running operation has applied this much.
    pub fn progress(&self, id: u64, documents_done: u32, bytes_done: u64) {
        if let Some(running) = self.lock().running.get_mut(&id) {
            running.documents_done = documents_done;
            running.bytes_done = bytes_done;
        }
        self.changed();
    }

    /// A try at the running operation `id` failed with `error` and will be made again (`None`:
    /// a try succeeded since): its operation says so.
    pub fn retrying(&self, id: u64, error: Option<String>) {
        if let Some(running) = self.lock().running.get_mut(&id) {
            running.retrying = error;
        }
        self.changed();
    }

    /// Ends the running operation `id`: applied (with the sections indexed and the generation
    /// that shows it) or failed (with why). Its write leaves the queue in the same transaction.
    /// A write purged meanwhile (its collection deleted) stays as the purge recorded it.
    /// Blocking.
    pub fn finish(&self, id: u64, outcome: std::result::Result<(u32, u64), String>) -> Result<()> {
        let now_ms = unix_ms(SystemTime::now());
        let mut state = self.lock();
        let running = state.running.remove(&id);
        let txn = self.db.begin_write().at(&self.path)?;
        let mut record = {
            let queue = txn.open_table(QUEUE).at(&self.path)?;
            if queue.get(id).at(&self.path)?.is_none() {
                drop(state);
                self.changed();
                return Ok(());
            }
            let operations = txn.open_table(OPERATIONS).at(&self.path)?;
            let record = operations.get(id).at(&self.path)?;
            match record {
                Some(record) => codec::decode_record(record.value())?,
                None => {
                    return Err(LatheError::internal(format!(
                        "operation {id} has no record"
                    )))
                }
            }
        };
        record.started_unix_ms = running.as_ref().map_or(now_ms, |r| r.started_unix_ms);
        record.finished_unix_ms = now_ms;
        match &outcome {
            Ok((sections, generation)) => {
                record.state = codec::STATE_APPLIED;
                record.sections = *sections;
                record.generation = *generation;
            }
            Err(error) => {
                record.state = codec::STATE_FAILED;
                record.error = error.clone();
            }
        }
        {
            let mut queue = txn.open_table(QUEUE).at(&self.path)?;
            queue.remove(id).at(&self.path)?;
            let mut operations = txn.open_table(OPERATIONS).at(&self.path)?;
            operations
                .insert(id, codec::encode_record(&record).as_slice())
                .at(&self.path)?;
        }
        txn.commit().at(&self.path)?;
        if let Some(pending) = state.pending.get_mut(&record.collection) {
            if let Some(gone) = pending.remove(&id) {
                state.total_bytes -= gone.bytes;
            }
        }
        if let (Ok(_), Some(running)) = (&outcome, running) {
            let seconds = running.started.elapsed().as_secs_f64();
            if record.kind == codec::KIND_UPSERT && seconds > 0.0 && record.bytes > 0 {
                state
                    .rates
                    .insert(record.collection.clone(), record.bytes as f64 / seconds);
            }
        }
        drop(state);
        self.changed();
        Ok(())
    }
}
