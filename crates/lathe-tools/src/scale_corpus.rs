//! The bench's corpus: source documents from a folder of `.txt` files or a `docs.jsonl`, their
//! near-duplicate copies (the corpus repeats until a collection holds N sections), and the
//! distinct query texts drawn from it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::proto;

/// One document of the source corpus.
#[derive(Clone, Debug)]
pub struct SourceDocument {
    pub name: String,
    pub text: String,
}

pub fn load_corpus(path: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    let mut documents = if path.is_dir() {
        load_text_folder(path)?
    } else {
        load_jsonl(path)?
    };
    documents.retain(|document| !document.text.trim().is_empty());
    if documents.is_empty() {
        anyhow::bail!("no documents in {}", path.display());
    }
    Ok(documents)
}

fn load_text_folder(folder: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("listing {}", folder.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(SourceDocument {
                name: path
                    .file_stem()
                    .map(|stem| stem.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            })
        })
        .collect()
}

fn load_jsonl(path: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    #[derive(serde::Deserialize)]
    struct Line {
        doc_id: String,
        text: String,
    }
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut documents = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}", path.display(), number + 1))?;
        documents.push(SourceDocument {
            name: parsed.doc_id,
            text: parsed.text,
        });
    }
    Ok(documents)
}

/// A cheap deterministic hash of (copy, word position): which words a copy drops.
fn drops_word(copy: u64, position: u64) -> bool {
    let mut x =
        copy.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x.is_multiple_of(8)
}

/// Copy `copy` of `text`: the text itself for copy 0; else "Copy c." and the text with one word
/// in eight dropped (lines and blank lines kept, so sectioning sees the same structure).
fn variant_text(text: &str, copy: u64) -> String {
    if copy == 0 {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&format!("Copy {copy}.\n\n"));
    let mut position = 0u64;
    for line in text.split_inclusive('\n') {
        let (body, ending) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let mut kept: Vec<&str> = Vec::new();
        for word in body.split(' ') {
            position += 1;
            if word.is_empty() || !drops_word(copy, position) {
                kept.push(word);
            }
        }
        out.push_str(&kept.join(" "));
        out.push_str(ending);
    }
    out
}

/// Distinct query texts from the corpus: the first eight words of lines with at least six words
/// of letters, spread evenly over all such lines.
pub fn corpus_queries(documents: &[SourceDocument], wanted: usize) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut candidates = Vec::new();
    for document in documents {
        for line in document.text.lines() {
            let words: Vec<&str> = line
                .split_whitespace()
                .filter(|word| {
                    word.chars()
                        .all(|c| c.is_alphabetic() || c == ',' || c == '.')
                })
                .take(8)
                .collect();
            if words.len() < 6 {
                continue;
            }
            let query = words.join(" ").to_lowercase();
            if seen.insert(query.clone()) {
                candidates.push(query);
            }
        }
    }
    if candidates.len() <= wanted {
        return candidates;
    }
    (0..wanted)
        .map(|i| candidates[i * candidates.len() / wanted].clone())
        .collect()
}

/// Document `i` of the endless corpus: copy `i / len` of source document `i % len`.
pub fn corpus_document(corpus: &[SourceDocument], i: u64) -> proto::Document {
    let source = &corpus[(i % corpus.len() as u64) as usize];
    let copy = i / corpus.len() as u64;
    proto::Document {
        id: format!("c{copy}-{}", source.name),
        title: source.name.clone(),
        text: variant_text(&source.text, copy),
        format: proto::DocumentFormat::Plain as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_differ_from_the_source_and_from_each_other_but_keep_its_lines() {
        let text = "one two three four five six seven eight nine ten\n\nsecond paragraph here\n";
        assert_eq!(variant_text(text, 0), text);
        let first = variant_text(text, 1);
        let second = variant_text(text, 2);
        assert!(first.starts_with("Copy 1.\n\n"), "{first}");
        assert_ne!(first, second);
        assert_eq!(first.lines().count(), text.lines().count() + 2);
        // Some words of a long text are dropped, most kept.
        let long: String = (0..800).map(|i| format!("w{i} ")).collect();
        let kept = variant_text(&long, 3).split_whitespace().count() - 2;
        assert!((600..800).contains(&kept), "{kept} of 800 words kept");
    }

    #[test]
    fn corpus_queries_are_distinct_word_lines_spread_over_the_corpus() {
        let documents = vec![SourceDocument {
            name: "a".into(),
            text: "Short line.\nthe quick brown fox jumps over the lazy dog again\nthe quick brown fox jumps over the lazy dog again\nanother line with enough plain words in it\n====\n".into(),
        }];
        let queries = corpus_queries(&documents, 10);
        assert_eq!(
            queries,
            [
                "the quick brown fox jumps over the lazy",
                "another line with enough plain words in it"
            ]
        );
        assert_eq!(corpus_queries(&documents, 1).len(), 1);
    }
}
