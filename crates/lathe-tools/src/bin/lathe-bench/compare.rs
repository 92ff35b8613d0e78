//! `--compare LABEL=CSV`: two or more builds' results side by side — a table of p50 and QPS by
//! size and build, and `compare.svg`, p50 against collection size, one line per build and
//! client count.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::report::{draw_log_log, parse_csv, SizeReport};
use crate::Args;

/// One build's results: its label and its rows, sorted by size.
struct Build {
    label: String,
    reports: Vec<SizeReport>,
}

/// `label=path` (the path of an earlier run's results.csv).
pub(crate) fn parse_compare(value: &str) -> Result<(String, PathBuf), String> {
    match value.split_once('=') {
        Some((label, path)) if !label.is_empty() && !path.is_empty() => {
            Ok((label.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("`{value}` is not LABEL=CSV")),
    }
}

pub(crate) fn compare(args: &Args) -> anyhow::Result<()> {
    let mut builds: Vec<Build> = Vec::new();
    for (label, path) in &args.compare {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let rows = parse_csv(&text).with_context(|| format!("parsing {}", path.display()))?;
        match builds.iter_mut().find(|b| &b.label == label) {
            Some(build) => build.reports.extend(rows),
            None => builds.push(Build {
                label: label.clone(),
                reports: rows,
            }),
        }
    }
    for build in &mut builds {
        build.reports.sort_by_key(|r| r.sections);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let table = compare_table(&builds, args.clients);
    std::fs::write(args.out.join("compare.md"), &table).context("writing compare.md")?;
    compare_svg(&args.out.join("compare.svg"), &builds, args.clients)?;
    println!("{table}");
    Ok(())
}

fn compare_table(builds: &[Build], clients: usize) -> String {
    let mut table = format!(
        "| sections | build | p50 1c ms | p99 1c ms | QPS {clients}c | p99 {clients}c ms | open clean s | RSS +queries MiB | recall@10 |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut rows: Vec<(&Build, &SizeReport)> = builds
        .iter()
        .flat_map(|b| b.reports.iter().map(move |r| (b, r)))
        .collect();
    rows.sort_by_key(|(_, r)| r.sections);
    for (build, r) in rows {
        table.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.0} | {:.1} | {:.2} | {:.0} | {} |\n",
            r.sections,
            build.label,
            r.one_client.p50_ms,
            r.one_client.p99_ms,
            r.many_clients.qps,
            r.many_clients.p99_ms,
            r.open_clean_seconds,
            r.rss_queries.total,
            r.recall_at_10.map_or("".into(), |v| format!("{v:.3}")),
        ));
    }
    table
}

fn compare_svg(path: &Path, builds: &[Build], clients: usize) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for build in builds {
        let line = |value: &dyn Fn(&SizeReport) -> f64| -> Vec<(f64, f64)> {
            build
                .reports
                .iter()
                .map(|r| (r.sections.max(1) as f64, value(r).max(0.01)))
                .collect()
        };
        series.push((
            format!("{}: p50, 1 client", build.label),
            line(&|r| r.one_client.p50_ms),
        ));
        series.push((
            format!("{}: p50, {clients} clients", build.label),
            line(&|r| r.many_clients.p50_ms),
        ));
    }
    draw_log_log(path, "Retrieve p50 vs collection size", series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comparison_is_label_equals_path() {
        assert_eq!(
            parse_compare("main=/tmp/a.csv"),
            Ok(("main".to_string(), PathBuf::from("/tmp/a.csv")))
        );
        for bad in ["main", "=a.csv", "main=", ""] {
            assert!(parse_compare(bad).is_err(), "{bad}");
        }
    }
}
