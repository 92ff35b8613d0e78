//! `Structure`: Markdown-aware chunks (pulldown-cmark block spans).
//!
//! Top-level blocks are packed greedily up to the limit; a heading always starts a new chunk and
//! becomes the `heading` context of later chunks under it. A block over the limit is cut alone:
//! fenced code, lists and HTML blocks on their lines, tables on their rows with the header and
//! delimiter rows reported as `header` of the continuation chunks (their tokens reserved), prose
//! on its sentences. No overlap: structural chunks do not repeat text.

use std::ops::Range;

use pulldown_cmark::{Event, Options, Parser, Tag};

use super::budget::Cutter;
use super::sentence;
use super::{ChunkSpan, Strategy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    Heading,
    Table,
    /// Code, lists, HTML, block quotes: cut on lines when too long.
    Lines,
    /// Paragraphs and anything pulldown-cmark leaves out (link definitions): cut on sentences.
    Prose,
}

struct Block {
    kind: BlockKind,
    start: usize,
    end: usize,
}

pub(super) fn chunk(cutter: &Cutter, out: &mut Vec<ChunkSpan>) {
    let blocks = top_level_blocks(cutter.text);
    let mut chunker = BlockChunker {
        cutter,
        out,
        strategy: Strategy::Structure,
        current: None,
        heading: None,
    };
    for block in &blocks {
        if block.kind == BlockKind::Heading {
            chunker.flush();
            chunker.heading = cutter
                .trimmed(block.start, block.end)
                .map(|(a, b)| (a as u32, b as u32));
        }
        chunker.add(block.start, block.end, block.kind);
    }
    chunker.flush();
}

/// Greedy packing of blocks, shared with the source-code chunker.
pub(super) struct BlockChunker<'c, 'a, 'o> {
    pub cutter: &'c Cutter<'a>,
    pub out: &'o mut Vec<ChunkSpan>,
    pub strategy: Strategy,
    pub current: Option<(usize, usize)>,
    pub heading: Option<(u32, u32)>,
}

impl BlockChunker<'_, '_, '_> {
    fn add(&mut self, start: usize, end: usize, kind: BlockKind) {
        let Some((start, end)) = self.cutter.trimmed(start, end) else {
            return;
        };
        if let Some((current_start, _)) = self.current {
            if self.cutter.count(current_start, end) <= self.cutter.max_tokens {
                self.current = Some((current_start, end));
                return;
            }
            self.flush();
        }
        if self.cutter.count(start, end) <= self.cutter.max_tokens {
            self.current = Some((start, end));
            return;
        }
        match kind {
            BlockKind::Table => self.split_table(start, end),
            BlockKind::Lines => self.split_on_lines(start, end),
            BlockKind::Heading | BlockKind::Prose => {
                let mut units = Vec::new();
                sentence::prose_units(self.cutter, start, end, self.cutter.max_tokens, &mut units);
                self.emit_packed(&units);
            }
        }
    }

    pub fn add_lines_block(&mut self, start: usize, end: usize) {
        self.add(start, end, BlockKind::Lines);
    }

    pub fn flush(&mut self) {
        if let Some((start, end)) = self.current.take() {
            self.push(start, end, None);
        }
    }

    fn push(&mut self, start: usize, end: usize, header: Option<(u32, u32)>) {
        let heading = self
            .heading
            .filter(|&(heading_start, _)| heading_start as usize != start);
        self.cutter
            .push(self.out, start, end, self.strategy, header, heading);
    }

    fn split_on_lines(&mut self, start: usize, end: usize) {
        let mut units = Vec::new();
        self.cutter
            .line_units(start, end, self.cutter.max_tokens, &mut units);
        self.emit_packed(&units);
    }

    fn emit_packed(&mut self, units: &[Range<u32>]) {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        self.cutter
            .pack(units, self.cutter.max_tokens, 0, |a, b| spans.push((a, b)));
        for (a, b) in spans {
            self.push(a, b, None);
        }
    }

    /// Rows, with the header and delimiter rows as the header of every continuation chunk.
    fn split_table(&mut self, start: usize, end: usize) {
        let text = &self.cutter.text[start..end];
        let header_end = text
            .match_indices('\n')
            .nth(1)
            .map(|(offset, _)| start + offset)
            .unwrap_or(end);
        self.split_rows_with_header(start, header_end, end);
    }

    /// Packs the lines of `start..end` whose first lines `start..header_end` are a header.
    pub fn split_rows_with_header(&mut self, start: usize, header_end: usize, end: usize) {
        let (header, rest_budget) = self.header_and_budget(start, header_end);
        let mut rows = Vec::new();
        self.cutter.line_units(start, end, rest_budget, &mut rows);
        self.pack_rows(&rows, header, rest_budget);
    }

    /// Packs `raw_rows` (in order, covering the text) whose first row ends at `header_end`.
    pub fn split_rows_with_header_rows(
        &mut self,
        start: usize,
        header_end: usize,
        raw_rows: &[Range<u32>],
    ) {
        let (header, rest_budget) = self.header_and_budget(start, header_end);
        let mut rows = Vec::with_capacity(raw_rows.len());
        for row in raw_rows {
            self.cutter.push_unit_or_split(
                row.start as usize,
                row.end as usize,
                rest_budget,
                &mut rows,
            );
        }
        self.pack_rows(&rows, header, rest_budget);
    }

    /// The header span to repeat and the budget left for rows. The header is repeated only where
    /// it leaves at least half of the budget for rows.
    fn header_and_budget(&self, start: usize, header_end: usize) -> (Option<(u32, u32)>, usize) {
        let max_tokens = self.cutter.max_tokens;
        let Some((a, b)) = self.cutter.trimmed(start, header_end) else {
            return (None, max_tokens);
        };
        let header_tokens = self.cutter.count(a, b);
        if header_tokens > 0 && header_tokens * 2 <= max_tokens {
            (Some((a as u32, b as u32)), max_tokens - header_tokens)
        } else {
            (None, max_tokens)
        }
    }

    fn pack_rows(&mut self, rows: &[Range<u32>], header: Option<(u32, u32)>, rest_budget: usize) {
        let mut spans: Vec<(usize, usize, bool)> = Vec::new();
        self.cutter
            .pack_rows(rows, self.cutter.max_tokens, rest_budget, |a, b, first| {
                spans.push((a, b, first))
            });
        for (a, b, first) in spans {
            self.push(a, b, if first { None } else { header });
        }
    }
}

/// Top-level blocks of a Markdown text, in order; gaps holding non-whitespace (link reference
/// definitions, which produce no event) become prose blocks so that nothing is lost.
fn top_level_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut depth = 0usize;
    let mut kind = BlockKind::Prose;
    let mut covered_to = 0usize;
    let mut add = |blocks: &mut Vec<Block>, kind: BlockKind, start: usize, end: usize| {
        // Snap to char boundaries so that no later slice can panic.
        let start = crate::tokens::floor_char_boundary(text, start).max(covered_to);
        let end = crate::tokens::ceil_char_boundary(text, end);
        if end <= start {
            return;
        }
        if start > covered_to && !text[covered_to..start].trim().is_empty() {
            blocks.push(Block {
                kind: BlockKind::Prose,
                start: covered_to,
                end: start,
            });
        }
        blocks.push(Block { kind, start, end });
        covered_to = end;
    };
    for (event, range) in Parser::new_ext(text, Options::ENABLE_TABLES).into_offset_iter() {
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    kind = match tag {
                        Tag::Heading { .. } => BlockKind::Heading,
                        Tag::Table(_) => BlockKind::Table,
                        Tag::Paragraph => BlockKind::Prose,
                        _ => BlockKind::Lines,
                    };
                }
                depth += 1;
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    add(&mut blocks, kind, range.start, range.end);
                }
            }
            _ if depth == 0 => add(&mut blocks, BlockKind::Lines, range.start, range.end),
            _ => {}
        }
    }
    if covered_to < text.len() && !text[covered_to..].trim().is_empty() {
        blocks.push(Block {
            kind: BlockKind::Prose,
            start: covered_to,
            end: text.len(),
        });
    }
    blocks
}
