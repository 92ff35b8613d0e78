//! Metrics the service publishes: collection gauges at scrape time, and per query the stage
//! timings and cache lookups.

use std::collections::BTreeSet;

use super::Engine;
use crate::index::CollectionEntry;
use crate::telemetry::InferenceCounts;
use crate::types::{CollectionInfo, CollectionState, QueryVectorSource, RetrieveResult};

impl Engine {
    /// A replica's progress through the log (nothing on a single node).
    fn record_replication_metrics(&self) {
        let Some(replication) = self.replication() else {
            return;
        };
        let progress = replication.state().progress();
        let metrics = &self.metrics.replication;
        metrics.applied_position.set(progress.applied as i64);
        metrics.pending_entries.set(progress.pending as i64);
        metrics
            .lag_seconds
            .set(progress.lag(std::time::SystemTime::now()).as_secs_f64());
        metrics.stopped.set(i64::from(progress.stopped.is_some()));
        metrics.log_lost.set(i64::from(progress.lost.is_some()));
        let work = progress.work;
        metrics.work_messages.set(work.messages as i64);
        metrics.work_bytes.set(work.bytes as i64);
        let oldest = work.oldest.map_or(0.0, |stored| {
            stored.elapsed().unwrap_or_default().as_secs_f64()
        });
        metrics.work_oldest_seconds.set(oldest);
        metrics.retrying.set(i64::from(progress.retrying.is_some()));
    }

    /// The write queue's depth and age per collection (a single node). A collection whose queue
    /// emptied shows 0 until it is deleted.
    fn record_write_queue_metrics(&self) {
        let Some(queue) = &self.ingestor.queue else {
            return;
        };
        let metrics = &self.metrics.write_queue;
        let now = crate::write_queue::unix_ms(std::time::SystemTime::now());
        for depth in queue.depth() {
            let name = [depth.collection.as_str()];
            metrics
                .documents
                .with_label_values(&name)
                .set(depth.documents as i64);
            metrics
                .bytes
                .with_label_values(&name)
                .set(depth.bytes as i64);
            let oldest = match depth.documents {
                0 => 0.0,
                _ => now.saturating_sub(depth.oldest_unix_ms) as f64 / 1e3,
            };
            metrics.oldest_seconds.with_label_values(&name).set(oldest);
        }
    }

    /// Publishes each collection's state and size, the writers' state and the model runtime's
    /// totals to the metrics (called at scrape time).
    pub fn record_collection_metrics(&self) {
        self.record_replication_metrics();
        self.record_write_queue_metrics();
        if let Some(totals) = self.embedder.as_ref().and_then(|e| e.inference_totals()) {
            self.metrics.inference.publish(InferenceCounts {
                runs: totals.runs,
                sequences: totals.sequences,
                padded_tokens: totals.padded_tokens,
                seconds: totals.seconds,
            });
        }
        let metrics = &self.metrics;
        metrics
            .index_writers_open
            .set(self.catalog.open_writers() as i64);
        let evictions = self.catalog.writer_evictions();
        let counted = metrics.index_writer_evictions.get();
        metrics
            .index_writer_evictions
            .inc_by(evictions.saturating_sub(counted));
        metrics
            .collections_open
            .set(self.catalog.open_collections() as i64);
        let closes = self.catalog.collection_closes();
        metrics
            .collection_closes
            .inc_by(closes.saturating_sub(metrics.collection_closes.get()));
        let entries = self.catalog.entries();
        let infos: Vec<CollectionInfo> = entries.iter().map(Self::info).collect();
        let mut published = self
            .published_collections
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Series per collection for the open and the faulted ones only: with a hundred thousand
        // tenants, one series each of the closed ones would be most of the scrape.
        let current: BTreeSet<String> = entries
            .iter()
            .filter(|entry| !matches!(entry, CollectionEntry::Closed(_)))
            .map(|entry| entry.name().to_string())
            .collect();
        for gone in published.difference(&current) {
            let name = [gone.as_str()];
            let _ = metrics.collection_documents.remove_label_values(&name);
            let _ = metrics.collection_sections.remove_label_values(&name);
            let _ = metrics.collection_bytes.remove_label_values(&name);
            let _ = metrics.collection_damaged.remove_label_values(&name);
            let _ = metrics.write_queue.documents.remove_label_values(&name);
            let _ = metrics.write_queue.bytes.remove_label_values(&name);
            let _ = metrics
                .write_queue
                .oldest_seconds
                .remove_label_values(&name);
        }
        *published = current;
        for state in [
            CollectionState::Ready,
            CollectionState::Damaged,
            CollectionState::Offline,
        ] {
            let count = infos.iter().filter(|info| info.state == state).count();
            metrics
                .collections
                .with_label_values(&[state.label()])
                .set(count as i64);
        }
        for info in infos.iter().filter(|info| published.contains(&info.name)) {
            let name = [info.name.as_str()];
            metrics
                .collection_damaged
                .with_label_values(&name)
                .set(i64::from(info.state != CollectionState::Ready));
            let Some(stats) = info.stats else {
                continue;
            };
            metrics
                .collection_documents
                .with_label_values(&name)
                .set(stats.documents as i64);
            metrics
                .collection_sections
                .with_label_values(&name)
                .set(stats.sections as i64);
            metrics
                .collection_bytes
                .with_label_values(&name)
                .set(stats.bytes as i64);
        }
    }

    /// Counts one lookup in the result cache.
    pub(super) fn record_result_lookup(&self, hit: bool) {
        let outcome = if hit { "hit" } else { "miss" };
        self.metrics
            .cache_lookups
            .with_label_values(&["result", outcome])
            .inc();
    }

    /// Each stage's time and the section cache's hits and misses of one computed answer.
    pub(super) fn record_query_metrics(&self, result: &RetrieveResult) {
        for &(stage, micros) in &result.timings {
            self.metrics
                .stage_seconds
                .with_label_values(&[stage])
                .observe(micros as f64 / 1e6);
        }
        let section_misses = result.section_cache_misses as u64;
        let section_hits = u64::from(result.sections_considered).saturating_sub(section_misses);
        self.metrics
            .cache_lookups
            .with_label_values(&["section", "hit"])
            .inc_by(section_hits);
        self.metrics
            .cache_lookups
            .with_label_values(&["section", "miss"])
            .inc_by(section_misses);
        let query_vector = match result.query_vector {
            QueryVectorSource::None => None,
            QueryVectorSource::Model => Some("miss"),
            QueryVectorSource::Cache => Some("hit"),
        };
        if let Some(outcome) = query_vector {
            self.metrics
                .cache_lookups
                .with_label_values(&["query_vector", outcome])
                .inc();
        }
    }
}
