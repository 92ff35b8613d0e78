//! Which files `lathe ingest` reads, told by their extension (after `.gz`, the one inside): what
//! format each is sent as, and which chunk strategy suits it. A document carries only its format
//! (plain, Markdown, HTML); chunking is chosen per query, so the strategy that suits a file goes
//! in its metadata (`strategy=csv`, `strategy=code`), for a query to filter on and ask for.

use crate::proto;

/// What a file holds, as far as ingest is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FileKind {
    Markdown,
    Html,
    /// `.txt`: sent as `--default-format`.
    Text,
    /// Other plain-text markup (reStructuredText, AsciiDoc, Org): sent as plain text.
    Markup,
    /// Comma- or tab-separated rows.
    Table,
    /// Source code and configuration.
    Code,
    /// One document a line, as JSON.
    Jsonl,
}

/// Extensions of source code and configuration files (lower case, without the dot).
const CODE_EXTENSIONS: &[&str] = &[
    "py", "pyi", "rs", "go", "js", "mjs", "cjs", "jsx", "ts", "tsx", "java", "kt", "kts", "scala",
    "groovy", "c", "h", "cc", "cpp", "cxx", "hh", "hpp", "hxx", "cs", "m", "mm", "swift", "rb",
    "php", "pl", "pm", "lua", "r", "jl", "dart", "ex", "exs", "erl", "hs", "ml", "mli", "clj",
    "el", "zig", "nim", "sh", "bash", "zsh", "fish", "ps1", "sql", "proto", "css", "scss", "less",
    "vue", "svelte", "json", "yaml", "yml", "toml", "ini", "cmake", "mk", "gradle", "tf",
];

/// Plain-text markup other than Markdown and HTML.
const MARKUP_EXTENSIONS: &[&str] = &["rst", "adoc", "asciidoc", "org", "tex"];

impl FileKind {
    /// The kind of a file with extension `extension` (lower case, no dot); `None` for one
    /// ingest does not read.
    pub(super) fn of_extension(extension: &str) -> Option<Self> {
        Some(match extension {
            "md" | "markdown" | "mdx" => Self::Markdown,
            "html" | "htm" | "xhtml" => Self::Html,
            "txt" | "text" => Self::Text,
            "csv" | "tsv" => Self::Table,
            "jsonl" | "ndjson" => Self::Jsonl,
            other if MARKUP_EXTENSIONS.contains(&other) => Self::Markup,
            other if CODE_EXTENSIONS.contains(&other) => Self::Code,
            _ => return None,
        })
    }

    /// The format a document of this kind is sent as (`.txt` as `default_format`).
    pub(super) fn format(self, default_format: proto::DocumentFormat) -> proto::DocumentFormat {
        match self {
            Self::Markdown => proto::DocumentFormat::Markdown,
            Self::Html => proto::DocumentFormat::Html,
            Self::Text | Self::Jsonl => default_format,
            Self::Markup | Self::Table | Self::Code => proto::DocumentFormat::Plain,
        }
    }

    /// The chunk strategy that suits this kind better than the collection's default, as
    /// `lathe query --strategy` names it.
    pub(super) fn strategy_hint(self) -> Option<&'static str> {
        match self {
            Self::Table => Some("csv"),
            Self::Code => Some("code"),
            _ => None,
        }
    }
}

/// The kinds read, for messages: `.md .markdown .html … .jsonl, source code, and .gz of any`.
pub(super) const KINDS_READ: &str = ".md .markdown .html .htm .txt .rst .adoc .org .csv .tsv .jsonl, source code (.py .rs .go .js .ts .java .c .h .cpp .rb .sh …), and any of them gzipped (.gz)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_map_to_kinds_formats_and_strategies() {
        let plain = proto::DocumentFormat::Plain;
        let markdown = FileKind::of_extension("md").unwrap();
        assert_eq!(markdown.format(plain), proto::DocumentFormat::Markdown);
        assert_eq!(markdown.strategy_hint(), None);
        let text = FileKind::of_extension("txt").unwrap();
        assert_eq!(
            text.format(proto::DocumentFormat::Html),
            proto::DocumentFormat::Html
        );
        assert_eq!(FileKind::of_extension("rst"), Some(FileKind::Markup));
        let table = FileKind::of_extension("tsv").unwrap();
        assert_eq!(table.format(proto::DocumentFormat::Markdown), plain);
        assert_eq!(table.strategy_hint(), Some("csv"));
        for extension in [
            "py", "rs", "go", "js", "ts", "java", "c", "h", "cpp", "rb", "sh",
        ] {
            let kind = FileKind::of_extension(extension);
            assert_eq!(kind, Some(FileKind::Code), "{extension}");
            assert_eq!(kind.unwrap().strategy_hint(), Some("code"));
        }
        for unread in ["png", "pdf", "gz", "", "exe"] {
            assert_eq!(FileKind::of_extension(unread), None, "{unread}");
        }
        // Every strategy named is one the query CLI takes.
        for kind in [FileKind::Table, FileKind::Code] {
            let name = kind.strategy_hint().unwrap();
            crate::client::strategy_from_name(name).unwrap();
        }
    }
}
