//! The report: what the build, the bootstraps, the reads, the writes and the lag measured, as
//! Markdown.

use std::time::Duration;

use lathe_tools::eval::percentile;

use crate::measure::{LagRun, LoadRun};
use crate::Args;

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) documents: u64,
    pub(crate) sections: u64,
    pub(crate) text_bytes: u64,
    pub(crate) build: Duration,
    /// Messages and bytes of the stream after the build.
    pub(crate) stream: (u64, u64),
    pub(crate) bootstraps: Vec<Duration>,
    pub(crate) reads: Vec<(usize, LoadRun)>,
    /// (what, p50, p99) in ms.
    pub(crate) writes: Vec<(&'static str, f64, f64)>,
    pub(crate) lag: LagRun,
}

impl Report {
    pub(crate) fn render(&self, args: &Args) -> String {
        let mut out = String::new();
        let mb = |bytes: u64| bytes as f64 / 1e6;
        out += &format!(
            "Dataset {} ×{}: {} documents, {} sections, {:.1} MB of text; models.dense = {}.\n\n",
            args.dataset.display(),
            args.copies,
            self.documents,
            self.sections,
            mb(self.text_bytes),
            args.dense
        );
        out += &format!(
            "Build through replica 0: {:.1} s ({:.2} MB/s); the log holds {} messages, {:.1} MB.\n\n",
            self.build.as_secs_f64(),
            mb(self.text_bytes) / self.build.as_secs_f64(),
            self.stream.0,
            mb(self.stream.1)
        );
        out += "| new replica | bootstrap s | entries/s | sections/s | MB of log/s |\n|---:|---:|---:|---:|---:|\n";
        for (i, seconds) in self
            .bootstraps
            .iter()
            .map(Duration::as_secs_f64)
            .enumerate()
        {
            out += &format!(
                "| {} | {seconds:.2} | {:.0} | {:.0} | {:.2} |\n",
                i + 1,
                self.stream.0 as f64 / seconds,
                self.sections as f64 / seconds,
                mb(self.stream.1) / seconds
            );
        }
        if !self.reads.is_empty() {
            out += &self.render_load(args);
        }
        out
    }

    fn render_load(&self, args: &Args) -> String {
        let mut out = String::new();
        out += &format!(
            "\nReads, {} clients, cache misses, budget {}:\n\n| replicas | QPS | p50 ms | p99 ms | errors |\n|---:|---:|---:|---:|---:|\n",
            args.clients, args.budget
        );
        for (n, run) in &self.reads {
            let ms = |p| percentile(&run.latencies_us, p) as f64 / 1000.0;
            out += &format!(
                "| {n} | {:.1} | {:.1} | {:.1} | {} |\n",
                run.latencies_us.len() as f64 / run.seconds,
                ms(50.0),
                ms(99.0),
                run.errors
            );
        }
        out += &format!(
            "\nWrites, {} single-document upserts each:\n\n| write | p50 ms | p99 ms |\n|---|---:|---:|\n",
            args.writes
        );
        for (what, p50, p99) in &self.writes {
            out += &format!("| {what} | {p50:.2} | {p99:.2} |\n");
        }
        let lag = &self.lag;
        out += &format!(
            "\nSustained writes without wait on replica 0: {} upserts of 8 documents in {:.1} s ({:.0} documents/s). Followers sampled every 250 ms: lag p50 {:.2} s, p99 {:.2} s, max {:.2} s; distance to the log head p50 {}, p99 {}, max {} entries; caught up {:.2} s after the writer stopped.\n",
            lag.writes,
            lag.seconds,
            lag.documents as f64 / lag.seconds,
            percentile(&lag.lags, 50.0),
            percentile(&lag.lags, 99.0),
            lag.lags.last().copied().unwrap_or(0.0),
            percentile(&lag.distances, 50.0),
            percentile(&lag.distances, 99.0),
            lag.distances.last().copied().unwrap_or(0),
            lag.catch_up.as_secs_f64()
        );
        out
    }
}
