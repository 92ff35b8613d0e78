//! The dependency rule of ARCHITECTURE.md inside the server crate, checked on the source: every
//! `crate::<module>` path in a module's code (its `use` lines and any path written inline) must
//! name a module the rule lets it import. Arrows point down: the gRPC edge calls the service, the
//! service runs the pipelines, the pipelines call the index and the leaves; nothing below the edge
//! names tonic or prost, and nothing but `main.rs` names the tools crate. A module the table has
//! no row for fails the test, so a new module gets a row before it gets code. Test modules and
//! test-only helper functions (`#[cfg(test)] mod …`, `#[cfg(test)] fn …`) are not checked: a unit
//! test may build whatever it needs.
//!
//! Between crates Cargo keeps the rule: the text crate (`tokens`, `tokenizer`, `sections`,
//! `chunk`, re-exported at the server's root under those names) depends on no other crate of the
//! workspace, and the tools crate not on the server. ARCHITECTURE.md's table is checked against
//! `RULE` here too, so the two cannot drift.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The error type: every layer may use it.
const ERROR: &str = "error";

/// Which top-level modules of `src/` each top-level module may import. The layout the issue asks
/// for (`service/`, `ingest/`, `query/`).
const RULE: &[(&str, &[&str])] = &[
    // Leaves, bottom up. (`tokens`, `tokenizer`, `sections` and `chunk` are the text crate's:
    // they import nothing of this crate, and Cargo keeps it so.)
    (ERROR, &[]),
    ("content_hash", &[]),
    // The SIGBUS handler's last log line: raw syscalls, nothing of the crate.
    ("mapped_fault", &[]),
    // Panics as one log line; a dependency's panic caught as an error.
    ("panic_log", &[]),
    // Unit tests' capture of JSON log lines (compiled for tests only).
    ("test_log", &[]),
    ("config", &[ERROR]),
    ("telemetry", &[ERROR]),
    ("cpu_pool", &[ERROR]),
    ("types", &[ERROR]),
    ("embed", &[ERROR, "tokens", "tokenizer", "cpu_pool"]),
    ("dense", &[ERROR, "embed", "cpu_pool", "panic_log"]),
    (
        "index",
        &[
            ERROR,
            "types",
            "tokens",
            "content_hash",
            "embed",
            "dense",
            "cpu_pool",
            "panic_log",
        ],
    ),
    // The write log on NATS JetStream: another edge (it encodes entries with prost), below the
    // service, which runs it.
    (
        "replication",
        &[ERROR, "types", "index", "embed", "config", "content_hash"],
    ),
    // The single node's durable write queue (redb on disk, entries encoded with prost): another
    // edge, below the service, which runs its index workers. It stores sectioned documents.
    (
        "write_queue",
        &[ERROR, "types", "ingest", "sections", "content_hash"],
    ),
    // The two pipelines: stages over the leaves and the index (read-only for queries).
    (
        "ingest",
        &[
            ERROR,
            "types",
            "tokens",
            "tokenizer",
            "content_hash",
            "chunk",
            "sections",
            "embed",
            "index",
            "cpu_pool",
            "config",
        ],
    ),
    (
        "query",
        &[
            ERROR,
            "types",
            "tokens",
            "tokenizer",
            "content_hash",
            "chunk",
            "embed",
            "index",
            "cpu_pool",
            "config",
        ],
    ),
    // The service: orchestration over the pipelines; knows nothing of the edge.
    (
        "service",
        &[
            ERROR,
            "types",
            "tokens",
            "tokenizer",
            "chunk",
            "embed",
            "index",
            "content_hash",
            "cpu_pool",
            "config",
            "telemetry",
            "sections",
            "ingest",
            "query",
            "replication",
            "write_queue",
        ],
    ),
    // The gRPC edge: converts proto ⇄ domain types and calls the service.
    ("api", &[ERROR, "types", "config", "telemetry", "service"]),
    // `lathe serve`: logging, the models check, signals, then the edge's server.
    (
        "launch",
        &[ERROR, "api", "config", "mapped_fault", "panic_log"],
    ),
    // `lathe dense-recall`: opens a stopped server's index to measure the dense leg's recall
    // against exact search (embeds the query texts, builds one graph with the index's distance).
    ("dense_recall", &[ERROR, "dense", "embed", "index", "types"]),
    // `lathe export`: opens a snapshot file's index to write its documents out as JSONL.
    ("export", &[ERROR, "index"]),
];

/// Modules below the edge: they must not name tonic or prost (proto types and tonic stay in
/// `src/api/`).
const BELOW_THE_EDGE: &[&str] = &[
    "service",
    "ingest",
    "query",
    "content_hash",
    "index",
    "dense",
    "embed",
    "dense_recall",
    "export",
    "types",
    "config",
    "cpu_pool",
    ERROR,
];

/// Imports the rule forbids that are known and owned by another change, as (file, module,
/// imported), each with the issue it belongs to. Empty it as they are fixed: an entry that no
/// longer matches fails the test too, so the list cannot go stale.
const KNOWN_VIOLATIONS: &[(&str, &str, &str)] = &[];

/// The binary: `main.rs` is the `lathe` front end: `serve` (`launch`, `config`), the hidden
/// `dense-recall` and `export`, and the tools crate's client subcommands. The benchmark programs are the tools
/// crate's, which Cargo keeps from the server.
const BINARY_RULE: &[(&str, &[&str])] = &[(
    "src/main.rs",
    &["launch", "config", "dense_recall", "export"],
)];

/// The one file of `src/` that may name the tools crate (the package depends on it for the
/// `lathe` binary's client subcommands, so Cargo alone would let the library name it too).
const TOOLS_USER: &str = "src/main.rs";

fn source_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The file's code with comments, string contents and `#[cfg(test)] mod …` blocks removed.
fn code_outside_tests(source: &str) -> String {
    let mut code = String::with_capacity(source.len());
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // Comments and other attributes between it and its item say nothing of imports.
            while lines.peek().is_some_and(|next| {
                let next = next.trim_start();
                next.starts_with("//") || next.starts_with("#[")
            }) {
                lines.next();
            }
            // A test module, or a test-only helper function beside the code, of any visibility.
            let next_is_test_item = lines.peek().is_some_and(|next| {
                let item = without_visibility(next.trim_start());
                item.starts_with("mod ") || item.starts_with("fn ")
            });
            if next_is_test_item {
                skip_block(&mut lines);
                continue;
            }
        }
        code.push_str(strip_comment_and_strings(line).as_str());
        code.push('\n');
    }
    code
}

/// `item` without a leading `pub` or `pub(…)`.
fn without_visibility(item: &str) -> &str {
    let Some(rest) = item.strip_prefix("pub") else {
        return item;
    };
    match rest.strip_prefix('(') {
        Some(scoped) => scoped
            .split_once(')')
            .map_or(item, |(_, after)| after.trim_start()),
        None => rest.trim_start(),
    }
}

/// Consumes the lines of the block that starts on the next line, up to its closing brace.
fn skip_block<'a>(lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>) {
    let mut depth = 0i64;
    let mut opened = false;
    for line in lines.by_ref() {
        let line = strip_comment_and_strings(line);
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return;
        }
        if !opened && line.trim_end().ends_with(';') {
            // `mod tests;`: the module lives in its own file, which is checked as a test file.
            return;
        }
    }
}

/// The line without its `//` comment and with the contents of string literals blanked, so that
/// a path written in a message or a doc comment is not taken for an import.
fn strip_comment_and_strings(line: &str) -> String {
    let mut kept = String::with_capacity(line.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut previous = ' ';
    for c in line.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                kept.push('"');
            }
            continue;
        }
        if c == '/' && previous == '/' {
            kept.pop();
            break;
        }
        if c == '"' {
            in_string = true;
        }
        kept.push(c);
        previous = c;
    }
    kept
}

/// The top-level modules `code` names through `crate::…`, including each name of a grouped
/// `use crate::{a, b::c}`.
fn imported_modules(code: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_identifier = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_identifier {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            for item in top_level_items(group) {
                let name = leading_identifier(item.trim());
                if !name.is_empty() && name != "self" {
                    modules.insert(name.to_string());
                }
            }
            continue;
        }
        let name = leading_identifier(rest);
        if !name.is_empty() {
            modules.insert(name.to_string());
        }
    }
    modules
}

/// The comma-separated items of a `use` group whose opening brace is just before `group`, up to
/// its closing brace; nested groups stay inside their item.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut item_start = 0;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[item_start..at]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[item_start..at]);
                item_start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&group[item_start..]);
    items
}

fn leading_identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level module a file of `src/` belongs to (`src/api/grpc.rs` → `api`), or `None` for
/// the crate root and the binaries.
fn owning_module(relative: &Path) -> Option<String> {
    let mut parts = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    if first == "lib.rs" || first == "main.rs" || first == "bin" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// (file, importing module, imported module) for every import the rule forbids.
fn violations() -> Vec<(String, String, String)> {
    let root = source_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(root.parent().unwrap())
            .unwrap()
            .to_path_buf();
        let relative_name = relative.to_string_lossy().replace('\\', "/");
        let Some(module) = owning_module(file.strip_prefix(&root).unwrap()) else {
            continue;
        };
        let source = std::fs::read_to_string(&file).expect("read source");
        let Some((_, allowed)) = RULE.iter().find(|(name, _)| *name == module) else {
            found.push((
                relative_name,
                module,
                "<a module the rule has no row for>".into(),
            ));
            continue;
        };
        let code = code_outside_tests(&source);
        for imported in imported_modules(&code) {
            if imported != module && !allowed.contains(&imported.as_str()) {
                found.push((relative_name.clone(), module.clone(), imported));
            }
        }
        if BELOW_THE_EDGE.contains(&module.as_str()) {
            for edge_crate in ["tonic", "prost"] {
                if names_crate(&code, edge_crate) {
                    found.push((
                        relative_name.clone(),
                        module.clone(),
                        edge_crate.to_string(),
                    ));
                }
            }
        }
    }
    found
}

/// Whether `code` names the external crate `name` in a path (`name::…`).
fn names_crate(code: &str, name: &str) -> bool {
    let pattern = format!("{name}::");
    code.match_indices(&pattern).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

#[test]
fn every_module_imports_only_what_the_rule_allows() {
    let found = violations();
    let known = |(file, module, imported): &(String, String, String)| {
        KNOWN_VIOLATIONS
            .iter()
            .any(|(f, m, i)| f == file && m == module && i == imported)
    };
    let new: Vec<_> = found.iter().filter(|v| !known(v)).collect();
    assert!(
        new.is_empty(),
        "imports the dependency rule (ARCHITECTURE.md) forbids, as (file, module, imported):\n{new:#?}"
    );
    let stale: Vec<_> = KNOWN_VIOLATIONS
        .iter()
        .filter(|(f, m, i)| {
            !found
                .iter()
                .any(|(ff, mm, ii)| ff == f && mm == m && ii == i)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "known violations that are fixed: remove them from KNOWN_VIOLATIONS:\n{stale:#?}"
    );
}

#[test]
fn only_main_names_the_tools_and_the_binary_keeps_to_its_rule() {
    let root = source_root();
    for (file, allowed) in BINARY_RULE {
        let path = root.parent().unwrap().join(file);
        let source = std::fs::read_to_string(&path).expect("read binary source");
        let code = code_outside_tests(&source).replace("lathe::", "crate::");
        for imported in imported_modules(&code) {
            assert!(
                allowed.contains(&imported.as_str()),
                "{file} imports `{imported}`; the rule allows {allowed:?}"
            );
        }
    }
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for file in files {
        let relative = file.strip_prefix(root.parent().unwrap()).unwrap();
        let relative = relative.to_string_lossy().replace('\\', "/");
        let code = code_outside_tests(&std::fs::read_to_string(&file).expect("read source"));
        assert!(
            relative == TOOLS_USER || !names_crate(&code, "lathe_tools"),
            "{relative} names the tools crate: only {TOOLS_USER} may (the server speaks no client)"
        );
    }
}

/// The rows of ARCHITECTURE.md's dependency table: module → the modules its row names, each
/// written in backticks (`error` is implied, as the table's header says).
fn architecture_table() -> Vec<(String, BTreeSet<String>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(path).expect("read ARCHITECTURE.md");
    let section = text
        .split("## The dependency rule")
        .nth(1)
        .expect("ARCHITECTURE.md has a dependency rule section");
    let backticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut rows = Vec::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() < 4 || cells[1].contains("---") || cells[1].trim() == "module" {
            continue;
        }
        let mayimport: BTreeSet<String> = backticked(cells[2])
            .into_iter()
            .filter(|name| name != ERROR)
            .collect();
        for module in backticked(cells[1]) {
            rows.push((module, mayimport.clone()));
        }
    }
    rows
}

#[test]
fn architecture_md_states_the_rule_the_code_keeps() {
    let table = architecture_table();
    for (module, allowed) in RULE {
        let expected: BTreeSet<String> = allowed
            .iter()
            .filter(|name| **name != ERROR)
            .map(|name| name.to_string())
            .collect();
        let written = table
            .iter()
            .find(|(name, _)| name == module)
            .map(|(_, names)| names.clone());
        assert_eq!(
            written.as_ref(),
            Some(&expected),
            "ARCHITECTURE.md's row for `{module}` must name exactly what RULE lets it import"
        );
    }
    for (name, _) in &table {
        assert!(
            RULE.iter().any(|(module, _)| module == name),
            "ARCHITECTURE.md has a row for `{name}`, which RULE does not know"
        );
    }
}

#[test]
fn the_checker_reads_grouped_inline_and_commented_paths_correctly() {
    let source = r#"
use crate::{error::Result, types::{A, B}, self};
use crate::tokens::TokenOffsets;
fn f() { let _ = crate::cache::Cache::new(); } // crate::cli is only mentioned here
const MESSAGE: &str = "see crate::api for the edge";
#[cfg(test)]
mod tests {
    use crate::service::Engine;
}
#[cfg(test)]
pub(crate) fn test_helper() -> u8 {
    crate::query::helper()
}
"#;
    let modules = imported_modules(&code_outside_tests(source));
    let expected: BTreeSet<String> = ["error", "types", "tokens", "cache"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(modules, expected);
    assert_eq!(
        owning_module(Path::new("api/grpc.rs")).as_deref(),
        Some("api")
    );
    assert_eq!(
        owning_module(Path::new("types.rs")).as_deref(),
        Some("types")
    );
    assert_eq!(owning_module(Path::new("bin/lathe-load.rs")), None);
    assert!(names_crate("#[tonic::async_trait]", "tonic"));
    assert!(!names_crate("use crate::api::tonic_status;", "tonic"));
    assert!(!names_crate(
        &code_outside_tests("// tonic::Status is mapped in api"),
        "tonic"
    ));
}

/// Every file's code outside its tests, in the server and the workspace's crates, stays a room a
/// reader can see whole: at most 500 lines (comments and blank lines count; test modules and
/// test-only helpers do not).
#[test]
fn no_file_holds_more_than_500_lines_outside_its_tests() {
    const MOST_LINES: usize = 500;
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&workspace.join("src"), &mut files);
    for entry in std::fs::read_dir(workspace.join("crates")).expect("read crates") {
        rust_files(&entry.expect("crate folder").path().join("src"), &mut files);
    }
    let too_long: Vec<(String, usize)> = files
        .iter()
        .filter(|file| !file.ends_with("tests.rs"))
        .map(|file| {
            let source = std::fs::read_to_string(file).expect("read source");
            let lines = code_outside_tests(&source).lines().count();
            let name = file.strip_prefix(&workspace).unwrap().display().to_string();
            (name, lines)
        })
        .filter(|(_, lines)| *lines > MOST_LINES)
        .collect();
    assert!(
        too_long.is_empty(),
        "files over {MOST_LINES} lines outside their tests: {too_long:?}"
    );
}
