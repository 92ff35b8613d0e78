//! The table the load prints: a row per run, the server's stage timings under it.

use lathe_tools::eval::percentile;

use crate::clients::Mode;
use crate::run::RunReport;

/// One line per server stage: how many answers timed it, and its p50 and p99 in milliseconds.
pub(crate) fn print_stages(report: &RunReport) {
    println!();
    println!("| stage | answers | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    for (stage, micros) in &report.stages_us {
        let ms = |p: f64| percentile(micros, p) as f64 / 1e3;
        println!(
            "| {stage} | {} | {:.2} | {:.2} |",
            micros.len(),
            ms(50.0),
            ms(99.0)
        );
    }
    println!();
}

pub(crate) fn print_header() {
    println!("| mode | clients | writer | seconds | requests | QPS | p50 ms | p95 ms | p99 ms | max ms | cache hits | errors | writes/s |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
}

pub(crate) fn print_row(report: &RunReport) {
    let ms = |p: f64| percentile(&report.latencies_us, p) as f64 / 1e3;
    let errors = if report.errors.is_empty() {
        "none".to_string()
    } else {
        report
            .errors
            .iter()
            .map(|(code, count)| format!("{code}: {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let writes = if report.writer {
        format!(
            "{:.1}{}",
            report.writes as f64 / report.seconds,
            if report.write_errors > 0 {
                format!(" ({} failed)", report.write_errors)
            } else {
                String::new()
            }
        )
    } else {
        "–".to_string()
    };
    println!(
        "| {} | {} | {} | {:.1} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1}% | {} | {} |",
        match report.mode {
            Mode::Miss => "miss",
            Mode::Hit => "hit",
            Mode::WarmUp => "warm-up",
        },
        report.clients,
        if report.writer { "yes" } else { "no" },
        report.seconds,
        report.requests,
        report.ok as f64 / report.seconds,
        ms(50.0),
        ms(95.0),
        ms(99.0),
        report
            .latencies_us
            .last()
            .map_or(0.0, |&us| us as f64 / 1e3),
        100.0 * report.cache_hits as f64 / report.ok.max(1) as f64,
        errors,
        writes,
    );
}
