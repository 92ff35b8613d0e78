//! What a caller reads before a span, and the exact count of it all: in the document-grouped
//! order ([`ResultOrder::Position`]) the heading path of the span's section, as a line of its own;
//! then, for a span that continues a table without holding its header, the header rows. The
//! caller reads `context + "\n" + text`, and that is what pack and expand count against the
//! budget, so a long prompt reads like excerpts of documents under their headings and the budget
//! still holds.

use std::collections::HashMap;

use super::SectionAnalysis;
use crate::index::SectionHit;
use crate::tokenizer::BudgetTokenizer;
use crate::types::{ResultOrder, HEADING_SEPARATOR};

/// A section's heading path as one line, and its count in the budget tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadingLine {
    pub text: String,
    pub tokens: usize,
}

/// The heading lines of the retrieved sections, by hit: none in score order, and none for a
/// section without headings.
#[derive(Debug, Default)]
pub struct SpanContexts {
    lines: Vec<Option<HeadingLine>>,
}

impl SpanContexts {
    /// The contexts for answers in `order`: in position order each section with a heading path
    /// gets its heading line, each distinct line counted once (sections of one heading share it).
    pub fn for_order(order: ResultOrder, hits: &[SectionHit], tokenizer: &BudgetTokenizer) -> Self {
        if order != ResultOrder::Position {
            return Self::default();
        }
        let mut counted: HashMap<String, usize> = HashMap::new();
        let lines = hits
            .iter()
            .map(|hit| {
                let text = hit.heading_path.join(HEADING_SEPARATOR);
                if text.trim().is_empty() {
                    return None;
                }
                let tokens = match counted.get(&text) {
                    Some(&tokens) => tokens,
                    None => *counted
                        .entry(text.clone())
                        .or_insert_with(|| tokenizer.count(&text)),
                };
                Some(HeadingLine { text, tokens })
            })
            .collect();
        Self { lines }
    }

    /// The heading line read before the spans of the section at `hit_index`.
    pub fn heading(&self, hit_index: u32) -> Option<&HeadingLine> {
        self.lines.get(hit_index as usize)?.as_ref()
    }

    /// Exactly the budget tokens of what the caller reads for the span `range` of section
    /// `hit_index` continuing the table header `header` (byte ranges of the section text): the
    /// [`Self::context`] and a line break before the span's text when there is a context.
    pub fn count(
        &self,
        tokenizer: &BudgetTokenizer,
        hit_index: u32,
        text: &str,
        analysis: &SectionAnalysis,
        header: Option<(u32, u32)>,
        range: (u32, u32),
    ) -> usize {
        let bytes = range.0 as usize..range.1 as usize;
        match (self.heading(hit_index), header) {
            (None, None) => {
                tokenizer.count_span(text, &analysis.tokens, analysis.spans_from_offsets, bytes)
            }
            (Some(line), None) => tokenizer.count_after_line(
                &line.text,
                line.tokens,
                text,
                &analysis.tokens,
                analysis.spans_from_offsets,
                bytes,
            ),
            (_, Some(header)) => {
                let mut read = self.context(hit_index, text, Some(header));
                read.push('\n');
                read.push_str(&text[bytes]);
                tokenizer.count(&read)
            }
        }
    }

    /// The context returned with a span: the heading line, then the table header, a line break
    /// between them; empty when there is neither.
    pub fn context(&self, hit_index: u32, text: &str, header: Option<(u32, u32)>) -> String {
        let header = header.map(|(start, end)| &text[start as usize..end as usize]);
        match (self.heading(hit_index), header) {
            (None, None) => String::new(),
            (Some(line), None) => line.text.clone(),
            (None, Some(header)) => header.to_string(),
            (Some(line), Some(header)) => {
                let mut context = String::with_capacity(line.text.len() + 1 + header.len());
                context.push_str(&line.text);
                context.push('\n');
                context.push_str(header);
                context
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> BudgetTokenizer {
        BudgetTokenizer::resolve("minilm", &crate::test_models_dir())
            .expect("run scripts/fetch-models.sh")
    }

    fn section(text: &str, heading_path: &[&str]) -> SectionHit {
        SectionHit {
            heading_path: heading_path.iter().map(|t| t.to_string()).collect(),
            ..crate::query::test_section_hit(1.0, text)
        }
    }

    fn analysis(tokenizer: &BudgetTokenizer, text: &str) -> SectionAnalysis {
        SectionAnalysis {
            tokens: tokenizer.offsets(text),
            spans_from_offsets: tokenizer.spans_count_from_offsets(text),
            ..Default::default()
        }
    }

    #[test]
    fn position_order_reads_each_span_under_its_heading_path_and_counts_it() {
        let tokenizer = tokenizer();
        let text = "| a | b |\n|---|---|\n| 1 | 2 |\nInstall it with apt, then run it.";
        let hits = [
            section(text, &["Install", "On Debian"]),
            section("No heading here.", &[]),
        ];
        let contexts = SpanContexts::for_order(ResultOrder::Position, &hits, &tokenizer);
        let span = (text.find("Install").unwrap() as u32, text.len() as u32);
        let analysis = analysis(&tokenizer, text);

        assert_eq!(contexts.context(0, text, None), "Install > On Debian");
        let read = format!("Install > On Debian\n{}", &text[span.0 as usize..]);
        assert_eq!(
            contexts.count(&tokenizer, 0, text, &analysis, None, span),
            tokenizer.count(&read)
        );

        let header = Some((0, text.find("| 1").unwrap() as u32 - 1));
        let context = contexts.context(0, text, header);
        assert_eq!(context, "Install > On Debian\n| a | b |\n|---|---|");
        assert_eq!(
            contexts.count(&tokenizer, 0, text, &analysis, header, span),
            tokenizer.count(&format!("{context}\n{}", &text[span.0 as usize..]))
        );

        assert_eq!(contexts.heading(1), None, "a section without headings");
        let score_order = SpanContexts::for_order(ResultOrder::Score, &hits, &tokenizer);
        assert_eq!(score_order.heading(0), None);
        assert_eq!(
            score_order.count(&tokenizer, 0, text, &analysis, None, span),
            tokenizer.count(&text[span.0 as usize..])
        );
    }

    #[test]
    fn a_span_starting_off_a_cut_is_counted_joined() {
        let tokenizer = tokenizer();
        // "é" is not ASCII: the line break before it is not a known cut.
        let text = "éclair recipe";
        let hits = [section(text, &["Desserts?"])];
        let contexts = SpanContexts::for_order(ResultOrder::Position, &hits, &tokenizer);
        let counted = contexts.count(
            &tokenizer,
            0,
            text,
            &analysis(&tokenizer, text),
            None,
            (0, text.len() as u32),
        );
        assert_eq!(counted, tokenizer.count("Desserts?\néclair recipe"));
    }
}
