//! `lathe eval` end to end on a tiny dataset: an in-process server over loopback gRPC, Lathe's
//! strategies and a baseline, the run file, the table and the plot.

mod common;

use std::path::{Path, PathBuf};

use lathe_tools::cli::{eval, EvalArgs};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models")
}

/// Three articles of three paragraphs; each question names words of one paragraph only.
fn write_dataset(dir: &Path) {
    let topics = [
        (
            "rivers",
            [
                "The Danube flows through ten countries before reaching the Black Sea.",
                "Barges carry grain and steel along the river every spring.",
                "Engineers built the Iron Gate dam to tame the gorge.",
            ],
        ),
        (
            "bakery",
            [
                "Sourdough bread rises slowly because wild yeast ferments the dough.",
                "The baker shapes croissants from laminated butter pastry at dawn.",
                "Rye loaves keep fresh for a week in a cool pantry.",
            ],
        ),
        (
            "comets",
            [
                "Halley's comet returns to the inner solar system every seventy-six years.",
                "Its icy nucleus sheds a glowing tail of dust and gas near the Sun.",
                "Astronomers photographed the coma from the Giotto probe in 1986.",
            ],
        ),
    ];
    let mut docs = String::new();
    let mut queries = String::new();
    for (doc_id, paragraphs) in topics {
        let mut text = String::new();
        let mut sections = Vec::new();
        for paragraph in paragraphs {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            let start = text.chars().count();
            text.push_str(paragraph);
            sections.push(serde_json::json!({"start": start, "end": text.chars().count()}));
        }
        docs.push_str(
            &serde_json::json!({"doc_id": doc_id, "title": doc_id, "text": text, "sections": sections})
                .to_string(),
        );
        docs.push('\n');
        // The answer: the last word-run of the second paragraph's first clause.
        let second = paragraphs[1];
        let start = text
            .find(second)
            .map(|b| text[..b].chars().count())
            .unwrap_or(0);
        let answer_text: String = second
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        let question = second
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        queries.push_str(
            &serde_json::json!({
                "qid": format!("q-{doc_id}"), "question": question, "doc_id": doc_id,
                "gold_sections": [1],
                "answers": [{"text": answer_text, "start": start, "end": start + answer_text.chars().count(), "section": 1}],
            })
            .to_string(),
        );
        queries.push('\n');
    }
    std::fs::write(dir.join("docs.jsonl"), docs).expect("write docs");
    std::fs::write(dir.join("queries.jsonl"), queries).expect("write queries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_runs_every_query_at_every_budget_and_writes_the_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dataset = dir.path().join("tiny");
    std::fs::create_dir(&dataset).expect("mkdir");
    write_dataset(&dataset);
    let out = dir.path().join("out");
    eval(EvalArgs {
        dataset,
        addr: None,
        models_dir: models_dir(),
        cpu_threads: 1,
        budgets: vec![32, 256],
        no_defaults: false,
        strategies: vec!["sentence".into(), "fixed".into()],
        max_tokens: vec![16],
        overlap: 0,
        top_k: 8,
        baseline_top_k: None,
        ingest_as: "sections".into(),
        with_baselines: false,
        baselines: Some(vec!["recursive-80-0".into()]),
        max_queries: None,
        seed: 42,
        concurrency: 2,
        out: out.clone(),
        run_file: None,
        keep_collections: false,
        reuse: None,
        section_tokens: None,
        progress_seconds: 5.0,
        connect: Default::default(),
    })
    .await
    .expect("eval");

    let run = std::fs::read_to_string(out.join("run.jsonl")).expect("run file");
    let lines: Vec<serde_json::Value> = run
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    // 3 queries × 2 budgets × (the defaults + 2 strategies + 1 baseline).
    assert_eq!(lines.len(), 24);
    let defaults_lines = lines.iter().filter(|l| l["strategy"] == "defaults");
    assert_eq!(defaults_lines.count(), 6);
    for line in &lines {
        assert!(line["qid"].as_str().is_some_and(|q| q.starts_with("q-")));
        for chunk in line["chunks"].as_array().expect("chunks") {
            assert!(chunk["start"].as_u64() < chunk["end"].as_u64());
        }
    }
    let results = std::fs::read_to_string(out.join("results.md")).expect("results");
    assert!(results.contains("| sentence/16 |"));
    assert!(results.contains("| recursive-80-0 |"));
    // Every question quotes its paragraph: at 256 tokens every system finds each answer.
    for system in ["defaults", "sentence/16", "fixed/16", "recursive-80-0"] {
        let row = format!("| 256 | {system} | 3 | 1.000 |");
        assert!(results.contains(&row), "missing `{row}` in\n{results}");
    }
    assert_eq!(
        results
            .matches(" chunks returned, 0 with text ≠ document text")
            .count(),
        4,
        "returned spans must match the document text:\n{results}"
    );
    // Each article is about 40 tokens: at 256 tokens nothing fills the budget, at 32 tokens the
    // answers use some of it.
    assert!(results.contains("| fill@32 | fill@256 |"), "{results}");
    for row in results.lines().filter(|l| l.starts_with("| 256 | ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let fill: f64 = cells[10].parse().expect("fill rate");
        let spans: f64 = cells[11].parse().expect("spans");
        assert!(fill > 0.0 && fill < 1.0, "fill rate in `{row}`");
        assert!(spans >= 1.0, "spans in `{row}`");
    }
    let svg = std::fs::read_to_string(out.join("budgets.svg")).expect("svg");
    assert!(svg.contains("recursive-80-0"));
}

/// Run by a CI job or into a file, `lathe eval` says how its ingests go: a line every
/// `--progress-seconds` and one when each upload ends (documents done of all, sizes, rates).
#[test]
fn eval_reports_ingest_progress_in_plain_lines_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dataset = dir.path().join("tiny");
    std::fs::create_dir(&dataset).expect("mkdir");
    write_dataset(&dataset);
    let server = common::binary::start(
        &dir.path().join("data"),
        &[("LATHE_MODELS__DENSE", "off".to_string())],
    );
    let output = std::process::Command::new(common::binary::lathe_binary())
        .arg("eval")
        .arg(&dataset)
        .args(["--addr", &server.address])
        .arg("--models-dir")
        .arg(models_dir())
        .args([
            "--budgets",
            "64",
            "--no-defaults",
            "--strategies",
            "sentence",
        ])
        .args([
            "--baselines",
            "recursive-80-0",
            "--progress-seconds",
            "0.05",
        ])
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .expect("run lathe eval");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("ingesting into "))
        .collect();
    // Lathe's collection and the baseline's each end with every document applied.
    for collection in ["-lathe: ", "-recursive-80-0: "] {
        let last = progress
            .iter()
            .rev()
            .find(|line| line.contains(collection))
            .unwrap_or_else(|| panic!("no progress of {collection}: {stderr}"));
        let counts = last
            .split("documents ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|counts| counts.split_once('/'))
            .unwrap_or_else(|| panic!("{last}"));
        assert_eq!(counts.0, counts.1, "{last}");
        assert!(last.ends_with(" documents/s"), "{last}");
    }
    assert!(
        progress
            .iter()
            .any(|line| line.contains("-lathe: documents 3/3, ")),
        "{stderr}"
    );
    common::binary::stop(server);
}
