//! How `lathe ingest` cuts its batches: by bytes, sized from the throughput measured so far, cut
//! again smaller when one runs past its deadline; and the progress line it prints.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::cli::units;

/// The end of the batch that starts at document `start`: documents while their text adds up to
/// at most `bytes` (always at least one, however large), and at most `most` documents.
fn batch_end(sizes: &[usize], start: usize, bytes: usize, most: usize) -> usize {
    let mut end = start;
    let mut taken = 0usize;
    while end < sizes.len() && end - start < most {
        if end > start && taken + sizes[end] > bytes {
            break;
        }
        taken += sizes[end];
        end += 1;
    }
    end
}

/// Sizes batches in bytes so that one takes about `target` seconds at the throughput measured
/// so far (the latest batch weighs most: load on the server changes).
#[derive(Debug)]
pub(super) struct BatchSizer {
    batch_bytes: usize,
    target_seconds: f64,
    /// Bytes per second, smoothed over the batches so far; None before the first.
    throughput: Option<f64>,
}

/// Smallest batch the sizer asks for, in bytes (a single larger document is still sent alone).
const MIN_BATCH_BYTES: usize = 4 * 1024;
/// Largest batch, in bytes: well under the server's default 64 MiB message limit.
const MAX_BATCH_BYTES: usize = 16 << 20;

impl BatchSizer {
    pub(super) fn new(first_batch_bytes: usize, target_seconds: f64) -> Self {
        Self {
            batch_bytes: first_batch_bytes.clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES),
            target_seconds,
            throughput: None,
        }
    }

    pub(super) fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// A batch of `bytes` took `elapsed`: the next is sized to take the target time, growing at
    /// most 4-fold at a time (one fast small batch says little about a large one).
    pub(super) fn observe(&mut self, bytes: usize, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64().max(1e-3);
        let measured = bytes as f64 / seconds;
        let throughput = match self.throughput {
            None => measured,
            Some(before) => 0.5 * before + 0.5 * measured,
        };
        self.throughput = Some(throughput);
        let wanted = (throughput * self.target_seconds) as usize;
        self.batch_bytes = wanted
            .min(self.batch_bytes.saturating_mul(4))
            .clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES);
    }

    /// A batch of `bytes` ran past its deadline: the next is at most a quarter of it.
    pub(super) fn timed_out(&mut self, bytes: usize) {
        self.batch_bytes = (bytes / 4).clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES);
        self.throughput = self.throughput.map(|t| t / 4.0);
    }
}

/// Documents and bytes stored so far, and the line that reports them.
pub(super) struct Progress {
    pub(super) started: Instant,
    pub(super) total_documents: usize,
    pub(super) total_bytes: usize,
    pub(super) documents: usize,
    bytes: usize,
}

impl Progress {
    pub(super) fn new(sizes: &[usize]) -> Self {
        Self {
            started: Instant::now(),
            total_documents: sizes.len(),
            total_bytes: sizes.iter().sum(),
            documents: 0,
            bytes: 0,
        }
    }

    pub(super) fn done(&mut self, documents: usize, bytes: usize) {
        self.documents += documents;
        self.bytes += bytes;
    }

    pub(super) fn line(&self) -> String {
        progress_line(
            self.documents,
            self.total_documents,
            self.bytes,
            self.total_bytes,
            self.started.elapsed(),
        )
    }
}

/// `documents 120/500, 1.20 MB/5.00 MB, 400 KB/s, ETA 9.50 s`.
fn progress_line(
    documents: usize,
    total_documents: usize,
    bytes: usize,
    total_bytes: usize,
    elapsed: Duration,
) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let rate = bytes as f64 / seconds;
    let eta = if rate > 0.0 {
        let left = total_bytes.saturating_sub(bytes) as f64 / rate;
        units::duration(Duration::from_secs_f64(left))
    } else {
        "unknown".to_string()
    };
    format!(
        "documents {documents}/{total_documents}, {}/{}, {}, ETA {eta}",
        units::bytes(bytes as u64),
        units::bytes(total_bytes as u64),
        units::per_second(rate)
    )
}

/// The batches still to send, in order: runs of documents cut by bytes, and before them the
/// batches that ran past their deadline, cut again smaller.
pub(super) struct BatchQueue<'a> {
    /// Text bytes of each document.
    sizes: &'a [usize],
    /// Most documents in one batch.
    most_documents: usize,
    /// The first document not yet cut into a batch.
    next: usize,
    retries: VecDeque<Range<usize>>,
}

impl<'a> BatchQueue<'a> {
    pub(super) fn new(sizes: &'a [usize], most_documents: usize) -> Self {
        Self {
            sizes,
            most_documents,
            next: 0,
            retries: VecDeque::new(),
        }
    }

    /// The next batch: one to retry first, else the next documents up to `batch_bytes`.
    pub(super) fn next_batch(&mut self, batch_bytes: usize) -> Option<Range<usize>> {
        match self.retries.pop_front() {
            Some(range) => Some(range),
            None if self.next < self.sizes.len() => {
                let end = batch_end(self.sizes, self.next, batch_bytes, self.most_documents);
                Some(std::mem::replace(&mut self.next, end)..end)
            }
            None => None,
        }
    }

    /// `range` ran past its deadline: it is sent again in batches of at most `batch_bytes`.
    pub(super) fn retry(&mut self, range: Range<usize>, batch_bytes: usize) {
        let mut start = range.start;
        while start < range.end {
            let end = batch_end(
                &self.sizes[..range.end],
                start,
                batch_bytes,
                self.most_documents,
            );
            self.retries.push_back(start..end);
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fill_up_to_their_bytes_and_always_take_one_document() {
        let sizes = [10, 20, 30, 500, 5];
        assert_eq!(batch_end(&sizes, 0, 60, 64), 3);
        assert_eq!(batch_end(&sizes, 0, 29, 64), 1);
        // A document larger than the batch goes alone.
        assert_eq!(batch_end(&sizes, 3, 60, 64), 4);
        assert_eq!(batch_end(&sizes, 4, 60, 64), 5);
        // The document count caps it too.
        assert_eq!(batch_end(&sizes, 0, 1000, 2), 2);
        // Consecutive batches cover every document once.
        let mut covered = Vec::new();
        let mut start = 0;
        while start < sizes.len() {
            let end = batch_end(&sizes, start, 40, 64);
            assert!(end > start);
            covered.extend(start..end);
            start = end;
        }
        assert_eq!(covered, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn batch_sizes_follow_the_measured_throughput() {
        let mut sizer = BatchSizer::new(64 * 1024, 10.0);
        assert_eq!(sizer.batch_bytes(), 64 * 1024);
        // 64 KiB in 1 s: 10 s would take 640 KiB, but growth is at most 4-fold a step.
        sizer.observe(64 * 1024, Duration::from_secs(1));
        assert_eq!(sizer.batch_bytes(), 256 * 1024);
        sizer.observe(256 * 1024, Duration::from_secs(4));
        assert_eq!(sizer.batch_bytes(), 640 * 1024);
        // The server slows down 10-fold: the next batch shrinks at once (by the smoothed rate).
        sizer.observe(640 * 1024, Duration::from_secs(100));
        let slowed = sizer.batch_bytes();
        assert!(slowed < 640 * 1024, "{slowed}");
        // A deadline passed: a quarter of that batch, never below the floor.
        sizer.timed_out(slowed);
        assert_eq!(sizer.batch_bytes(), (slowed / 4).max(MIN_BATCH_BYTES));
        sizer.timed_out(1);
        assert_eq!(sizer.batch_bytes(), MIN_BATCH_BYTES);
        // Nor above the ceiling, however fast.
        let mut fast = BatchSizer::new(MAX_BATCH_BYTES, 10.0);
        fast.observe(MAX_BATCH_BYTES, Duration::from_millis(1));
        assert_eq!(fast.batch_bytes(), MAX_BATCH_BYTES);
    }

    #[test]
    fn progress_names_documents_sizes_rate_and_what_is_left() {
        let line = progress_line(120, 500, 1_200_000, 5_000_000, Duration::from_secs(3));
        assert_eq!(
            line,
            "documents 120/500, 1.20 MB/5.00 MB, 400 KB/s, ETA 9.50 s"
        );
        // A slow start reads in bytes, not as a row of zeros.
        let slow = progress_line(1, 500, 300, 5_000_000, Duration::from_secs(2));
        assert!(slow.contains(", 150 B/s, ETA 9 h 15 min"), "{slow}");
        let start = progress_line(0, 5, 0, 100, Duration::from_secs(1));
        assert!(start.ends_with("ETA unknown"), "{start}");
    }
}
