//! The evaluation report: Markdown tables and the budget plot (SVG): recall, fill rate and
//! latency against the token budget.

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

/// Colours told apart by most readers, colour-blind ones included (Okabe and Ito's palette without
/// its yellow, which is unreadable on white), then greys.
pub const COLOURS: [RGBColor; 9] = [
    RGBColor(0, 0, 0),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(120, 120, 120),
    RGBColor(180, 180, 180),
];

/// Point markers, so lines stay apart in grey print and where they cross.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

const MARKERS: [Marker; 4] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Cross,
];

/// The look of system `index`'s line: its colour and marker (the pairs repeat only after 36).
fn series_style(index: usize) -> (RGBAColor, Marker) {
    let colour = COLOURS[index % COLOURS.len()].to_rgba();
    (colour, MARKERS[index % MARKERS.len()])
}

/// A system named `defaults…` is drawn thicker (and last), so no other line hides it.
fn line_width(system: &str) -> u32 {
    if system.starts_with("defaults") {
        4
    } else {
        2
    }
}

/// One panel of the budget plot: its title, y axis, and the metric of a cell.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    value: fn(&Summary) -> f64,
    /// Whether the metric is a share (kept within 0..1 when the axis is zoomed).
    share: bool,
}

const PANELS: [Panel; 3] = [
    Panel {
        title: "Answer recall",
        y_desc: "answer recall",
        value: |s| s.answer_recall,
        share: true,
    },
    Panel {
        title: "Fill rate (tokens used / budget)",
        y_desc: "fill rate",
        value: |s| s.fill_rate,
        share: true,
    },
    Panel {
        title: "Latency, p50",
        y_desc: "milliseconds",
        value: |s| milliseconds(s.latency_p50),
        share: false,
    },
];

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Answer recall, fill rate and p50 latency against the token budget, side by side, one line per
/// system: the x axis labelled at each budget measured (log scale), each y axis zoomed to its
/// data, each system with its own colour and marker in a legend beside the panels, and the
/// defaults drawn last and thicker.
pub fn budget_svg(
    path: &Path,
    cells: &[Cell],
    systems: &[String],
    budgets: &[u32],
) -> anyhow::Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let (panels, legend) = root.split_horizontally(1240);
    let mut order: Vec<usize> = (0..systems.len()).collect();
    order.sort_by_key(|&i| systems[i].starts_with("defaults"));
    for (area, panel) in panels.split_evenly((1, PANELS.len())).iter().zip(&PANELS) {
        draw_panel(area, panel, (cells, systems, budgets), &order).map_err(|e| plot_error(&e))?;
    }
    draw_side_legend(&legend, systems).map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

fn draw_panel(
    area: &Area,
    panel: &Panel,
    (cells, systems, budgets): (&[Cell], &[String], &[u32]),
    order: &[usize],
) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = systems
        .iter()
        .map(|system| {
            let point =
                |b: u32| find(cells, system, b).map(|c| (b as f64, (panel.value)(&c.summary)));
            budgets.iter().filter_map(|&b| point(b)).collect()
        })
        .collect();
    let (low, high) = zoomed(series.iter().flatten().map(|&(_, y)| y), panel.share);
    let smallest = budgets.iter().copied().min().unwrap_or(1).max(1) as f64;
    let largest = budgets.iter().copied().max().unwrap_or(1).max(1) as f64;
    let key_points: Vec<f64> = budgets.iter().map(|&b| b as f64).collect();
    let x = (smallest * 0.85..largest * 1.15)
        .log_scale()
        .with_key_points(key_points);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x, low..high)?;
    // Enough decimals that the labels, about a tenth of the span apart, differ.
    let digits = (-((high - low) / 10.0).log10()).ceil().clamp(0.0, 4.0) as usize;
    chart
        .configure_mesh()
        .x_desc("token budget")
        .y_desc(panel.y_desc)
        .x_labels(budgets.len())
        .x_label_formatter(&|x| budget_label(*x))
        .y_label_formatter(&|y| format!("{y:.digits$}"))
        .draw()?;
    for &index in order {
        let (colour, marker) = series_style(index);
        let points = &series[index];
        let line = colour.stroke_width(line_width(&systems[index]));
        chart.draw_series(LineSeries::new(points.iter().copied(), line))?;
        draw_markers(&mut chart, points, colour, marker)?;
    }
    Ok(())
}

/// The y range of `values`: their span with a tenth of it as margin each side (a share kept
/// within 0..1), so lines that all sit in 0.75..1.0 are not squashed against the top.
fn zoomed(values: impl Iterator<Item = f64>, share: bool) -> (f64, f64) {
    let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !low.is_finite() {
        return (0.0, 1.0);
    }
    let least = if share { 0.01 } else { high.abs() * 0.05 + 0.1 };
    let margin = ((high - low) * 0.1).max(least);
    let top = if share {
        (high + margin).min(1.0)
    } else {
        high + margin
    };
    ((low - margin).max(0.0), top)
}

/// `128`, `1k`, `32k`: a budget as the axis labels it.
fn budget_label(budget: f64) -> String {
    let budget = budget.round() as u64;
    if budget >= 1024 && budget.is_multiple_of(1024) {
        format!("{}k", budget / 1024)
    } else {
        budget.to_string()
    }
}

fn draw_markers<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    points: &[(f64, f64)],
    colour: RGBAColor,
    marker: Marker,
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = colour.filled();
    let points = points.iter().copied();
    match marker {
        Marker::Circle => chart.draw_series(points.map(|p| Circle::new(p, 4, style)))?,
        Marker::Triangle => chart.draw_series(points.map(|p| TriangleMarker::new(p, 5, style)))?,
        Marker::Square => chart.draw_series(
            points.map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], style)),
        )?,
        Marker::Cross => {
            chart.draw_series(points.map(|p| Cross::new(p, 5, colour.stroke_width(2))))?
        }
    };
    Ok(())
}

/// The legend in its own column: each system's line, marker and name.
fn draw_side_legend(area: &Area, systems: &[String]) -> DrawResult {
    area.draw(&Text::new("systems", (10, 40), ("sans-serif", 16)))?;
    for (index, system) in systems.iter().enumerate() {
        let (colour, marker) = series_style(index);
        let y = 75 + 26 * index as i32;
        let line = colour.stroke_width(line_width(system));
        area.draw(&PathElement::new(vec![(10, y), (50, y)], line))?;
        let style = colour.filled();
        match marker {
            Marker::Circle => area.draw(&Circle::new((30, y), 4, style))?,
            Marker::Triangle => area.draw(&TriangleMarker::new((30, y), 5, style))?,
            Marker::Square => area.draw(&Rectangle::new([(26, y - 4), (34, y + 4)], style))?,
            Marker::Cross => area.draw(&Cross::new((30, y), 5, colour.stroke_width(2)))?,
        }
        area.draw(&Text::new(system.as_str(), (60, y - 7), ("sans-serif", 14)))?;
    }
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
    fn the_plot_draws_recall_fill_and_latency_with_a_labelled_line_per_system() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("budgets.svg");
        let systems: Vec<String> = ["defaults", "sentence/64", "recursive-400-0"]
            .map(String::from)
            .to_vec();
        let budgets = [128, 1024, 32768];
        let mut cells = Vec::new();
        for (rank, system) in systems.iter().enumerate() {
            for (step, &budget) in budgets.iter().enumerate() {
                let summary = Summary {
                    queries: 10,
                    answer_recall: 0.95 - 0.05 * rank as f64 + 0.01 * step as f64,
                    fill_rate: 0.99 - 0.01 * step as f64,
                    latency_p50: Duration::from_millis(5 + 3 * step as u64),
                    ..Summary::default()
                };
                let system = system.clone();
                cells.push(Cell {
                    budget,
                    system,
                    summary,
                });
            }
        }
        budget_svg(&path, &cells, &systems, &budgets).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        assert!(svg.starts_with("<svg"));
        for text in [
            "Answer recall",
            "Fill rate",
            "Latency",
            "recursive-400-0",
            "\n1k\n",
            "\n32k\n",
        ] {
            assert!(svg.contains(text), "{text} not in the plot");
        }
        // Each system's line in each of the three panels and in the legend, in its own colour;
        // the defaults (black) thicker than the rest.
        for (colour, width) in [("#000000", 4), ("#E69F00", 2), ("#56B4E9", 2)] {
            let line = format!(r#"stroke="{colour}" stroke-width="{width}" points"#);
            assert_eq!(svg.matches(&line).count(), 3 + 1, "{line}");
        }
    }

    #[test]
    fn the_y_axis_is_zoomed_to_the_data_and_budgets_read_short() {
        let (low, high) = zoomed([0.80, 0.95, 0.90].into_iter(), true);
        assert!(
            (0.78..0.80).contains(&low) && (0.95..0.98).contains(&high),
            "{low}..{high}"
        );
        assert_eq!(zoomed([0.99, 1.0].into_iter(), true).1, 1.0);
        assert_eq!(zoomed(std::iter::empty(), true), (0.0, 1.0));
        let (low, high) = zoomed([3.0, 12.0].into_iter(), false);
        assert!(low < 3.0 && high > 12.0 && low >= 0.0);
        assert_eq!(budget_label(128.0), "128");
        assert_eq!(budget_label(32768.0), "32k");
        assert_eq!(budget_label(1500.0), "1500");
    }
}
