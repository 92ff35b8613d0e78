//! The queue's upkeep: a deleted collection's writes purged, ended operations pruned.

use std::collections::HashMap;
use std::time::SystemTime;

use redb::ReadableTable;

use super::{codec, unix_ms, AtQueue, WriteQueue, OPERATIONS, QUEUE, WRITE_IDS};
use crate::error::Result;

impl WriteQueue {
    /// Takes every pending write of `collection` out of the queue, recording each operation as
    /// failed with `reason`, and forgets the collection's write ids. Blocking.
    pub fn purge(&self, collection: &str, reason: &str) -> Result<()> {
        let now_ms = unix_ms(SystemTime::now());
        let mut state = self.lock();
        let ids: Vec<u64> = state
            .pending
            .get(collection)
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default();
        let txn = self.db.begin_write().at(&self.path)?;
        {
            let mut queue = txn.open_table(QUEUE).at(&self.path)?;
            let mut operations = txn.open_table(OPERATIONS).at(&self.path)?;
            for &id in &ids {
                queue.remove(id).at(&self.path)?;
                let record = operations.get(id).at(&self.path)?;
                let Some(record) = record.map(|r| codec::decode_record(r.value())) else {
                    continue;
                };
                let mut record = record?;
                record.state = codec::STATE_FAILED;
                record.error = reason.to_string();
                record.finished_unix_ms = now_ms;
                operations
                    .insert(id, codec::encode_record(&record).as_slice())
                    .at(&self.path)?;
            }
            let mut write_ids = txn.open_table(WRITE_IDS).at(&self.path)?;
            let keys: Vec<String> = write_ids
                .range((collection, "")..)
                .at(&self.path)?
                .map_while(|entry| {
                    let (key, _) = entry.ok()?;
                    let (name, write_id) = key.value();
                    (name == collection).then(|| write_id.to_string())
                })
                .collect();
            for write_id in &keys {
                write_ids
                    .remove((collection, write_id.as_str()))
                    .at(&self.path)?;
            }
        }
        txn.commit().at(&self.path)?;
        if let Some(pending) = state.pending.remove(collection) {
            state.total_bytes -= pending.values().map(|p| p.bytes).sum::<u64>();
        }
        state.rates.remove(collection);
        drop(state);
        self.changed();
        Ok(())
    }

    /// Removes the records of operations that ended more than `retention` ago, and write ids
    /// older than the dedupe window. Blocking.
    pub fn prune(&self, now: SystemTime) -> Result<()> {
        let now_ms = unix_ms(now);
        let retention = self.limits.retention.as_millis() as u64;
        let window = self.limits.dedupe_window.as_millis() as u64;
        let _state = self.lock();
        let txn = self.db.begin_write().at(&self.path)?;
        {
            let mut operations = txn.open_table(OPERATIONS).at(&self.path)?;
            let mut created = HashMap::new();
            let mut expired = Vec::new();
            for entry in operations.iter().at(&self.path)? {
                let (id, record) = entry.at(&self.path)?;
                let record = codec::decode_record(record.value())?;
                let ended =
                    record.state == codec::STATE_APPLIED || record.state == codec::STATE_FAILED;
                if ended && record.finished_unix_ms + retention <= now_ms {
                    expired.push(id.value());
                } else {
                    created.insert(id.value(), record.created_unix_ms);
                }
            }
            for id in expired {
                operations.remove(id).at(&self.path)?;
            }
            let mut write_ids = txn.open_table(WRITE_IDS).at(&self.path)?;
            write_ids
                .retain(|_, id| {
                    created
                        .get(&id)
                        .is_some_and(|&created| created + window > now_ms)
                })
                .at(&self.path)?;
        }
        txn.commit().at(&self.path)?;
        Ok(())
    }
}
