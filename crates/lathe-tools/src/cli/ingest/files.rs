//! What `lathe ingest` reads: the documents of the files and folders given (Markdown, HTML and
//! text files, one document each; `.jsonl` files, one document a line).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

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

fn documents_from_file(
    path: &Path,
    root: &Path,
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let id = path
        .strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned();
    let read =
        || std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    let single = |format: proto::DocumentFormat| -> anyhow::Result<Vec<proto::Document>> {
        let title = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(vec![proto::Document {
            id: id.clone(),
            title,
            text: read()?,
            format: format as i32,
            ..Default::default()
        }])
    };
    match extension.as_str() {
        "md" | "markdown" => single(proto::DocumentFormat::Markdown),
        "html" | "htm" => single(proto::DocumentFormat::Html),
        "txt" => single(default_format),
        "jsonl" => documents_from_jsonl(&read()?, default_format)
            .with_context(|| format!("{}: not a JSONL document file", path.display())),
        _ => Ok(Vec::new()),
    }
}

/// The documents of every file given, and of every file under every folder given (in path order).
pub(super) fn documents_from_paths(
    paths: &[PathBuf],
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let mut documents = Vec::new();
    for root in paths {
        if root.is_file() {
            let parent = root.parent().unwrap_or(Path::new(""));
            documents.extend(documents_from_file(root, parent, default_format)?);
            continue;
        }
        let mut files: Vec<PathBuf> = walkdir::WalkDir::new(root)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_file())
            .map(|entry| entry.into_path())
            .collect();
        files.sort();
        for file in files {
            documents.extend(documents_from_file(&file, root, default_format)?);
        }
    }
    Ok(documents)
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
