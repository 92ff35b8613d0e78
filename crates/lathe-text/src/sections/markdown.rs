//! Markdown: sections start at ATX and setext headings found by pulldown-cmark, so a `#` line
//! inside a fenced code block, an HTML block or YAML front matter is not a heading.
//!
//! Only top-level headings start sections: one inside a block quote or a list item is quoted or
//! nested content, and starting a section at it would leave the `>` or list marker before it
//! stranded in the previous section. A heading whose plain title is empty (a bare `#`) starts no
//! section either: it would add an empty title to the path.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag};

use super::{collapse_whitespace, HeadingMark};

/// The top-level headings of `text`, in order, with their byte start and plain title (inline
/// markup stripped: code spans, emphasis and links give their text).
pub(super) fn heading_marks(text: &str) -> Vec<HeadingMark> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES
        | Options::ENABLE_YAML_STYLE_METADATA_BLOCKS;
    let mut headings = Vec::new();
    // Depth of open tags; a heading that opens at depth 0 is a direct child of the document.
    let mut tag_depth = 0usize;
    let mut open_heading: Option<(usize, u8)> = None;
    let mut raw_title = String::new();
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(tag) => {
                if tag_depth == 0 {
                    if let Tag::Heading { level, .. } = tag {
                        open_heading = Some((range.start, heading_level_number(level)));
                        raw_title.clear();
                    }
                }
                tag_depth += 1;
            }
            Event::End(_) => {
                tag_depth = tag_depth.saturating_sub(1);
                if tag_depth != 0 {
                    continue;
                }
                if let Some((start, level)) = open_heading.take() {
                    let title = collapse_whitespace(&raw_title);
                    if !title.is_empty() {
                        headings.push(HeadingMark {
                            start,
                            level,
                            title,
                        });
                    }
                }
            }
            Event::Text(fragment) | Event::Code(fragment) if open_heading.is_some() => {
                raw_title.push_str(&fragment);
            }
            Event::SoftBreak | Event::HardBreak if open_heading.is_some() => raw_title.push(' '),
            _ => {}
        }
    }
    headings
}

fn heading_level_number(level: HeadingLevel) -> u8 {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn titles(text: &str) -> Vec<(u8, String)> {
        heading_marks(text)
            .into_iter()
            .map(|h| (h.level, h.title))
            .collect()
    }

    #[test]
    fn hash_lines_in_fenced_code_are_not_headings() {
        let text = "# Real\n\n```sh\n# not a heading\n## nor this\n```\n\n~~~\n# nope\n~~~\n";
        assert_eq!(titles(text), [(1, "Real".to_string())]);
    }

    #[test]
    fn setext_and_atx_headings_are_found_with_their_start() {
        let text = "intro\n\nTitle\n=====\n\nSub\n---\n\n### Deep ###\n";
        let marks = heading_marks(text);
        let found: Vec<(usize, u8, &str)> = marks
            .iter()
            .map(|h| (h.start, h.level, h.title.as_str()))
            .collect();
        assert_eq!(found, [(7, 1, "Title"), (20, 2, "Sub"), (29, 3, "Deep")]);
    }

    #[test]
    fn inline_markup_is_stripped_from_titles() {
        let text = "## Use `cargo`  with *care* and [links](http://x.y) ![alt](i.png)\n";
        assert_eq!(
            titles(text),
            [(2, "Use cargo with care and links alt".to_string())]
        );
    }

    #[test]
    fn quoted_nested_and_empty_headings_start_no_section() {
        let text = "> # Quoted\n\n- # In a list\n\n#\n\n# Top\n";
        assert_eq!(titles(text), [(1, "Top".to_string())]);
    }

    #[test]
    fn front_matter_dashes_are_not_a_setext_heading() {
        let text = "---\ntitle: x\n---\n\nBody\n";
        assert!(titles(text).is_empty());
    }
}
