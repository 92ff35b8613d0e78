//! The bench's report: one row per size (what it measured), written as `results.md` (with the
//! server's stage timings), `results.csv` and `latency.svg`; `--from-csv` reads rows back.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use lathe_tools::eval::report::{draw_axes, draw_legend, draw_line_with_markers, COLOURS};
use lathe_tools::proc_status::Resident;

use crate::Args;

/// What one size measured: one row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SizeReport {
    pub(crate) target_sections: usize,
    pub(crate) sections: u64,
    pub(crate) documents: u64,
    pub(crate) text_bytes: u64,
    pub(crate) build_seconds: f64,
    /// CPU time (user + system) the server spent during the build: on a shared machine the wall
    /// time depends on the neighbours, this does not.
    pub(crate) build_cpu_seconds: f64,
    pub(crate) disk_bytes: u64,
    pub(crate) open_clean_seconds: f64,
    pub(crate) open_killed_seconds: f64,
    pub(crate) rss_open: Resident,
    pub(crate) rss_queries: Resident,
    pub(crate) one_client: Latency,
    pub(crate) many_clients: Latency,
    /// The server's own stage timings (RetrieveResponse.timings) of the 1-client run: stage,
    /// p50 ms, p99 ms, in the order the server reports them. Not in the CSV.
    pub(crate) one_client_stages: Vec<StageLatency>,
    /// `None` without a dense index.
    pub(crate) recall_at_10: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StageLatency {
    pub(crate) stage: String,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Latency {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) qps: f64,
}

impl SizeReport {
    pub(crate) fn build_mb_per_second(&self) -> f64 {
        if self.build_seconds <= 0.0 {
            return 0.0;
        }
        self.text_bytes as f64 / 1e6 / self.build_seconds
    }

    pub(crate) fn build_mb_per_cpu_second(&self) -> f64 {
        if self.build_cpu_seconds <= 0.0 {
            return 0.0;
        }
        self.text_bytes as f64 / 1e6 / self.build_cpu_seconds
    }
}

/// A table cell of resident memory: "total (anon + file)".
fn cell(resident: &Resident) -> String {
    format!(
        "{:.0} ({:.0} + {:.0})",
        resident.total, resident.anon, resident.file
    )
}

const TABLE_HEADER: &str = "| sections | documents | text MB | build s | build MB/s | build MB/CPU-s | disk MiB | open clean s | open kill -9 s | RSS open MiB (anon + file) | RSS +queries MiB (anon + file) | p50 1c ms | p99 1c ms | p50 Nc ms | p99 Nc ms | QPS Nc | recall@10 |";

fn markdown_table(reports: &[SizeReport], clients: usize) -> String {
    let mut table = TABLE_HEADER.replace(" Nc", &format!(" {clients}c"));
    table.push('\n');
    table.push_str(
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        table.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} |\n",
            r.sections,
            r.documents,
            r.text_bytes as f64 / 1e6,
            r.build_seconds,
            r.build_mb_per_second(),
            r.build_mb_per_cpu_second(),
            r.disk_bytes as f64 / (1024.0 * 1024.0),
            r.open_clean_seconds,
            r.open_killed_seconds,
            cell(&r.rss_open),
            cell(&r.rss_queries),
            r.one_client.p50_ms,
            r.one_client.p99_ms,
            r.many_clients.p50_ms,
            r.many_clients.p99_ms,
            r.many_clients.qps,
            r.recall_at_10.map_or("–".to_string(), |recall| format!("{recall:.3}")),
        ));
    }
    table
}

/// The server's stage timings of each size's 1-client run (sizes read back from a CSV have none).
fn stage_table(reports: &[SizeReport]) -> String {
    let mut table = String::new();
    for r in reports.iter().filter(|r| !r.one_client_stages.is_empty()) {
        table.push_str(&format!(
            "\nServer stage timings at {} sections, 1 client (p50 / p99 ms):\n\n| stage | p50 ms | p99 ms |\n|---|---:|---:|\n",
            r.sections
        ));
        for stage in &r.one_client_stages {
            table.push_str(&format!(
                "| {} | {:.2} | {:.2} |\n",
                stage.stage, stage.p50_ms, stage.p99_ms
            ));
        }
    }
    table
}

/// The rows of a `results.csv` (columns found by name; one missing, as in files written before
/// it existed, reads as 0).
pub(crate) fn parse_csv(text: &str) -> anyhow::Result<Vec<SizeReport>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("empty CSV")?.split(',').collect();
    let mut reports = Vec::new();
    for line in lines.filter(|line| !line.trim().is_empty()) {
        let values: Vec<&str> = line.split(',').collect();
        let number = |name: &str| -> f64 {
            header
                .iter()
                .position(|column| *column == name)
                .and_then(|i| values.get(i))
                .and_then(|value| value.parse().ok())
                .unwrap_or(0.0)
        };
        let recall = number("recall_at_10");
        reports.push(SizeReport {
            target_sections: number("sections") as usize,
            sections: number("sections") as u64,
            documents: number("documents") as u64,
            text_bytes: number("text_bytes") as u64,
            build_seconds: number("build_s"),
            build_cpu_seconds: number("build_cpu_s"),
            disk_bytes: number("disk_bytes") as u64,
            open_clean_seconds: number("open_clean_s"),
            open_killed_seconds: number("open_kill9_s"),
            rss_open: Resident {
                total: number("rss_open_mib"),
                anon: number("rss_open_anon_mib"),
                file: number("rss_open_file_mib"),
            },
            rss_queries: Resident {
                total: number("rss_queries_mib"),
                anon: number("rss_queries_anon_mib"),
                file: number("rss_queries_file_mib"),
            },
            one_client: Latency {
                p50_ms: number("p50_1c_ms"),
                p99_ms: number("p99_1c_ms"),
                qps: 0.0,
            },
            many_clients: Latency {
                p50_ms: number("p50_nc_ms"),
                p99_ms: number("p99_nc_ms"),
                qps: number("qps_nc"),
            },
            recall_at_10: (recall > 0.0).then_some(recall),
            one_client_stages: Vec::new(),
        });
    }
    Ok(reports)
}

/// `--from-csv`: the table and plot of earlier runs, sorted by size.
pub(crate) fn replot(args: &Args) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    for path in &args.from_csv {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        reports.extend(parse_csv(&text).with_context(|| format!("parsing {}", path.display()))?);
    }
    reports.sort_by_key(|r| r.sections);
    let files: Vec<String> = args
        .from_csv
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    write_outputs(
        args,
        &reports,
        &format!("## lathe-bench (from {})\n", files.join(", ")),
    )
}

fn csv_table(reports: &[SizeReport]) -> String {
    let mut csv = String::from("sections,documents,text_bytes,build_s,build_mb_s,build_cpu_s,disk_bytes,open_clean_s,open_kill9_s,rss_open_mib,rss_open_anon_mib,rss_open_file_mib,rss_queries_mib,rss_queries_anon_mib,rss_queries_file_mib,p50_1c_ms,p99_1c_ms,p50_nc_ms,p99_nc_ms,qps_nc,recall_at_10\n");
    for r in reports {
        csv.push_str(&format!(
            "{},{},{},{:.3},{:.3},{:.3},{},{:.3},{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{:.3},{:.3},{:.3},{:.1},{}\n",
            r.sections,
            r.documents,
            r.text_bytes,
            r.build_seconds,
            r.build_mb_per_second(),
            r.build_cpu_seconds,
            r.disk_bytes,
            r.open_clean_seconds,
            r.open_killed_seconds,
            r.rss_open.total,
            r.rss_open.anon,
            r.rss_open.file,
            r.rss_queries.total,
            r.rss_queries.anon,
            r.rss_queries.file,
            r.one_client.p50_ms,
            r.one_client.p99_ms,
            r.many_clients.p50_ms,
            r.many_clients.p99_ms,
            r.many_clients.qps,
            r.recall_at_10
                .map_or(String::new(), |recall| format!("{recall:.4}")),
        ));
    }
    csv
}

/// Latency and open time (both in ms, log scales) against corpus size.
fn latency_svg(path: &Path, reports: &[SizeReport], clients: usize) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = vec![
        (
            "p50, 1 client".into(),
            points(reports, |r| r.one_client.p50_ms),
        ),
        (
            "p99, 1 client".into(),
            points(reports, |r| r.one_client.p99_ms),
        ),
        (
            format!("p50, {clients} clients"),
            points(reports, |r| r.many_clients.p50_ms),
        ),
        (
            format!("p99, {clients} clients"),
            points(reports, |r| r.many_clients.p99_ms),
        ),
        (
            "open after clean stop".into(),
            points(reports, |r| r.open_clean_seconds * 1e3),
        ),
        (
            "open after kill -9".into(),
            points(reports, |r| r.open_killed_seconds * 1e3),
        ),
    ];
    draw_log_log(
        path,
        "Retrieve latency and open time vs corpus size",
        series,
    )
}

/// `series` (label, points) as lines with markers on log-log axes, sections against
/// milliseconds, with a legend, drawn to `path`.
pub(crate) fn draw_log_log(
    path: &Path,
    caption: &str,
    series: Vec<(String, Vec<(f64, f64)>)>,
) -> anyhow::Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x));
    let ys = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| y.max(0.01)));
    let (x_low, x_high) = bounds(xs);
    let (y_low, y_high) = bounds(ys);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x_low * 0.7..x_high * 1.4).log_scale(),
            (y_low * 0.7..y_high * 1.4).log_scale(),
        )
        .map_err(|e| plot_error(&e))?;
    draw_axes(&mut chart, "sections", "milliseconds").map_err(|e| plot_error(&e))?;
    for (i, (label, points)) in series.into_iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()].to_rgba();
        draw_line_with_markers(&mut chart, &label, points, color).map_err(|e| plot_error(&e))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

fn points(reports: &[SizeReport], value: impl Fn(&SizeReport) -> f64) -> Vec<(f64, f64)> {
    reports
        .iter()
        .map(|r| (r.sections.max(1) as f64, value(r).max(0.01)))
        .collect()
}

/// (min, max) of positive values; (1, 10) when there are none.
pub(crate) fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values.fold((f64::INFINITY, 0.0f64), |(low, high), v| {
        (low.min(v), high.max(v))
    });
    if !low.is_finite() || high <= 0.0 {
        return (1.0, 10.0);
    }
    (low, high.max(low * 1.01))
}

pub(crate) fn write_outputs(
    args: &Args,
    reports: &[SizeReport],
    header: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let markdown = format!(
        "{header}\n{}\n{}",
        markdown_table(reports, args.clients),
        stage_table(reports)
    );
    std::fs::write(args.out.join("results.md"), &markdown).context("writing results.md")?;
    std::fs::write(args.out.join("results.csv"), csv_table(reports))
        .context("writing results.csv")?;
    latency_svg(&args.out.join("latency.svg"), reports, args.clients)?;
    println!("{markdown}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_and_csv_have_one_row_per_size_and_the_plot_is_drawn() {
        let report = SizeReport {
            target_sections: 200,
            sections: 203,
            documents: 50,
            text_bytes: 2_000_000,
            build_seconds: 4.0,
            build_cpu_seconds: 2.0,
            disk_bytes: 3 * 1024 * 1024,
            open_clean_seconds: 0.5,
            open_killed_seconds: 0.6,
            rss_open: Resident {
                total: 150.0,
                anon: 120.0,
                file: 30.0,
            },
            rss_queries: Resident {
                total: 160.0,
                anon: 125.0,
                file: 35.0,
            },
            one_client: Latency {
                p50_ms: 3.0,
                p99_ms: 9.0,
                qps: 300.0,
            },
            many_clients: Latency {
                p50_ms: 6.0,
                p99_ms: 20.0,
                qps: 900.0,
            },
            recall_at_10: Some(0.987),
            one_client_stages: vec![StageLatency {
                stage: "coarse".into(),
                p50_ms: 1.5,
                p99_ms: 4.0,
            }],
        };
        let table = markdown_table(std::slice::from_ref(&report), 8);
        assert!(table.contains("| p50 8c ms |"), "{table}");
        assert!(
            table.contains("| 203 | 50 | 2.0 | 4.0 | 0.50 | 1.00 | 3 | 0.50 | 0.60 | 150 (120 + 30) | 160 (125 + 35) | 3.00 | 9.00 | 6.00 | 20.00 | 900 | 0.987 |"),
            "{table}"
        );
        let csv = csv_table(std::slice::from_ref(&report));
        assert_eq!(csv.lines().count(), 2);
        let mut read_back = parse_csv(&csv).unwrap();
        assert_eq!(read_back.len(), 1);
        // The CSV keeps 1-client QPS out and the target size is the size built.
        read_back[0].one_client.qps = report.one_client.qps;
        read_back[0].target_sections = report.target_sections;
        read_back[0].one_client_stages = report.one_client_stages.clone();
        assert!(stage_table(std::slice::from_ref(&report)).contains("| coarse | 1.50 | 4.00 |"));
        assert_eq!(read_back[0], report);
        assert_eq!(
            csv.lines().next().unwrap().split(',').count(),
            csv.lines().nth(1).unwrap().split(',').count()
        );
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("latency.svg");
        latency_svg(&svg, &[report], 8).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.contains("open after kill -9"), "legend missing");
    }
}
