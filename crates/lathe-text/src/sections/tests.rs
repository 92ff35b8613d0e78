//! Tests of the public API: format examples, caller sections, property tests of the invariants
//! and a run with the real MiniLM tokenizer.

use super::*;
use proptest::prelude::*;

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

/// `(section text, heading path)` pairs, with the invariants checked on the way.
fn split<'t>(
    document: &'t ParsedDocument<'_>,
    limit: usize,
    count: &dyn Fn(&str) -> usize,
) -> Vec<(&'t str, Vec<&'t str>)> {
    if let Err(broken) = check_section_invariants(&document.text, &document.sections, limit, count)
    {
        panic!("{broken}");
    }
    document
        .sections
        .iter()
        .map(|s| {
            let path = s.heading_path.iter().map(String::as_str).collect();
            (&document.text[s.start..s.end], path)
        })
        .collect()
}

#[test]
fn markdown_sections_follow_headings_with_nested_paths() {
    let text = "Preface line.\n\n# Install\n\nGet it.\n\n## On Debian\n\n```sh\n# apt install lathe\n```\n\n\
                ### Notes\n\nSome.\n\nOther H2\n--------\n\nText.\n\n# Use `lathe`\n\nRun *it*.\n";
    let document = split_document(text, Format::Markdown, 1000, &words);
    assert!(matches!(document.text, Cow::Borrowed(_)));
    assert_eq!(
        split(&document, 1000, &words),
        [
            ("Preface line.", vec![]),
            ("# Install\n\nGet it.", vec!["Install"]),
            (
                "## On Debian\n\n```sh\n# apt install lathe\n```",
                vec!["Install", "On Debian"]
            ),
            ("### Notes\n\nSome.", vec!["Install", "On Debian", "Notes"]),
            ("Other H2\n--------\n\nText.", vec!["Install", "Other H2"]),
            ("# Use `lathe`\n\nRun *it*.", vec!["Use lathe"]),
        ]
    );
}

#[test]
fn oversized_markdown_section_is_cut_and_pieces_keep_the_path() {
    let text = "# Big\n\none two three\n\nfour five six\n\nseven eight nine ten eleven. Twelve.";
    let document = split_document(text, Format::Markdown, 4, &words);
    assert_eq!(
        split(&document, 4, &words),
        [
            ("# Big", vec!["Big"]),
            ("one two three", vec!["Big"]),
            ("four five six", vec!["Big"]),
            ("seven eight nine ten", vec!["Big"]),
            ("eleven.", vec!["Big"]),
            ("Twelve.", vec!["Big"]),
        ]
    );
}

#[test]
fn plain_paragraphs_are_grouped_greedily() {
    let text = "a b c\n\nd e\n   \nf g h i\n\nj";
    let document = split_document(text, Format::Plain, 5, &words);
    assert_eq!(
        split(&document, 5, &words),
        [("a b c\n\nd e", vec![]), ("f g h i\n\nj", vec![])]
    );
    let whole = split_document(text, Format::Plain, 100, &words);
    assert_eq!(split(&whole, 100, &words), [(text, vec![])]);
}

#[test]
fn html_sections_index_into_the_extracted_text() {
    let html = "<html><head><script>x()</script></head><body><p>intro</p>\
                <h1>Guide</h1><p>Read &lt;this&gt;.</p><h2>Part <em>one</em></h2><p>one</p>\
                <h3>Deep<h2>Two</h2>tail";
    let document = split_document(html, Format::Html, 100, &words);
    assert!(matches!(document.text, Cow::Owned(_)));
    assert_eq!(
        split(&document, 100, &words),
        [
            ("intro", vec![]),
            ("Guide\n\nRead <this>.", vec!["Guide"]),
            ("Part one\n\none", vec!["Guide", "Part one"]),
            ("Deep", vec!["Guide", "Part one", "Deep"]),
            ("Two\n\ntail", vec!["Guide", "Two"]),
        ]
    );
}

#[test]
fn empty_and_whitespace_inputs_give_no_sections() {
    for format in [Format::Plain, Format::Markdown, Format::Html] {
        for text in ["", " \n\t\u{a0}\u{3000}\n"] {
            let document = split_document(text, format, 10, &words);
            assert!(document.sections.is_empty(), "{format:?} {text:?}");
        }
    }
    let html = split_document("<p> </p><div>&nbsp;</div>", Format::Html, 10, &words);
    assert_eq!(html.text, "");
    assert!(html.sections.is_empty());
}

#[test]
fn zero_section_tokens_is_treated_as_one() {
    let document = split_document("a b", Format::Plain, 0, &words);
    assert_eq!(split(&document, 1, &words), [("a", vec![]), ("b", vec![])]);
}

#[test]
fn caller_sections_are_converted_from_code_points_to_bytes() {
    let text = "héllo wörld 😀!";
    let boundaries = [
        (0, 5, "Greeting".to_string()),
        (5, 6, String::new()),
        (6, 11, String::new()),
        (12, 14, "End".to_string()),
        (14, 14, String::new()),
    ];
    let sections = caller_sections(text, &boundaries).expect("valid boundaries");
    let found: Vec<(&str, &[String])> = sections
        .iter()
        .map(|s| (&text[s.start..s.end], s.heading_path.as_slice()))
        .collect();
    assert_eq!(
        found,
        [
            ("héllo", &["Greeting".to_string()][..]),
            (" ", &[][..]),
            ("wörld", &[][..]),
            ("😀!", &["End".to_string()][..]),
            ("", &[][..]),
        ]
    );
    assert_eq!(caller_sections("", &[]), Ok(Vec::new()));
    assert_eq!(
        caller_sections("", &[(0, 0, String::new())]),
        Ok(vec![SectionSpan {
            start: 0,
            end: 0,
            heading_path: Vec::new()
        }])
    );
}

#[test]
fn caller_section_errors_name_the_index_and_the_allowed_range() {
    let text = "añb"; // 3 code points
    let out_of_range = caller_sections(text, &[(0, 1, String::new()), (1, 4, String::new())]);
    let error = out_of_range.expect_err("end past the text");
    assert_eq!(
        error,
        SectionError::OutOfRange {
            index: 1,
            start: 1,
            end: 4,
            text_chars: 3
        }
    );
    assert_eq!(
        error.to_string(),
        "section 1: range 1..4 is out of range; start and end must lie in 0..=3 (the text has 3 \
         code points)"
    );

    let reversed = caller_sections(text, &[(2, 1, String::new())]).expect_err("start > end");
    assert_eq!(
        reversed.to_string(),
        "section 0: start 2 is after end 1; start must be <= end"
    );

    let overlapping = caller_sections(text, &[(0, 2, String::new()), (1, 3, String::new())])
        .expect_err("overlap");
    assert_eq!(
        overlapping.to_string(),
        "section 1: start 1 overlaps or precedes section 0, which ends at 2; sections must be in \
         order and not overlap, so start must lie in 2..=3"
    );

    let unordered = caller_sections(text, &[(2, 3, String::new()), (0, 1, String::new())])
        .expect_err("unordered");
    assert!(matches!(
        unordered,
        SectionError::OverlapsPrevious {
            index: 1,
            start: 0,
            previous_index: 0,
            previous_end: 3,
            ..
        }
    ));

    let huge = caller_sections(text, &[(u64::MAX, u64::MAX, String::new())]).expect_err("huge");
    assert!(matches!(huge, SectionError::OutOfRange { index: 0, .. }));
}

#[test]
fn hostile_inputs_do_not_panic_and_keep_the_invariants() {
    let long_line = "word ".repeat(200_000);
    let no_spaces = "x".repeat(1 << 20);
    let nested_list: String = (0..1_000)
        .map(|depth| format!("{}- item\n", "  ".repeat(depth)))
        .collect();
    let nested_quotes = format!("{}deep\n", ">".repeat(10_000));
    let headings: String = (0..3_000)
        .map(|i| format!("{} h{i}\n", "#".repeat(i % 7 + 1)))
        .collect();
    let garbage: String = (0..100_000u32)
        .map(|i| char::from_u32((i.wrapping_mul(2_654_435_761)) % 0x11_0000).unwrap_or('\u{0}'))
        .collect();
    let html_unclosed = "<div><p><b><table><tr><td><h1>x".repeat(2_000);
    let inputs: [&str; 9] = [
        "\u{0}\u{0}# \u{0}\n\n\u{0}",
        &long_line,
        &no_spaces,
        &nested_list,
        &nested_quotes,
        &headings,
        &garbage,
        &html_unclosed,
        "<<<>>></p></p><h1></h2><script><!--",
    ];
    for input in inputs {
        for format in [Format::Plain, Format::Markdown, Format::Html] {
            for (limit, counter) in [(64usize, &words as &dyn Fn(&str) -> usize), (64, &chars)] {
                let document = split_document(input, format, limit, counter);
                if let Err(broken) =
                    check_section_invariants(&document.text, &document.sections, limit, counter)
                {
                    panic!("{format:?} input of {} bytes: {broken}", input.len());
                }
            }
        }
    }
}

#[test]
fn minilm_tokenizer_limit_holds_on_real_markdown() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/minilm/tokenizer.json"
    );
    let mut tokenizer = tokenizers::Tokenizer::from_file(path).expect("MiniLM tokenizer.json");
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .expect("turning truncation off");
    let count = |text: &str| {
        tokenizer
            .encode(text, false)
            .map(|encoding| encoding.len())
            .unwrap_or(usize::MAX)
    };
    let readme = include_str!("mod.rs");
    let markdown = format!(
        "# Lathe\n\nA retrieval server.\n\n## Sectioning\n\n{readme}\n\n## Ünïcödé 🦀\n\n{}",
        "Schöne Grüße aus Köln, 東京 und القاهرة. ".repeat(200)
    );
    for limit in [8, 64, 256] {
        for format in [Format::Markdown, Format::Plain, Format::Html] {
            let document = split_document(&markdown, format, limit, &count);
            if let Err(broken) =
                check_section_invariants(&document.text, &document.sections, limit, &count)
            {
                panic!("{format:?} limit {limit}: {broken}");
            }
            assert!(document.sections.len() > 1);
        }
    }
    let document = split_document(&markdown, Format::Markdown, 256, &count);
    let paths: Vec<&[String]> = document
        .sections
        .iter()
        .map(|s| s.heading_path.as_slice())
        .collect();
    assert_eq!(paths[0], ["Lathe".to_string()]);
    assert!(paths.contains(&&["Lathe".to_string(), "Ünïcödé 🦀".to_string()][..]));
}

/// Text fragments that exercise the readers: heading markers, fences, setext underlines, tags,
/// entities, blank lines, sentence ends, combining marks, NUL and arbitrary chars.
fn document_text() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        Just("# ".to_string()),
        Just("## ".to_string()),
        Just("###### ".to_string()),
        Just("\n".to_string()),
        Just("\n\n".to_string()),
        Just(" \t \n".to_string()),
        Just("```\n".to_string()),
        Just("===\n".to_string()),
        Just("---\n".to_string()),
        Just("> ".to_string()),
        Just("- ".to_string()),
        Just("`code`".to_string()),
        Just("*em*".to_string()),
        Just("[link](u)".to_string()),
        Just("<h1>".to_string()),
        Just("</h1>".to_string()),
        Just("<h3>".to_string()),
        Just("<p>".to_string()),
        Just("</p>".to_string()),
        Just("<pre>".to_string()),
        Just("</pre>".to_string()),
        Just("<script>".to_string()),
        Just("</script>".to_string()),
        Just("<br>".to_string()),
        Just("<td>".to_string()),
        Just("&amp;".to_string()),
        Just("&nbsp;".to_string()),
        Just(". ".to_string()),
        Just("e\u{301}".to_string()),
        Just("\u{0}".to_string()),
        "[a-z]{1,12}".prop_map(|s| s),
        any::<char>().prop_map(String::from),
    ];
    prop_oneof![
        prop::collection::vec(fragment, 0..120).prop_map(|fragments| fragments.concat()),
        any::<String>(),
    ]
}

/// The budget tokenizer with its local spans hidden: every range is counted.
struct CountingOnly<'t>(&'t crate::tokenizer::BudgetTokenizer);

impl TokenCounter for CountingOnly<'_> {
    fn count(&self, text: &str) -> usize {
        self.0.count(text)
    }

    fn token_starts(&self, text: &str) -> Option<Vec<u32>> {
        TokenCounter::token_starts(self.0, text)
    }

    fn least_tokens(&self, text: &str) -> usize {
        TokenCounter::least_tokens(self.0, text)
    }
}

fn minilm_budget_tokenizer() -> &'static crate::tokenizer::BudgetTokenizer {
    static LOADED: std::sync::OnceLock<crate::tokenizer::BudgetTokenizer> =
        std::sync::OnceLock::new();
    LOADED.get_or_init(|| {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        crate::tokenizer::BudgetTokenizer::resolve("minilm", &models).expect("minilm")
    })
}

/// Document text with what bounding and the fast tokenizer path treat specially: runs of
/// whitespace and words longer than 128 bytes, control and zero-width chars, CJK, accents.
fn tokenizer_text() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        document_text(),
        Just(" ".repeat(200)),
        Just("\n".repeat(150)),
        Just("x".repeat(300)),
        Just("\u{200b}".repeat(60)),
        Just("\u{1}\u{7f}".repeat(80)),
        Just("内核文档的使用，".repeat(30)),
        Just("naïve café, “quoted” — ok… ".to_string()),
        Just("end.Next sentence!Another one? yes".to_string()),
        "[a-zA-Z0-9 .,\n]{0,400}".prop_map(|s| s),
    ];
    prop::collection::vec(fragment, 0..12).prop_map(|fragments| fragments.concat())
}

fn format_strategy() -> impl Strategy<Value = Format> {
    prop_oneof![
        Just(Format::Plain),
        Just(Format::Markdown),
        Just(Format::Html)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sections_keep_their_invariants(
        text in document_text(),
        format in format_strategy(),
        limit in 1usize..64,
        use_chars in any::<bool>(),
    ) {
        let counter: &dyn Fn(&str) -> usize = if use_chars { &chars } else { &words };
        let document = split_document(&text, format, limit, counter);
        if format != Format::Html {
            prop_assert_eq!(document.text.as_ref(), text.as_str());
        }
        let checked = check_section_invariants(&document.text, &document.sections, limit, counter);
        prop_assert!(checked.is_ok(), "{:?}", checked);
        // Deterministic.
        let again = split_document(&text, format, limit, counter);
        prop_assert_eq!(&again.sections, &document.sections);
        prop_assert_eq!(again.text, document.text);
    }

    #[test]
    fn counts_derived_from_one_tokenization_cut_exactly_as_counting_every_range(
        text in tokenizer_text(),
        format in format_strategy(),
        limit in 1usize..200,
    ) {
        let budget = minilm_budget_tokenizer();
        let derived = split_document(&text, format, limit, budget);
        let counted = split_document(&text, format, limit, &CountingOnly(budget));
        prop_assert_eq!(&derived.sections, &counted.sections);
        let count = |text: &str| budget.count(text);
        let checked = check_section_invariants(&derived.text, &derived.sections, limit, &count);
        prop_assert!(checked.is_ok(), "{:?}", checked);
    }

    #[test]
    fn valid_caller_sections_round_trip_to_the_same_text(
        text in any::<String>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let text_chars = text.chars().count() as u64;
        let mut positions: Vec<u64> =
            cuts.iter().map(|cut| cut.index(text_chars as usize + 1) as u64).collect();
        positions.sort_unstable();
        let boundaries: Vec<(u64, u64, String)> =
            positions.chunks_exact(2).map(|pair| (pair[0], pair[1], String::new())).collect();
        let sections = caller_sections(&text, &boundaries).expect("sorted, in range");
        prop_assert_eq!(sections.len(), boundaries.len());
        for (section, (start, end, _)) in sections.iter().zip(&boundaries) {
            let expected: String =
                text.chars().skip(*start as usize).take((end - start) as usize).collect();
            prop_assert_eq!(&text[section.start..section.end], expected.as_str());
        }
    }
}

/// The budget tokenizer with a tally of the bytes it was given: the work sectioning does.
struct TalliedTokenizer {
    tokenizer: crate::tokenizer::BudgetTokenizer,
    bytes: std::cell::Cell<usize>,
}

impl TokenCounter for TalliedTokenizer {
    fn count(&self, text: &str) -> usize {
        self.bytes.set(self.bytes.get() + text.len());
        self.tokenizer.count(text)
    }

    fn token_starts(&self, text: &str) -> Option<Vec<u32>> {
        self.bytes.set(self.bytes.get() + text.len());
        self.tokenizer.token_starts(text)
    }

    fn least_tokens(&self, text: &str) -> usize {
        self.tokenizer.least_tokens(text)
    }
}

/// A word of hundreds of kilobytes (one letter, one emoji, one CJK char) is cut into sections of
/// at most the limit by the bounded count, each at most `limit * MAX_BYTES_PER_TOKEN` bytes, in
/// about two passes over the text (its offsets, then one count per section; not the ~20 counts
/// per section of a search, and the text too big to fit is not counted whole), with every
/// invariant kept.
#[test]
fn a_huge_word_is_cut_honestly_in_a_few_passes() {
    use crate::tokens::MAX_BYTES_PER_TOKEN;
    let models = crate::tokenizer::tests::models_dir();
    for name in ["minilm", "cl100k_base"] {
        for unit in ["b", "😀", "東"] {
            let text = format!("zebra {} tail", unit.repeat((256 << 10) / unit.len()));
            let counter = TalliedTokenizer {
                tokenizer: crate::tokenizer::BudgetTokenizer::resolve(name, &models).unwrap(),
                bytes: std::cell::Cell::new(0),
            };
            let limit = 256;
            let document = split_document(&text, Format::Plain, limit, &counter);
            let counted = counter.bytes.get();
            let count = |piece: &str| counter.tokenizer.count(piece);
            if let Err(broken) =
                check_section_invariants(&document.text, &document.sections, limit, &count)
            {
                panic!("{name} {unit}: {broken}");
            }
            for section in &document.sections {
                assert!(
                    section.end - section.start <= limit * MAX_BYTES_PER_TOKEN,
                    "{name} {unit}: a section of {} bytes",
                    section.end - section.start
                );
            }
            assert!(
                counted <= 3 * text.len(),
                "{name} {unit}: counted {counted} bytes for a text of {}",
                text.len()
            );
        }
    }
}
