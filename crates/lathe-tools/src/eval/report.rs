//! The evaluation report: Markdown tables and the recall-vs-budget plot (SVG).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::Summary;

/// One (budget, system) result.
#[derive(Clone, Debug)]
pub struct Cell {
    pub budget: u32,
    pub system: String,
    pub summary: Summary,
}

fn milliseconds(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn find<'a>(cells: &'a [Cell], system: &str, budget: u32) -> Option<&'a Cell> {
    cells
        .iter()
        .find(|c| c.system == system && c.budget == budget)
}

/// The recall and fill-rate matrices (systems × budgets) and the full table (one row per budget
/// and system).
pub fn markdown(cells: &[Cell], systems: &[String], budgets: &[u32]) -> String {
    let mut out = String::new();
    let recall = |s: &Summary| s.answer_recall;
    matrix(
        &mut out,
        cells,
        systems,
        budgets,
        ("Answer recall", "recall", &recall),
    );
    let fill = |s: &Summary| s.fill_rate;
    matrix(
        &mut out,
        cells,
        systems,
        budgets,
        ("Fill rate (tokens used / budget)", "fill", &fill),
    );
    let _ = writeln!(out, "\n### All metrics\n");
    let _ = writeln!(
        out,
        "| budget | system | queries | answer recall | MRR | doc hit | gold precision | over budget | mean tokens | fill rate | spans | p50 ms | p95 ms | p99 ms |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &budget in budgets {
        for system in systems {
            let Some(cell) = find(cells, system, budget) else {
                continue;
            };
            let s = &cell.summary;
            let _ = writeln!(
                out,
                "| {budget} | {system} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} |",
                s.queries,
                s.answer_recall,
                s.mrr,
                s.doc_hit,
                s.gold_precision,
                s.over_budget,
                s.mean_tokens,
                s.fill_rate,
                s.distinct_spans,
                milliseconds(s.latency_p50),
                milliseconds(s.latency_p95),
                milliseconds(s.latency_p99),
            );
        }
    }
    out
}

/// (heading, column prefix, the metric) of one matrix.
type MatrixSpec<'a> = (&'a str, &'a str, &'a dyn Fn(&Summary) -> f64);

/// One metric as a matrix: a row per system, a column per budget.
fn matrix(out: &mut String, cells: &[Cell], systems: &[String], budgets: &[u32], spec: MatrixSpec) {
    let (heading, prefix, metric) = spec;
    let _ = writeln!(out, "### {heading} by budget\n");
    let _ = write!(out, "| system |");
    for budget in budgets {
        let _ = write!(out, " {prefix}@{budget} |");
    }
    let _ = write!(out, "\n|---|");
    for _ in budgets {
        let _ = write!(out, "---:|");
    }
    out.push('\n');
    for system in systems {
        let _ = write!(out, "| {system} |");
        for &budget in budgets {
            match find(cells, system, budget) {
                Some(cell) => {
                    let _ = write!(out, " {:.3} |", metric(&cell.summary));
                }
                None => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    out.push('\n');
}

/// Answer recall against budget (log scale), one line per system.
pub fn recall_svg(
    path: &Path,
    cells: &[Cell],
    systems: &[String],
    budgets: &[u32],
) -> anyhow::Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let smallest = budgets.iter().copied().min().unwrap_or(1).max(1) as f64;
    let largest = budgets.iter().copied().max().unwrap_or(1).max(1) as f64;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Answer recall vs token budget", ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((smallest * 0.85..largest * 1.15).log_scale(), 0f64..1f64)
        .map_err(|e| plot_error(&e))?;
    draw_axes(&mut chart, "token budget (MiniLM tokens)", "answer recall")
        .map_err(|e| plot_error(&e))?;
    for (i, system) in systems.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = budgets
            .iter()
            .filter_map(|&b| find(cells, system, b).map(|c| (b as f64, c.summary.answer_recall)))
            .collect();
        draw_line_with_markers(&mut chart, system.as_str(), points, color)
            .map_err(|e| plot_error(&e))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

/// The grid and both axes, named `x_desc` and `y_desc`; x labels whole, y labels to one place.
pub fn draw_axes<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
}

/// One labelled line with a dot at each point, in `color` (its legend entry a short line).
pub fn draw_line_with_markers<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    label: &str,
    points: Vec<(f64, f64)>,
    color: RGBAColor,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    Ok(())
}

/// The legend of every labelled series, boxed, at `position`.
pub fn draw_legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells() -> Vec<Cell> {
        let mut cells = Vec::new();
        for (system, base) in [("sentence/64", 0.5), ("recursive-400-0", 0.3)] {
            for (i, budget) in [128u32, 256].into_iter().enumerate() {
                cells.push(Cell {
                    budget,
                    system: system.to_string(),
                    summary: Summary {
                        queries: 10,
                        answer_recall: base + 0.1 * i as f64,
                        fill_rate: 0.9,
                        distinct_spans: 2.0 + i as f64,
                        ..Summary::default()
                    },
                });
            }
        }
        cells
    }

    #[test]
    fn the_table_has_a_row_per_cell_and_a_recall_matrix() {
        let systems = vec!["sentence/64".to_string(), "recursive-400-0".to_string()];
        let table = markdown(&cells(), &systems, &[128, 256]);
        assert!(table.contains("| sentence/64 | 0.500 | 0.600 |"));
        assert!(table.contains("| recursive-400-0 | 0.300 | 0.400 |"));
        assert_eq!(table.matches("| 128 |").count(), 2);
        assert!(table.contains("| fill@128 | fill@256 |"));
        assert!(table.contains("| sentence/64 | 0.900 | 0.900 |"));
        // fill rate and spans sit after mean tokens.
        assert!(table.contains("| 0.0 | 0.900 | 3.00 |"), "{table}");
    }

    #[test]
    fn the_plot_is_an_svg_with_one_line_per_system() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("recall.svg");
        let systems = vec!["sentence/64".to_string(), "recursive-400-0".to_string()];
        recall_svg(&path, &cells(), &systems, &[128, 256]).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("recursive-400-0"));
        assert!(svg.matches("<polyline").count() >= 2);
    }
}
