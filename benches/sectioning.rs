//! Sectioning throughput on real text: what a write spends before tantivy and the model.
//!
//! What: every `.txt` document of the Debian-docs corpus cut into sections of at most 256
//! MiniLM tokens (`sections::split_document`, plain text, as `lathe ingest` sends them), the
//! documents shared out over `LATHE_BENCH_THREADS` threads (default 2, as the CPU pool on this
//! machine). The first pass starts with the word memory empty (a fresh server's first upload);
//! the passes after it find every word remembered. Each pass prints its wall time, MB/s and the
//! process's CPU seconds (user + system); the summary gives the median of the warm passes.
//!
//! Run: `scripts/fetch-debian-docs.sh /tmp/lathe-debian-docs` then
//! `LATHE_DEBIAN_DOCS=/tmp/lathe-debian-docs cargo bench --bench sectioning`
//! (`LATHE_BENCH_PASSES=N` warm passes, default 5; `LATHE_BENCH_DOCS=N` takes the first N
//! documents; `LATHE_MODELS_DIR` overrides ./models).

mod common;

use std::time::{Duration, Instant};

use lathe::sections::{split_document, Format};
use lathe::tokenizer::BudgetTokenizer;

const SECTION_TOKENS: usize = 256;

/// The server's allocator (src/main.rs), so that the figures are the server's.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn load_documents() -> Vec<String> {
    common::debian_docs_paths()
        .iter()
        .map(|path| String::from_utf8_lossy(&std::fs::read(path).expect("readable")).into_owned())
        .collect()
}

/// User + system CPU time of the whole process so far.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// One pass over `documents` on `threads` threads: (wall, CPU, sections).
fn pass(
    documents: &[String],
    tokenizer: &BudgetTokenizer,
    threads: usize,
) -> (Duration, Duration, usize) {
    let (start, cpu_start) = (Instant::now(), process_cpu());
    let sections = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    documents
                        .iter()
                        .skip(thread)
                        .step_by(threads)
                        .map(|text| {
                            split_document(text, Format::Plain, SECTION_TOKENS, tokenizer)
                                .sections
                                .len()
                        })
                        .sum::<usize>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a sectioning thread"))
            .sum()
    });
    (start.elapsed(), process_cpu() - cpu_start, sections)
}

fn main() {
    let documents = load_documents();
    let bytes: usize = documents.iter().map(String::len).sum();
    let models = common::manifest_path("LATHE_MODELS_DIR", "models");
    let tokenizer =
        BudgetTokenizer::resolve("minilm", &models).expect("run scripts/fetch-models.sh");
    let threads = env_number("LATHE_BENCH_THREADS", 2).max(1);
    let warm_passes = env_number("LATHE_BENCH_PASSES", 5).max(1);
    println!(
        "sectioning {} documents, {:.1} MB, at most {SECTION_TOKENS} MiniLM tokens a section, {threads} threads",
        documents.len(),
        bytes as f64 / 1e6
    );
    let mut warm = Vec::new();
    for index in 0..=warm_passes {
        let (wall, cpu, sections) = pass(&documents, &tokenizer, threads);
        let label = if index == 0 { "cold" } else { "warm" };
        println!(
            "{label}: {sections} sections in {:.3} s, {:.1} MB/s, {:.2} CPU-s",
            wall.as_secs_f64(),
            bytes as f64 / 1e6 / wall.as_secs_f64(),
            cpu.as_secs_f64()
        );
        if index > 0 {
            warm.push((wall, cpu));
        }
    }
    let median = |mut values: Vec<Duration>| {
        values.sort();
        values[values.len() / 2]
    };
    let wall = median(warm.iter().map(|w| w.0).collect());
    let cpu = median(warm.iter().map(|w| w.1).collect());
    println!(
        "warm median: {:.3} s, {:.1} MB/s, {:.2} CPU-s ({:.1} MB per CPU-s)",
        wall.as_secs_f64(),
        bytes as f64 / 1e6 / wall.as_secs_f64(),
        cpu.as_secs_f64(),
        bytes as f64 / 1e6 / cpu.as_secs_f64()
    );
}
