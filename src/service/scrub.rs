//! The scrub: every `storage.scrub_interval_s`, each open collection's files are read again at
//! most `storage.scrub_bytes_per_second` and checked against their checksums
//! (`CollectionIndex::scrub`), on a thread of its own at the index workers' priority. A finding
//! is logged where it is made; each pass ends with one INFO line and the counters
//! `lathe_scrub_bytes_total` and `lathe_scrub_findings_total`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::{CollectionRuntime, Engine};
use crate::index::integrity::Pace;
use crate::index::{Catalog, CollectionEntry};
use crate::telemetry::Metrics;

/// The running scrub: dropping [`ScrubTask::stop`]'s sender ends its wait, the flag its pass.
pub(super) struct ScrubTask {
    wake: mpsc::Sender<()>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl ScrubTask {
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.wake);
        let _ = self.thread.join();
    }
}

impl Engine {
    /// Starts the scrub when `storage.scrub_interval_s` is set.
    pub(super) fn start_scrub(&self) -> Option<ScrubTask> {
        let interval = Duration::from_secs(self.config.storage.scrub_interval_s);
        if interval.is_zero() {
            return None;
        }
        let (wake, sleep) = mpsc::channel::<()>();
        let stop = Arc::new(AtomicBool::new(false));
        let catalog = Arc::clone(&self.catalog);
        let metrics = Arc::clone(&self.metrics);
        let (rate, nice) = (
            self.config.storage.scrub_bytes_per_second,
            self.config.ingest.worker_nice,
        );
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("lathe-scrub".into())
            .spawn(move || {
                crate::cpu_pool::lower_priority(nice);
                // Dropping the sender (shutdown) ends the wait at once.
                while let Err(mpsc::RecvTimeoutError::Timeout) = sleep.recv_timeout(interval) {
                    scrub_pass(&catalog, &metrics, rate, &stopping);
                }
            });
        match thread {
            Ok(thread) => Some(ScrubTask { wake, stop, thread }),
            Err(error) => {
                tracing::warn!(%error, "could not start the scrub thread; files are verified only when opened");
                None
            }
        }
    }
}

/// One pass over every open collection.
fn scrub_pass(
    catalog: &Catalog<CollectionRuntime>,
    metrics: &Metrics,
    bytes_per_second: u64,
    stop: &AtomicBool,
) {
    let started = Instant::now();
    let mut pace = Pace::new(bytes_per_second, stop);
    let (mut collections, mut findings, mut rebuilt) = (0, 0, 0);
    for entry in catalog.entries() {
        let CollectionEntry::Ready(collection) = entry else {
            continue;
        };
        let before = pace.bytes();
        match collection.index.scrub(&mut pace) {
            Ok(report) => {
                findings += report.findings;
                rebuilt += report.rebuilt_segments;
                metrics.scrub_findings.inc_by(report.findings as u64);
            }
            Err(error) => {
                tracing::warn!(collection = collection.name, %error, "the scrub could not read a collection; trying again at the next pass")
            }
        }
        metrics.scrub_bytes.inc_by(pace.bytes() - before);
        collections += 1;
        if pace.stopped() {
            return;
        }
    }
    tracing::info!(
        collections,
        bytes = pace.bytes(),
        seconds = started.elapsed().as_secs_f32(),
        findings,
        rebuilt_dense_segments = rebuilt,
        "scrub pass done"
    );
}
