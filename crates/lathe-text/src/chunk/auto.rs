//! `Auto` routing, plus the `Csv` and `Code` strategies it routes to.
//!
//! Detection reads at most the first [`SAMPLE_LINES`] lines: CSV/TSV when a delimiter splits
//! every sampled row into the same number of fields; Markdown/HTML on fences, headings, tables,
//! lists or block tags; source code when most lines end or start like code; prose otherwise.

use std::ops::Range;

use super::budget::Cutter;
use super::structure::{self, BlockChunker};
use super::{sentence, ChunkSpan, Strategy};

const SAMPLE_LINES: usize = 40;

/// What a section looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Delimited(u8),
    Markdown,
    Code,
    Prose,
}

pub(super) fn chunk(cutter: &Cutter, overlap: usize, out: &mut Vec<ChunkSpan>) {
    match detect(cutter.text) {
        Kind::Delimited(_) => csv_rows(cutter, out),
        Kind::Markdown => structure::chunk(cutter, out),
        Kind::Code => chunk_code(cutter, out),
        Kind::Prose => sentence::chunk(cutter, overlap, Strategy::Sentence, out),
    }
}

pub(super) fn detect(text: &str) -> Kind {
    if let Some(delimiter) = csv_delimiter(text) {
        return Kind::Delimited(delimiter);
    }
    let mut lines = 0usize;
    let mut code_lines = 0usize;
    let mut markdown_marks = 0usize;
    let mut fenced = false;
    for line in text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .take(SAMPLE_LINES)
    {
        lines += 1;
        let trimmed = line.trim();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = true;
        }
        if looks_like_code(line) {
            code_lines += 1;
        } else if looks_like_markdown(trimmed) {
            markdown_marks += 1;
        }
    }
    if lines == 0 {
        return Kind::Prose;
    }
    if fenced {
        return Kind::Markdown;
    }
    if lines >= 3 && code_lines * 5 >= lines * 2 {
        return Kind::Code;
    }
    if markdown_marks >= 2 || (markdown_marks == 1 && lines <= 3) {
        return Kind::Markdown;
    }
    Kind::Prose
}

fn looks_like_code(line: &str) -> bool {
    const ENDINGS: &[char] = &['{', '}', ';', ')', '(', ':', ']', '[', ','];
    const STARTS: &[&str] = &[
        "fn ",
        "pub ",
        "def ",
        "class ",
        "import ",
        "from ",
        "use ",
        "#include",
        "function ",
        "const ",
        "let ",
        "var ",
        "return",
        "struct ",
        "impl ",
        "async ",
        "@",
        "//",
        "#[",
        "#!",
        "package ",
        "func ",
        "elif ",
        "else",
        "except",
        "try:",
        "mod ",
        "enum ",
        "trait ",
        "self.",
    ];
    let trimmed = line.trim();
    let ends_like_code = trimmed.ends_with(ENDINGS) && !trimmed.ends_with("::") && {
        // Prose rarely ends a line with these, except ':' and ',' which need a code-ish body.
        !trimmed.ends_with([':', ',']) || trimmed.contains(['(', '=', '['])
    };
    ends_like_code || STARTS.iter().any(|start| trimmed.starts_with(start))
}

fn looks_like_markdown(trimmed: &str) -> bool {
    let heading = trimmed.starts_with('#')
        && trimmed.trim_start_matches('#').starts_with(' ')
        && trimmed.len() - trimmed.trim_start_matches('#').len() <= 6;
    let table = trimmed.starts_with('|') && trimmed[1..].contains('|');
    let list = trimmed.starts_with("- ") || trimmed.starts_with("* ") || trimmed.starts_with("+ ");
    let ordered = trimmed.split_once(". ").is_some_and(|(number, _)| {
        !number.is_empty() && number.len() <= 3 && number.bytes().all(|b| b.is_ascii_digit())
    });
    let quote = trimmed.starts_with("> ");
    let html = trimmed.starts_with('<')
        && [
            "<p", "<div", "<h1", "<h2", "<h3", "<h4", "<h5", "<h6", "<table", "<ul", "<ol", "<li",
            "<pre", "<section", "<article", "<tr",
        ]
        .iter()
        .any(|tag| trimmed.starts_with(tag));
    let underline = trimmed.len() >= 3
        && (trimmed.bytes().all(|b| b == b'=') || trimmed.bytes().all(|b| b == b'-'));
    heading || table || list || ordered || quote || html || underline
}

/// Rows of a delimited text: lines, except that a newline inside double quotes stays in its row.
fn rows(text: &str, mut emit: impl FnMut(usize, usize)) {
    let mut in_quotes = false;
    let mut row_start = 0;
    for (index, byte) in text.bytes().enumerate() {
        match byte {
            b'"' => in_quotes = !in_quotes,
            b'\n' if !in_quotes => {
                emit(row_start, index);
                row_start = index + 1;
            }
            _ => {}
        }
    }
    if row_start < text.len() {
        emit(row_start, text.len());
    }
}

/// Fields minus one of `row` for `delimiter`, outside double quotes.
fn delimiter_count(row: &[u8], delimiter: u8) -> usize {
    let mut in_quotes = false;
    let mut count = 0;
    for &byte in row {
        if byte == b'"' {
            in_quotes = !in_quotes;
        } else if byte == delimiter && !in_quotes {
            count += 1;
        }
    }
    count
}

/// The delimiter of a CSV/TSV text: every sampled row (at least 3) has the same non-zero number of
/// them, and few rows end like sentences.
fn csv_delimiter(text: &str) -> Option<u8> {
    let mut sample: [(usize, usize); SAMPLE_LINES] = [(0, 0); SAMPLE_LINES];
    let mut sampled = 0;
    rows(text, |start, end| {
        if sampled < SAMPLE_LINES && !text[start..end].trim().is_empty() {
            sample[sampled] = (start, end);
            sampled += 1;
        }
    });
    if sampled < 3 {
        return None;
    }
    let sample = &sample[..sampled];
    let sentence_like = sample
        .iter()
        .filter(|&&(start, end)| text[start..end].trim_end().ends_with(['.', '!', '?', '。']))
        .count();
    if sentence_like * 5 > sampled {
        return None;
    }
    [b'\t', b',', b';'].into_iter().find(|&delimiter| {
        let first = delimiter_count(&text.as_bytes()[sample[0].0..sample[0].1], delimiter);
        first > 0
            && sample.iter().all(|&(start, end)| {
                delimiter_count(&text.as_bytes()[start..end], delimiter) == first
            })
    })
}

/// `Csv`: returns false (emitting nothing) when the text is not delimited.
pub(super) fn chunk_csv(cutter: &Cutter, out: &mut Vec<ChunkSpan>) -> bool {
    if csv_delimiter(cutter.text).is_none() {
        return false;
    }
    csv_rows(cutter, out);
    true
}

/// Groups of whole rows; the first row is the header of every later chunk.
fn csv_rows(cutter: &Cutter, out: &mut Vec<ChunkSpan>) {
    let text = cutter.text;
    let mut first_row: Option<(usize, usize)> = None;
    rows(text, |start, end| {
        if first_row.is_none() && !text[start..end].trim().is_empty() {
            first_row = Some((start, end));
        }
    });
    let Some((_, header_end)) = first_row else {
        return;
    };
    let mut chunker = BlockChunker {
        cutter,
        out,
        strategy: Strategy::Csv,
        current: None,
        heading: None,
    };
    let mut row_ranges: Vec<Range<u32>> = Vec::new();
    rows(text, |start, end| row_ranges.push(start as u32..end as u32));
    chunker.split_rows_with_header_rows(0, header_end, &row_ranges);
}

/// `Code`: top-level blocks (a line at column 0 and bracket depth 0 starts one, unless it follows
/// a comment, decorator or attribute line that belongs to it), packed up to the limit; a block
/// over the limit is cut on its lines.
pub(super) fn chunk_code(cutter: &Cutter, out: &mut Vec<ChunkSpan>) {
    let text = cutter.text;
    let mut chunker = BlockChunker {
        cutter,
        out,
        strategy: Strategy::Code,
        current: None,
        heading: None,
    };
    let mut block_start = 0usize;
    let mut depth = 0i64;
    let mut previous_attaches = false;
    let mut line_start = 0usize;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |offset| line_start + offset + 1);
        let line = &text[line_start..line_end];
        let trimmed = line.trim();
        if !trimmed.is_empty() {
            let at_column_zero = !line.starts_with(char::is_whitespace);
            let closes = trimmed.starts_with(['}', ')', ']']);
            if at_column_zero
                && depth <= 0
                && !closes
                && !previous_attaches
                && line_start > block_start
            {
                chunker.add_lines_block(block_start, line_start);
                block_start = line_start;
            }
            previous_attaches = at_column_zero
                && (trimmed.starts_with('@')
                    || trimmed.starts_with("#[")
                    || trimmed.starts_with("//")
                    || trimmed.starts_with("/*")
                    || trimmed.starts_with('#'));
            for byte in trimmed.bytes() {
                match byte {
                    b'{' | b'(' | b'[' => depth += 1,
                    b'}' | b')' | b']' => depth -= 1,
                    _ => {}
                }
            }
            depth = depth.max(0);
        }
        line_start = line_end;
    }
    chunker.add_lines_block(block_start, text.len());
    chunker.flush();
}
