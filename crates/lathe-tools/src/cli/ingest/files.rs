//! What `lathe ingest` reads: the documents of the files and folders given (a text file of a kind
//! `kinds` names, one document each, also gzipped; `.jsonl` files, one document a line), each
//! with the file's `path`, `dir` and `ext` in its metadata, and the files it leaves out, by why.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::kinds::FileKind;
use crate::proto;

/// One line of a .jsonl file (the layout of the eval datasets' docs.jsonl).
#[derive(Deserialize)]
struct JsonDocument {
    #[serde(alias = "doc_id")]
    id: String,
    #[serde(default)]
    title: String,
    text: String,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    sections: Vec<JsonSection>,
}

#[derive(Deserialize)]
struct JsonSection {
    start: u64,
    end: u64,
    #[serde(default)]
    title: String,
}

pub(super) fn format_from_name(name: &str) -> anyhow::Result<proto::DocumentFormat> {
    Ok(match name {
        "plain" | "text" | "txt" => proto::DocumentFormat::Plain,
        "markdown" | "md" => proto::DocumentFormat::Markdown,
        "html" => proto::DocumentFormat::Html,
        other => anyhow::bail!("unknown format `{other}`: expected plain, markdown or html"),
    })
}

/// Parses a .jsonl file: one document per non-blank line. An error names the line (1-based) and
/// what is wrong with it; nothing is returned unless every line parses.
pub fn documents_from_jsonl(
    text: &str,
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let mut documents = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_number = number + 1;
        let document: JsonDocument = serde_json::from_str(line).with_context(|| {
            match lone_surrogate_escape(line) {
                // serde_json's own words for it ("unexpected end of hex escape") name no surrogate.
                Some((column, escape)) => format!(
                    "line {line_number}: not a document: lone UTF-16 surrogate escape `{escape}` at column {column} (a JSON string must hold Unicode scalar values: a high surrogate \\ud800-\\udbff must be followed by a low one \\udc00-\\udfff)"
                ),
                None => format!("line {line_number}: not a document"),
            }
        })?;
        let format = match &document.format {
            Some(name) => format_from_name(name).with_context(|| format!("line {line_number}"))?,
            None => default_format,
        };
        documents.push(proto::Document {
            id: document.id,
            title: document.title,
            text: document.text,
            format: format as i32,
            metadata: document.metadata,
            sections: document
                .sections
                .into_iter()
                .map(|s| proto::SectionBoundary {
                    start: s.start,
                    end: s.end,
                    title: s.title,
                })
                .collect(),
        });
    }
    Ok(documents)
}

/// The first `\uXXXX` escape in `line` that is a UTF-16 surrogate without its partner, with its
/// 1-based byte column.
fn lone_surrogate_escape(line: &str) -> Option<(usize, String)> {
    let bytes = line.as_bytes();
    let code_unit_at = |at: usize| -> Option<u16> {
        let digits = bytes.get(at + 2..at + 6)?;
        if bytes.get(at + 1) != Some(&b'u') {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        let Some(unit) = code_unit_at(at) else {
            // Any other escape (`\\`, `\"`, `\n`, ...) is two bytes long.
            at += 2;
            continue;
        };
        let escape = || line[at..at + 6].to_string();
        match unit {
            0xD800..=0xDBFF => match code_unit_at(at + 6) {
                Some(0xDC00..=0xDFFF) => at += 12,
                _ => return Some((at + 1, escape())),
            },
            0xDC00..=0xDFFF => return Some((at + 1, escape())),
            _ => at += 6,
        }
    }
    None
}

/// Most bytes a `.gz` file may hold once decompressed (a larger one is skipped, so a small
/// file cannot fill the memory).
const MOST_DECOMPRESSED_BYTES: u64 = 256 << 20;

/// A file read: its text, and the extension that decides its kind (after `.gz`, the one inside).
struct FileText {
    text: String,
    extension: String,
    /// The file's name without its extensions (`notes` of `notes.md.gz`): the document's title.
    stem: String,
}

/// Why a file was left out.
type SkipReason = String;

/// The lower-case extension of `name` (without the dot), if it has one.
fn extension_of(name: &str) -> Option<String> {
    let (stem, extension) = name.rsplit_once('.')?;
    (!stem.is_empty() && !extension.is_empty()).then(|| extension.to_ascii_lowercase())
}

/// Reads `path` as text, through gzip for `.gz`; `Err` says why it is skipped.
fn read_text_file(path: &Path) -> Result<(FileText, FileKind), SkipReason> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(mut extension) = extension_of(&name) else {
        return Err("no extension".to_string());
    };
    let mut stem = name[..name.len() - extension.len() - 1].to_string();
    let gzipped = extension == "gz";
    if gzipped {
        extension = extension_of(&stem).ok_or("a .gz without an inner extension")?;
        stem.truncate(stem.len() - extension.len() - 1);
    }
    let kind = FileKind::of_extension(&extension)
        .ok_or_else(|| format!("extension .{extension} is not read"))?;
    let bytes = if gzipped {
        gunzip(path)?
    } else {
        std::fs::read(path).map_err(|error| format!("unreadable ({})", error.kind()))?
    };
    let text = String::from_utf8(bytes).map_err(|_| "binary (not UTF-8 text)".to_string())?;
    if text.contains('\0') {
        return Err("binary (holds NUL bytes)".to_string());
    }
    Ok((
        FileText {
            text,
            extension,
            stem,
        },
        kind,
    ))
}

/// The decompressed bytes of the gzip file `path` (every member of it).
fn gunzip(path: &Path) -> Result<Vec<u8>, SkipReason> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).map_err(|error| format!("unreadable ({})", error.kind()))?;
    let mut bytes = Vec::new();
    flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file))
        .take(MOST_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| "not a readable gzip file".to_string())?;
    if bytes.len() as u64 > MOST_DECOMPRESSED_BYTES {
        return Err(format!(
            "over {} MiB once decompressed",
            MOST_DECOMPRESSED_BYTES >> 20
        ));
    }
    Ok(bytes)
}

/// The metadata every document of a file carries, so a query can narrow to some files:
/// `path` (relative to the folder ingested, `/`-separated), `dir` (its folder, `.` at the top),
/// `ext` (the extension that decided its kind, without the dot) and, for tables and code,
/// `strategy` (the chunk strategy that suits it).
fn file_metadata(relative: &Path, extension: &str, kind: FileKind) -> HashMap<String, String> {
    let slashed = |path: &Path| {
        let parts: Vec<String> = path
            .components()
            .map(|part| part.as_os_str().to_string_lossy().into_owned())
            .collect();
        parts.join("/")
    };
    let dir = match relative.parent().map(slashed) {
        Some(dir) if !dir.is_empty() => dir,
        _ => ".".to_string(),
    };
    let mut metadata = HashMap::from([
        ("path".to_string(), slashed(relative)),
        ("dir".to_string(), dir),
        ("ext".to_string(), extension.to_string()),
    ]);
    if let Some(strategy) = kind.strategy_hint() {
        metadata.insert("strategy".to_string(), strategy.to_string());
    }
    metadata
}

/// The documents of one file under `root` (one, or one a line of a JSONL file); `Ok(Err(_))`
/// when the file is skipped, `Err` for a JSONL file that does not parse.
fn documents_from_file(
    path: &Path,
    root: &Path,
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Result<Vec<proto::Document>, SkipReason>> {
    let (file, kind) = match read_text_file(path) {
        Ok(read) => read,
        Err(reason) => return Ok(Err(reason)),
    };
    if kind == FileKind::Jsonl {
        // Records, not files: each line's document keeps the id and metadata it was given, so
        // that what `lathe export` wrote comes back as it was.
        let documents = documents_from_jsonl(&file.text, default_format)
            .with_context(|| format!("{}: not a JSONL document file", path.display()))?;
        return Ok(Ok(documents));
    }
    let relative = path.strip_prefix(root).unwrap_or(path);
    let metadata = file_metadata(relative, &file.extension, kind);
    Ok(Ok(vec![proto::Document {
        id: relative.to_string_lossy().into_owned(),
        title: file.stem,
        text: file.text,
        format: kind.format(default_format) as i32,
        metadata,
        sections: Vec::new(),
    }]))
}

/// What `lathe ingest` found under the paths it was given.
#[derive(Default)]
pub(super) struct FoundDocuments {
    pub(super) documents: Vec<proto::Document>,
    /// The files left out, by why.
    pub(super) skipped: BTreeMap<SkipReason, Vec<PathBuf>>,
}

impl FoundDocuments {
    fn skip(&mut self, reason: SkipReason, path: PathBuf) {
        self.skipped.entry(reason).or_default().push(path);
    }

    /// Files and folders left out.
    pub(super) fn skipped_count(&self) -> usize {
        self.skipped.values().map(Vec::len).sum()
    }

    /// `skipped 3 files:` and a line per reason, most files first, naming the first few.
    pub(super) fn skipped_summary(&self) -> Vec<String> {
        const NAMED: usize = 3;
        if self.skipped.is_empty() {
            return Vec::new();
        }
        let mut reasons: Vec<_> = self.skipped.iter().collect();
        reasons.sort_by_key(|(_, paths)| std::cmp::Reverse(paths.len()));
        let mut lines = vec![format!("skipped {} files:", self.skipped_count())];
        for (reason, paths) in reasons {
            let named: Vec<String> = paths
                .iter()
                .take(NAMED)
                .map(|path| path.display().to_string())
                .collect();
            let more = match paths.len().saturating_sub(NAMED) {
                0 => String::new(),
                more => format!(" and {more} more"),
            };
            lines.push(format!(
                "  {} {reason}: {}{more}",
                paths.len(),
                named.join(", ")
            ));
        }
        lines
    }

    /// Adds the documents of `file` under `root`, or notes why it is skipped.
    fn add_file(
        &mut self,
        file: &Path,
        root: &Path,
        default_format: proto::DocumentFormat,
    ) -> anyhow::Result<()> {
        match documents_from_file(file, root, default_format)? {
            Ok(documents) => self.documents.extend(documents),
            Err(reason) => self.skip(reason, file.to_path_buf()),
        }
        Ok(())
    }
}

/// Whether a walked entry below the root is hidden (`.git`, `.env`): not read, nor walked into.
fn is_hidden(entry: &walkdir::DirEntry) -> bool {
    entry.depth() > 0 && entry.file_name().to_string_lossy().starts_with('.')
}

/// The documents of every file given, and of every file under every folder given (in path
/// order), and the files left out: of an extension not read, binary, unreadable, or hidden.
pub(super) fn documents_from_paths(
    paths: &[PathBuf],
    default_format: proto::DocumentFormat,
) -> anyhow::Result<FoundDocuments> {
    let mut found = FoundDocuments::default();
    for root in paths {
        if root.is_file() {
            let parent = root.parent().unwrap_or(Path::new(""));
            found.add_file(root, parent, default_format)?;
            continue;
        }
        anyhow::ensure!(root.exists(), "{}: no such file or folder", root.display());
        let mut files = Vec::new();
        let mut walk = walkdir::WalkDir::new(root).into_iter();
        while let Some(entry) = walk.next() {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    let path = error.path().map(Path::to_path_buf).unwrap_or_default();
                    found.skip("unreadable".to_string(), path);
                    continue;
                }
            };
            if is_hidden(&entry) {
                if entry.file_type().is_dir() {
                    walk.skip_current_dir();
                }
                found.skip(
                    "hidden (a name starting with a dot)".to_string(),
                    entry.into_path(),
                );
            } else if entry.file_type().is_file() {
                files.push(entry.into_path());
            }
        }
        files.sort();
        for file in files {
            found.add_file(&file, root, default_format)?;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_reads_documents_and_skips_blank_lines() {
        let text = "{\"id\":\"a\",\"text\":\"alpha\"}\n\n{\"doc_id\":\"b\",\"text\":\"# beta\",\"format\":\"markdown\",\"metadata\":{\"k\":\"v\"}}\n";
        let documents = documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap();
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0].id, "a");
        assert_eq!(documents[0].format, proto::DocumentFormat::Plain as i32);
        assert_eq!(documents[1].id, "b");
        assert_eq!(documents[1].format, proto::DocumentFormat::Markdown as i32);
        assert_eq!(documents[1].metadata["k"], "v");
    }

    #[test]
    fn jsonl_lone_surrogate_is_an_error_naming_the_line() {
        let text = "{\"id\":\"a\",\"text\":\"ok\"}\n{\"id\":\"b\",\"text\":\"bad \\ud800 half\"}\n";
        let error = documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("line 2"), "{message}");
        assert!(message.contains("surrogate"), "{message}");
    }

    #[test]
    fn lone_surrogates_are_found_and_pairs_and_escaped_backslashes_are_not() {
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"x \ud800 y"}"#),
            Some((9, r"\ud800".to_string()))
        );
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\udc00"}"#),
            Some((7, r"\udc00".to_string()))
        );
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\ud83d\ude00 \u00e9"}"#),
            None
        );
        assert_eq!(lone_surrogate_escape(r#"{"a":"\\ud800"}"#), None);
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\ud800\u0041"}"#),
            Some((7, r"\ud800".to_string()))
        );
    }

    #[test]
    fn extensions_are_the_last_dotted_part_of_a_name_in_lower_case() {
        assert_eq!(extension_of("notes.MD").as_deref(), Some("md"));
        assert_eq!(extension_of("a.tar.gz").as_deref(), Some("gz"));
        assert_eq!(extension_of("LICENSE"), None);
        assert_eq!(extension_of(".bashrc"), None);
        assert_eq!(extension_of("trailing."), None);
    }

    #[test]
    fn file_metadata_names_the_path_its_folder_and_extension() {
        let nested = file_metadata(Path::new("src/cli/main.rs"), "rs", FileKind::Code);
        assert_eq!(nested["path"], "src/cli/main.rs");
        assert_eq!(nested["dir"], "src/cli");
        assert_eq!(nested["ext"], "rs");
        assert_eq!(nested["strategy"], "code");
        let top = file_metadata(Path::new("README.md"), "md", FileKind::Markdown);
        assert_eq!(top["dir"], ".");
        assert!(!top.contains_key("strategy"));
    }

    #[test]
    fn folders_give_their_documents_and_say_what_they_skip() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("docs/.git")).unwrap();
        std::fs::write(root.join("docs/guide.md"), "# Guide\n\nText.").unwrap();
        std::fs::write(root.join("docs/.git/HEAD"), "ref").unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"a,b\n1,2\n").unwrap();
        std::fs::write(root.join("table.tsv.gz"), gz.finish().unwrap()).unwrap();
        std::fs::write(root.join("bundle.tar.gz"), b"not even gzip").unwrap();
        std::fs::write(root.join("broken.md.gz"), b"not gzip at all").unwrap();
        std::fs::write(root.join("Makefile"), "all:").unwrap();
        let found =
            documents_from_paths(&[root.to_path_buf()], proto::DocumentFormat::Plain).unwrap();
        let ids: Vec<&str> = found.documents.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["docs/guide.md", "table.tsv.gz"]);
        let table = &found.documents[1];
        assert_eq!(table.text, "a,b\n1,2\n");
        assert_eq!(table.title, "table");
        assert_eq!(table.format, proto::DocumentFormat::Plain as i32);
        assert_eq!(table.metadata["ext"], "tsv");
        assert_eq!(table.metadata["strategy"], "csv");
        assert_eq!(found.skipped_count(), 4);
        let summary = found.skipped_summary();
        assert_eq!(summary[0], "skipped 4 files:");
        let named = |reason: &str| summary.iter().any(|line| line.contains(reason));
        assert!(named("1 no extension: "), "{summary:?}");
        assert!(named("1 extension .tar is not read: "), "{summary:?}");
        assert!(named("1 not a readable gzip file: "), "{summary:?}");
        assert!(
            named("1 hidden (a name starting with a dot): "),
            "{summary:?}"
        );
    }

    #[test]
    fn the_summary_names_the_first_few_files_of_a_reason_and_counts_the_rest() {
        let mut found = FoundDocuments::default();
        for name in ["a", "b", "c", "d", "e"] {
            found.skip("no extension".into(), PathBuf::from(name));
        }
        found.skip("binary (not UTF-8 text)".into(), PathBuf::from("x.txt"));
        assert_eq!(
            found.skipped_summary(),
            [
                "skipped 6 files:",
                "  5 no extension: a, b, c and 2 more",
                "  1 binary (not UTF-8 text): x.txt",
            ]
        );
    }

    #[test]
    fn jsonl_unknown_format_names_the_line_and_the_choices() {
        let text = "{\"id\":\"a\",\"text\":\"x\",\"format\":\"pdf\"}";
        let message = format!(
            "{:#}",
            documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap_err()
        );
        assert!(message.contains("line 1"), "{message}");
        assert!(message.contains("plain, markdown or html"), "{message}");
    }
}
