//! HTML: the document is parsed with scraper (html5ever, tolerant of malformed markup, entities
//! decoded) and its readable text extracted; sections start at `h1`–`h6`.
//!
//! Extraction rules:
//! - Dropped with their contents: `head` (so `title` too, see below), `script`, `style`,
//!   `noscript`, `template`, `iframe`, `svg`, `canvas`; comments, doctypes and processing
//!   instructions.
//! - Paragraph-like blocks (`p`, `h1`–`h6`, `pre`, `blockquote`, lists, `table`, `section`, ...)
//!   are separated by a blank line, so the paragraph splitter sees them as paragraphs; line-like
//!   blocks (`div`, `li`, `tr`, `dt`, `dd`, ...) and `br` give a line break; table cells are
//!   separated by a space.
//! - Outside `pre`, every run of whitespace (any Unicode whitespace, `&nbsp;` included) becomes
//!   one space, and none is left at a line start or end; inside `pre` text is kept as it is.
//! - Title: when the document has no `h1`, a non-empty `head > title` is emitted first as a level
//!   1 heading, so it starts the text and roots the heading paths, standing in for the missing
//!   `h1`. With an `h1` present the title is dropped (it usually repeats the `h1`).
//! - A heading with no text starts no section (it would add an empty title to the path); a heading
//!   nested in another heading (malformed markup) is only a block inside it.

use scraper::{Html, Node};

use super::{collapse_whitespace, HeadingMark};

/// The extracted text and the headings found in it (byte starts into `text`, in order).
pub(super) struct ExtractedText {
    pub(super) text: String,
    pub(super) headings: Vec<HeadingMark>,
}

const DROPPED_ELEMENTS: &[&str] = &[
    "head", "script", "style", "noscript", "template", "iframe", "svg", "canvas",
];

const PARAGRAPH_ELEMENTS: &[&str] = &[
    "p",
    "pre",
    "blockquote",
    "ul",
    "ol",
    "dl",
    "menu",
    "table",
    "section",
    "article",
    "header",
    "footer",
    "aside",
    "nav",
    "main",
    "figure",
    "hr",
    "form",
    "fieldset",
    "details",
    "address",
    "hgroup",
];

const LINE_ELEMENTS: &[&str] = &[
    "div",
    "li",
    "dt",
    "dd",
    "tr",
    "thead",
    "tbody",
    "tfoot",
    "caption",
    "figcaption",
    "summary",
    "legend",
    "option",
    "center",
    "dialog",
    "search",
    "body",
    "html",
];

/// Elements that never hold others (void) or that the parser closes by itself when a sibling
/// opens (so an unclosed run of them does not nest): neither deepens the tree.
const NON_NESTING_ELEMENTS: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "p", "li", "dt", "dd", "tr", "td", "th", "option", "thead", "tbody", "tfoot",
];

/// How deep the markup nests, estimated in one linear pass over the tags (comments and attribute
/// values are not parsed out, so odd markup can read deeper than it is, never much shallower).
/// html5ever's tree building costs time quadratic in the depth (its scope checks walk the stack
/// of open elements), so the server refuses documents nested deeper than a limit before parsing.
pub fn nesting_depth(html: &str) -> usize {
    let bytes = html.as_bytes();
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut at = 0;
    while let Some(offset) = bytes[at..].iter().position(|&b| b == b'<') {
        let tag = at + offset + 1;
        at = tag;
        match bytes.get(tag) {
            Some(b'/') => depth = depth.saturating_sub(1),
            Some(byte) if byte.is_ascii_alphabetic() => {
                let name_end = bytes[tag..]
                    .iter()
                    .position(|b| !b.is_ascii_alphanumeric())
                    .map_or(bytes.len(), |end| tag + end);
                let name = &html[tag..name_end];
                // The tag ends at the next `>`; stopping at a `<` too keeps the pass linear.
                let self_closing = bytes[name_end..]
                    .iter()
                    .position(|&b| b == b'>' || b == b'<')
                    .is_some_and(|end| {
                        bytes[name_end + end] == b'>'
                            && end > 0
                            && bytes[name_end + end - 1] == b'/'
                    });
                let nests = !self_closing
                    && !NON_NESTING_ELEMENTS
                        .iter()
                        .any(|element| element.eq_ignore_ascii_case(name));
                if nests {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
            }
            _ => {}
        }
    }
    deepest
}

pub(super) fn extract_text(html: &str) -> ExtractedText {
    let document = Html::parse_document(html);
    let mut writer = TextWriter::default();

    if !has_element(&document, "h1") {
        if let Some(title) = head_title(&document) {
            writer.open_heading(1);
            writer.push_collapsing(&title);
            writer.close_heading();
        }
    }

    // `traverse` walks the tree iteratively, so deeply nested markup cannot overflow the stack.
    // Inside a dropped element only its depth is tracked, to know where it ends.
    let mut dropped_depth = 0usize;
    for edge in document.tree.root().traverse() {
        match edge {
            ego_tree::iter::Edge::Open(node) => match node.value() {
                Node::Element(element) => {
                    let name = element.name();
                    if dropped_depth > 0 || DROPPED_ELEMENTS.contains(&name) {
                        dropped_depth += 1;
                    } else {
                        writer.open_element(name);
                    }
                }
                Node::Text(text) if dropped_depth == 0 => writer.push_text(text),
                _ => {}
            },
            ego_tree::iter::Edge::Close(node) => {
                if let Node::Element(element) = node.value() {
                    if dropped_depth > 0 {
                        dropped_depth -= 1;
                    } else {
                        writer.close_element(element.name());
                    }
                }
            }
        }
    }
    ExtractedText {
        text: writer.text,
        headings: writer.headings,
    }
}

fn has_element(document: &Html, name: &str) -> bool {
    document
        .tree
        .nodes()
        .any(|node| node.value().as_element().is_some_and(|e| e.name() == name))
}

/// The collapsed text of the first `title` directly under `head` (an SVG `title` is not it).
fn head_title(document: &Html) -> Option<String> {
    let title = document.tree.nodes().find(|node| {
        let is_title = node
            .value()
            .as_element()
            .is_some_and(|e| e.name() == "title");
        let parent_is_head = node
            .parent()
            .and_then(|parent| parent.value().as_element().map(|e| e.name() == "head"))
            .unwrap_or(false);
        is_title && parent_is_head
    })?;
    let mut raw = String::new();
    for node in title.descendants() {
        if let Node::Text(text) = node.value() {
            raw.push_str(text);
        }
    }
    let collapsed = collapse_whitespace(&raw);
    (!collapsed.is_empty()).then_some(collapsed)
}

fn heading_level(name: &str) -> Option<u8> {
    match name {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    }
}

/// Builds the extracted text. Separators are kept pending and written only before the next
/// visible char, so the text never starts or ends with them and blocks never stack blank lines.
#[derive(Default)]
struct TextWriter {
    text: String,
    /// Line breaks owed before the next content: 0, 1 (new line) or 2 (blank line).
    pending_breaks: u8,
    /// A space owed before the next content (collapsed whitespace, cell separator).
    pending_space: bool,
    preformatted_depth: usize,
    /// Open heading elements; only the outermost one is a heading.
    heading_depth: usize,
    /// Start byte and level of the outermost open heading.
    open_heading: Option<(usize, u8)>,
    headings: Vec<HeadingMark>,
}

impl TextWriter {
    fn request_breaks(&mut self, breaks: u8) {
        self.pending_breaks = self.pending_breaks.max(breaks);
    }

    /// Writes the owed separators, as content is about to follow.
    fn flush_separators(&mut self) {
        if !self.text.is_empty() {
            if self.pending_breaks > 0 {
                let trailing_newlines = self
                    .text
                    .bytes()
                    .rev()
                    .take(usize::from(self.pending_breaks))
                    .take_while(|&b| b == b'\n')
                    .count();
                for _ in trailing_newlines..usize::from(self.pending_breaks) {
                    self.text.push('\n');
                }
            } else if self.pending_space && !self.text.ends_with('\n') {
                self.text.push(' ');
            }
        }
        self.pending_breaks = 0;
        self.pending_space = false;
    }

    fn push_text(&mut self, text: &str) {
        if self.preformatted_depth > 0 {
            if text.is_empty() {
                return;
            }
            self.flush_separators();
            self.text.push_str(text);
            return;
        }
        self.push_collapsing(text);
    }

    fn push_collapsing(&mut self, text: &str) {
        for ch in text.chars() {
            if ch.is_whitespace() {
                self.pending_space = true;
                continue;
            }
            if self.pending_breaks > 0 || self.pending_space {
                self.flush_separators();
            }
            self.text.push(ch);
        }
    }

    fn open_element(&mut self, name: &str) {
        if let Some(level) = heading_level(name) {
            self.open_heading(level);
            return;
        }
        match name {
            "br" => self.pending_breaks = (self.pending_breaks + 1).min(2),
            "td" | "th" => self.pending_space = true,
            "pre" => {
                self.preformatted_depth += 1;
                self.request_breaks(2);
            }
            _ if PARAGRAPH_ELEMENTS.contains(&name) => self.request_breaks(2),
            _ if LINE_ELEMENTS.contains(&name) => self.request_breaks(1),
            _ => {}
        }
    }

    fn close_element(&mut self, name: &str) {
        if heading_level(name).is_some() {
            self.close_heading();
            return;
        }
        match name {
            "td" | "th" => self.pending_space = true,
            "pre" => {
                self.preformatted_depth = self.preformatted_depth.saturating_sub(1);
                self.request_breaks(2);
            }
            _ if PARAGRAPH_ELEMENTS.contains(&name) => self.request_breaks(2),
            _ if LINE_ELEMENTS.contains(&name) => self.request_breaks(1),
            _ => {}
        }
    }

    fn open_heading(&mut self, level: u8) {
        self.heading_depth += 1;
        self.request_breaks(2);
        if self.heading_depth > 1 {
            return;
        }
        // Write the blank line now so that the heading's section starts at its first char.
        self.pending_space = false;
        self.flush_separators();
        self.open_heading = Some((self.text.len(), level));
    }

    fn close_heading(&mut self) {
        self.heading_depth = self.heading_depth.saturating_sub(1);
        self.request_breaks(2);
        if self.heading_depth > 0 {
            return;
        }
        if let Some((start, level)) = self.open_heading.take() {
            let title = collapse_whitespace(&self.text[start..]);
            if !title.is_empty() {
                self.headings.push(HeadingMark {
                    start,
                    level,
                    title,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn titles(extracted: &ExtractedText) -> Vec<(u8, &str)> {
        extracted
            .headings
            .iter()
            .map(|h| (h.level, h.title.as_str()))
            .collect()
    }

    #[test]
    fn scripts_styles_and_head_are_dropped_and_entities_decoded() {
        let html = "<html><head><title>T</title><style>p{color:red}</style></head><body>\
                    <h1>Fish &amp; Chips</h1><script>var x = '<p>no</p>';</script>\
                    <noscript>enable js</noscript><template><p>tpl</p></template>\
                    <p>caf&eacute;&nbsp;&lt;3 &#x1F600;</p><!-- comment --></body></html>";
        let extracted = extract_text(html);
        assert_eq!(extracted.text, "Fish & Chips\n\ncafé <3 😀");
        assert_eq!(titles(&extracted), [(1, "Fish & Chips")]);
        assert_eq!(extracted.headings[0].start, 0);
    }

    #[test]
    fn blocks_give_breaks_and_inline_whitespace_collapses() {
        let html = "<div>  one\n  <b>two</b>\t three </div><div>four<br>five</div>\
                    <ul><li>a</li><li> b </li></ul><p>x</p><p>y</p>\
                    <table><tr><td>c1</td><td>c2</td></tr><tr><td>c3</td></tr></table>";
        let extracted = extract_text(html);
        assert_eq!(
            extracted.text,
            "one two three\nfour\nfive\n\na\nb\n\nx\n\ny\n\nc1 c2\nc3"
        );
    }

    #[test]
    fn preformatted_text_keeps_its_whitespace() {
        let html = "<p>before</p><pre>fn main() {\n    let  x = 1;\n}</pre><p>after</p>";
        let extracted = extract_text(html);
        assert_eq!(
            extracted.text,
            "before\n\nfn main() {\n    let  x = 1;\n}\n\nafter"
        );
    }

    #[test]
    fn malformed_markup_is_tolerated() {
        let html =
            "<p>unclosed <b>bold <i>both</p><h2>A &amp B &copy 1</h2><div><p>x</div></span></td>\
                    <h3>Deep";
        let extracted = extract_text(html);
        assert_eq!(
            extracted.text,
            "unclosed bold both\n\nA & B © 1\n\nx\n\nDeep"
        );
        assert_eq!(titles(&extracted), [(2, "A & B © 1"), (3, "Deep")]);
    }

    #[test]
    fn title_stands_in_for_a_missing_h1_only() {
        let without_h1 = extract_text("<title> My  Page </title><h2>Part</h2><p>text</p>");
        assert_eq!(without_h1.text, "My Page\n\nPart\n\ntext");
        assert_eq!(titles(&without_h1), [(1, "My Page"), (2, "Part")]);

        let with_h1 = extract_text("<title>My Page</title><h1>Top</h1>");
        assert_eq!(with_h1.text, "Top");
        assert_eq!(titles(&with_h1), [(1, "Top")]);
    }

    #[test]
    fn empty_headings_start_no_section() {
        let extracted = extract_text("<h1>A</h1><h2> <img src=x> </h2><p>t</p>");
        assert_eq!(titles(&extracted), [(1, "A")]);
        assert_eq!(extracted.text, "A\n\nt");
    }

    #[test]
    fn nesting_depth_counts_open_elements_but_not_void_or_self_closing_ones() {
        assert_eq!(nesting_depth("plain text"), 0);
        assert_eq!(nesting_depth("<div><p>a<br>b<img src=x/></p></div>"), 1);
        assert_eq!(nesting_depth("<ul><li>a<ul><li>b</ul></ul>"), 2);
        assert_eq!(nesting_depth(&"<div>".repeat(300)), 300);
        assert_eq!(nesting_depth(&"<div></div>".repeat(300)), 1);
        assert_eq!(nesting_depth(&"<p>unclosed ".repeat(300)), 0);
        assert_eq!(nesting_depth("<DIV><Span>x</Span></DIV>"), 2);
        assert_eq!(nesting_depth("a < b and c<"), 0);
    }

    #[test]
    fn deeply_nested_markup_does_not_overflow_the_stack() {
        // 10,000 levels. Deeper costs html5ever time quadratic in the depth (its scope checks
        // walk the stack of open elements; see examples/nested_html_time.rs), not stack.
        let html = format!(
            "{}text{}",
            "<div><span>".repeat(5_000),
            "</span></div>".repeat(5_000)
        );
        assert_eq!(extract_text(&html).text, "text");
    }
}
