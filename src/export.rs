//! `lathe export FILE`: the live documents of a snapshot file as JSONL, one document a line, in
//! the shape `lathe ingest` reads (`{"id", "title", "text", "format", "metadata", "sections"}`).
//! It seeds a replicated deployment from a snapshot: `lathe export` offline, then `lathe ingest`
//! through any replica, so the documents go through the log to every replica (which re-embeds
//! them), where `RestoreSnapshot` is refused.
//!
//! The snapshot is extracted and checked whole as a restore does (`index::extract_snapshot`: a
//! damaged or cut-short file is refused naming its file, before anything is written), into a
//! temporary folder removed at the end, and its index opened in this process (read-only in
//! effect; no dense index). Each document's text is rebuilt from its sections and the whitespace
//! stored between them, and its sections are given as they lie (code-point ranges, the heading
//! path as the title), so an ingest of the line cuts the same sections at the same offsets.
//! Whitespace Lathe does not store (before the first section, a gap over `MAX_GAP_BYTES`) is
//! filled with as many bytes and code points of whitespace, so offsets hold; of the whitespace
//! after the last section only the length is stored, written as line breaks. The summary on
//! stderr counts the documents where either happened.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

use crate::error::LatheError;
use crate::index::{extract_snapshot, CollectionIndex, StoredDocument};

/// The command line of `lathe export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The snapshot file (`lathe snapshot download`, or one in a server's `data_dir/snapshots/`).
    pub file: PathBuf,
    /// Where the JSONL goes: `-` (stdout, the default) or a file, written as `PATH.partial` and
    /// renamed when complete, so a failed export leaves no file.
    #[arg(long, default_value = "-")]
    pub out: String,
    /// Folder the snapshot is extracted into while it is read (about the snapshot's size, removed
    /// at the end); default: the system's temporary folder.
    #[arg(long)]
    pub temp_dir: Option<PathBuf>,
}

/// Heading titles joined into a section's one title (the separator chunk contexts use).
const HEADING_JOINER: &str = " > ";

/// One line of the output: what `lathe ingest` reads from a .jsonl file.
#[derive(Serialize)]
struct JsonDocument<'a> {
    id: &'a str,
    title: &'a str,
    text: &'a str,
    format: &'static str,
    metadata: &'a BTreeMap<String, String>,
    sections: Vec<JsonSection>,
}

/// A `SectionBoundary`: a code-point range of the text and its title.
#[derive(Serialize, Debug, PartialEq, Eq)]
struct JsonSection {
    start: u64,
    end: u64,
    title: String,
}

/// What an export wrote.
#[derive(Debug, Default, PartialEq, Eq)]
struct Summary {
    documents: u64,
    sections: u64,
    text_bytes: u64,
    /// Documents with whitespace Lathe does not store before or between sections filled in.
    filled_inside: u64,
    /// Documents ending in whitespace of which only the length is stored.
    trailing_assumed: u64,
}

/// Runs `lathe export`: the JSONL on stdout or in `--out`, the summary on stderr.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let root = args.temp_dir.clone().unwrap_or_else(std::env::temp_dir);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let staging = Staging(root.join(format!("lathe-export-{}-{nanos}", std::process::id())));
    let label = args.file.display().to_string();
    let input = File::open(&args.file).with_context(|| format!("opening {label}"))?;
    let (manifest, index_dir) =
        extract_snapshot(BufReader::new(input), &staging.0, &label).map_err(refused)?;
    let index = CollectionIndex::open_or_create_with(
        &index_dir,
        16_000_000,
        Duration::from_secs(3600),
        None,
    )
    .with_context(|| format!("opening the index of {label}"))?;
    let written = match args.out.as_str() {
        "-" => {
            let mut out = BufWriter::new(std::io::stdout().lock());
            write_documents(&index, &mut out).and_then(|summary| {
                out.flush().context("writing to stdout")?;
                Ok(summary)
            })
        }
        path => write_file(Path::new(path), |out| write_documents(&index, out)),
    };
    index.shutdown();
    let summary = written?;
    eprintln!(
        "exported {} documents ({} sections, {} bytes of text) of collection `{}` at generation \
         {}{}",
        summary.documents,
        summary.sections,
        summary.text_bytes,
        manifest.collection,
        manifest.generation,
        summary.caveats(),
    );
    Ok(())
}

impl Summary {
    /// What the texts may not hold exactly, when anything.
    fn caveats(&self) -> String {
        let mut caveats = String::new();
        if self.filled_inside > 0 {
            caveats.push_str(&format!(
                "; in {} documents whitespace Lathe does not store (before the first section, a \
                 gap over 64 bytes) was filled with as many bytes and code points: offsets hold, \
                 those bytes may differ",
                self.filled_inside
            ));
        }
        if self.trailing_assumed > 0 {
            caveats.push_str(&format!(
                "; {} documents end in whitespace of which only the length is stored, written as \
                 line breaks",
                self.trailing_assumed
            ));
        }
        caveats
    }
}

/// A refusal to read the snapshot, in an exporter's words.
fn refused(error: LatheError) -> anyhow::Error {
    match error {
        LatheError::SnapshotDamaged {
            snapshot,
            file,
            cause,
        } => anyhow::anyhow!(
            "snapshot `{snapshot}` cannot be exported: `{file}`: {cause}; nothing was written"
        ),
        other => other.into(),
    }
}

/// Writes through `write` into `PATH.partial`, renamed to `path` once complete; removed on error.
fn write_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> anyhow::Result<Summary>,
) -> anyhow::Result<Summary> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut out = BufWriter::new(file);
    let written = write(&mut out).and_then(|summary| {
        let file = out.into_inner().map_err(|error| error.into_error())?;
        file.sync_all()?;
        std::fs::rename(&partial, path)?;
        Ok(summary)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// Writes every live document of `index` as one JSON line.
fn write_documents(index: &CollectionIndex, out: &mut impl Write) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut line = Vec::new();
    let mut failed: Option<anyhow::Error> = None;
    let visited = index.for_each_stored_document(|document| {
        let rebuilt = rebuild(&document);
        line.clear();
        let written = serde_json::to_writer(
            &mut line,
            &JsonDocument {
                id: &document.doc_id,
                title: &document.title,
                text: &rebuilt.text,
                format: "plain",
                metadata: &document.metadata,
                sections: rebuilt.sections,
            },
        )
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            line.push(b'\n');
            out.write_all(&line)?;
            Ok(())
        });
        if let Err(error) = written {
            failed = Some(error);
            return Err(LatheError::internal("the output could not be written"));
        }
        summary.documents += 1;
        summary.sections += document.sections.len() as u64;
        summary.text_bytes += rebuilt.text.len() as u64;
        summary.filled_inside += u64::from(rebuilt.filled_inside);
        summary.trailing_assumed += u64::from(rebuilt.trailing_assumed);
        Ok(())
    });
    match (visited, failed) {
        (_, Some(error)) => Err(error),
        (Err(error), None) => Err(error.into()),
        (Ok(()), None) => Ok(summary),
    }
}

/// A document's text rebuilt from its sections, and the sections as boundaries into it.
#[derive(Debug, PartialEq, Eq)]
struct Rebuilt {
    text: String,
    sections: Vec<JsonSection>,
    /// Whitespace Lathe does not store, before or between sections, was filled in.
    filled_inside: bool,
    /// The text ends in whitespace of which only the length is stored.
    trailing_assumed: bool,
}

/// Lays the sections out at their stored byte and code-point starts, with the gap each one
/// stores after it where that fills the space before the next exactly, else whitespace of the
/// same length ([`fill`]); after the last section, as many bytes as the document held, as line
/// breaks in the document's own style (`\r\n` when a stored gap has one). The boundaries are
/// counted in the text built, so they cut the stored section texts whatever the offsets say.
fn rebuild(document: &StoredDocument) -> Rebuilt {
    let mut text = String::new();
    let mut chars = 0u64;
    let mut filled_inside = false;
    let mut gap_after_previous = "";
    let mut sections = Vec::with_capacity(document.sections.len());
    for section in &document.sections {
        let gap_bytes = section.byte_start.saturating_sub(text.len() as u64);
        let gap_chars = section.char_start.saturating_sub(chars);
        if gap_bytes > 0 {
            let gap = gap_after_previous;
            if gap.len() as u64 == gap_bytes && gap.chars().count() as u64 == gap_chars {
                text.push_str(gap);
                chars += gap_chars;
            } else {
                filled_inside = true;
                chars += fill(&mut text, gap_bytes, gap_chars);
            }
        }
        let section_chars = section.text.chars().count() as u64;
        sections.push(JsonSection {
            start: chars,
            end: chars + section_chars,
            title: section.heading_path.join(HEADING_JOINER),
        });
        text.push_str(&section.text);
        chars += section_chars;
        gap_after_previous = &section.gap_after;
    }
    let trailing = document
        .text_bytes
        .map_or(0, |total| total.saturating_sub(text.len() as u64));
    let crlf = document
        .sections
        .iter()
        .any(|section| section.gap_after.contains("\r\n"));
    if crlf && trailing.is_multiple_of(2) {
        text.extend(std::iter::repeat_n("\r\n", trailing as usize / 2));
    } else {
        fill(&mut text, trailing, trailing);
    }
    Rebuilt {
        text,
        sections,
        filled_inside,
        trailing_assumed: trailing > 0,
    }
}

/// Appends whitespace of `bytes` bytes in `chars` code points (newlines, then no-break and
/// ideographic spaces, 2 and 3 bytes, for what a non-ASCII gap held) and returns the code points
/// appended; where no such whitespace exists (stored offsets that disagree) `bytes` newlines.
fn fill(text: &mut String, bytes: u64, chars: u64) -> u64 {
    if chars == 0 || bytes < chars || bytes > 3 * chars {
        text.extend(std::iter::repeat_n('\n', bytes as usize));
        return bytes;
    }
    let mut extra = bytes - chars;
    for _ in 0..chars {
        let width = extra.min(2);
        extra -= width;
        text.push(match width {
            0 => '\n',
            1 => '\u{a0}',
            _ => '\u{3000}',
        });
    }
    chars
}

/// The extraction folder, removed when the export ends however it ends.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::StoredDocumentSection;

    fn section(ordinal: u64, text: &str, gap: &str, at: (u64, u64)) -> StoredDocumentSection {
        StoredDocumentSection {
            ordinal,
            heading_path: vec!["Install".to_string(), "On Debian".to_string()],
            text: text.to_string(),
            gap_after: gap.to_string(),
            byte_start: at.0,
            char_start: at.1,
        }
    }

    fn document(sections: Vec<StoredDocumentSection>, text_bytes: u64) -> StoredDocument {
        StoredDocument {
            doc_id: "a".to_string(),
            title: String::new(),
            metadata: BTreeMap::new(),
            text_bytes: Some(text_bytes),
            sections,
        }
    }

    #[test]
    fn stored_gaps_rebuild_the_text_exactly() {
        let text = "# Intro\nhé\n\n## Next\nthere";
        let rebuilt = rebuild(&document(
            vec![
                section(0, "# Intro\nhé", "\n\n", (0, 0)),
                section(1, "## Next\nthere", "", (13, 12)),
            ],
            text.len() as u64,
        ));
        assert_eq!(rebuilt.text, text);
        assert!(!rebuilt.filled_inside && !rebuilt.trailing_assumed);
        assert_eq!(
            rebuilt.sections[1],
            JsonSection {
                start: 12,
                end: 25,
                title: "Install > On Debian".to_string()
            }
        );
    }

    #[test]
    fn whitespace_not_stored_is_filled_keeping_every_offset() {
        // Two leading bytes in one char (a no-break space), a 70-byte gap, a trailing newline.
        let rebuilt = rebuild(&document(
            vec![section(0, "a", "", (2, 1)), section(1, "b", "", (73, 72))],
            75,
        ));
        assert!(rebuilt.filled_inside && rebuilt.trailing_assumed);
        assert_eq!(rebuilt.text.len(), 75);
        assert_eq!(rebuilt.text.find('a'), Some(2));
        assert_eq!(rebuilt.text.find('b'), Some(73));
        assert_eq!(rebuilt.text.chars().position(|c| c == 'b'), Some(72));
        assert!(rebuilt.text.ends_with("b\n"));
        assert_eq!(
            (rebuilt.sections[1].start, rebuilt.sections[1].end),
            (72, 73)
        );
    }

    #[test]
    fn a_document_ends_in_the_line_breaks_its_gaps_use() {
        let sections = |gap: &str| {
            vec![
                section(0, "a", gap, (0, 0)),
                section(1, "b", "", (1 + gap.len() as u64, 1 + gap.len() as u64)),
            ]
        };
        let crlf = rebuild(&document(sections("\r\n\r\n"), 10));
        assert_eq!(crlf.text, "a\r\n\r\nb\r\n\r\n");
        assert!(crlf.trailing_assumed && !crlf.filled_inside);
        let lf = rebuild(&document(sections("\n"), 4));
        assert_eq!(lf.text, "a\nb\n");
        let odd = rebuild(&document(sections("\r\n"), 7));
        assert_eq!(odd.text, "a\r\nb\n\n\n");
    }

    #[test]
    fn fill_keeps_bytes_and_code_points() {
        for (bytes, chars) in [(1, 1), (5, 2), (6, 2), (9, 4), (4, 0), (3, 5)] {
            let mut text = String::new();
            let appended = fill(&mut text, bytes, chars);
            assert_eq!(text.len() as u64, bytes);
            assert!(text.chars().all(char::is_whitespace));
            let possible = chars > 0 && chars <= bytes && bytes <= 3 * chars;
            let want = if possible { chars } else { bytes };
            assert_eq!((appended, text.chars().count() as u64), (want, want));
        }
    }
}
