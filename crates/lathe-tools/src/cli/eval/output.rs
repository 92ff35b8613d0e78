//! What `lathe eval` writes: the run file of returned spans, and the report (Markdown table with
//! its notes and span checks, recall plot) printed and written to `--out`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::eval::report;

use super::collections::EvalCollections;
use super::measure::{Measurements, SpanChecks};
use super::{EvalArgs, EvalInputs, SystemKind};

pub(super) fn create_run_file(
    args: &EvalArgs,
) -> anyhow::Result<(PathBuf, std::io::BufWriter<std::fs::File>)> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let run_path = args
        .run_file
        .clone()
        .unwrap_or_else(|| args.out.join("run.jsonl"));
    let run_file = std::io::BufWriter::new(
        std::fs::File::create(&run_path)
            .with_context(|| format!("creating {}", run_path.display()))?,
    );
    Ok((run_path, run_file))
}

/// Everything the report is made of.
pub(super) struct ReportInputs<'a> {
    pub(super) args: &'a EvalArgs,
    pub(super) inputs: &'a EvalInputs,
    pub(super) collections: &'a EvalCollections,
    pub(super) measurements: &'a Measurements,
    /// The server's address, or that it ran in this process.
    pub(super) server_label: &'a str,
}

/// Span checks, one line per system, reported beside the table.
fn span_check_notes(
    collections: &EvalCollections,
    checks: &HashMap<String, SpanChecks>,
) -> Vec<String> {
    let mut notes = Vec::with_capacity(collections.systems.len());
    for system in &collections.systems {
        let check = checks.get(&system.label).copied().unwrap_or_default();
        let mut line = format!(
            "{}: {} chunks returned, {} with text ≠ document text at the returned code points",
            system.label, check.chunks, check.offset_mismatches
        );
        if let SystemKind::Baseline(i) = system.kind {
            let b = &collections.baselines[i];
            line.push_str(&format!(
                "; {} of them whole {}-character pieces (overlap {})",
                check.whole_pieces, b.chunk_size, b.chunk_overlap
            ));
            debug_assert_eq!(b.name, system.label);
        }
        notes.push(line);
    }
    notes
}

/// Prints the Markdown report and writes it, with the recall plot, to `--out`.
pub(super) fn write_report(parts: &ReportInputs, run_path: &Path) -> anyhow::Result<()> {
    let ReportInputs {
        args,
        inputs,
        collections,
        measurements,
        server_label,
    } = parts;
    let mut notes = collections.notes.clone();
    notes.extend(span_check_notes(collections, &measurements.checks));
    let labels: Vec<String> = collections
        .systems
        .iter()
        .map(|s| s.label.clone())
        .collect();
    let mut budgets = args.budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    let table = report::markdown(&measurements.cells, &labels, &budgets);
    let header = format!(
        "## lathe eval: {}\n\n{} of {} queries (seed {}), {} documents; top_k {} (baselines {}; the system \"defaults\" sends only the query and the budget, the others `diversity` 0), overlap {} tokens; server {}; concurrency {}; {} retrieves in {:.1} s. Latency is client-side wall time per Retrieve over loopback gRPC. Budgets and recounts in the MiniLM tokenizer (no special tokens).\n\n{}\n",
        args.dataset.display(),
        inputs.query_indices.len(),
        inputs.dataset.queries.len(),
        args.seed,
        inputs.dataset.documents.len(),
        args.top_k,
        args.baseline_top_k.unwrap_or(args.top_k),
        args.overlap,
        server_label,
        args.concurrency.max(1),
        measurements.retrieves,
        measurements.elapsed.as_secs_f64(),
        notes.iter().map(|n| format!("- {n}")).collect::<Vec<_>>().join("\n"),
    );
    let markdown = format!("{header}\n{table}");
    println!("{markdown}");
    let results_path = args.out.join("results.md");
    std::fs::write(&results_path, &markdown)
        .with_context(|| format!("writing {}", results_path.display()))?;
    let svg_path = args.out.join("budgets.svg");
    report::budget_svg(&svg_path, &measurements.cells, &labels, &budgets)?;
    eprintln!(
        "wrote {}, {} and {}",
        results_path.display(),
        svg_path.display(),
        run_path.display()
    );
    Ok(())
}
