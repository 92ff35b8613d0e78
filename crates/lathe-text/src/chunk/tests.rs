//! Property tests: every strategy keeps the contract (`check_invariants`) for any text and any
//! valid settings, under three fast tokenizers (whitespace runs, single chars, and a byte-level
//! one whose tokens split chars and are widened to them), and is deterministic.

use std::ops::Range;
use std::sync::Arc;

use proptest::prelude::*;

use super::{
    check_invariants, chunk_section, chunk_section_with_sentences, sentences, ChunkOptions,
    ChunkSpan, SemanticInput, SemanticThreshold, Unit,
};
use crate::tokens::TokenOffsets;

/// Each non-whitespace char is one token.
fn char_tokens(text: &str) -> TokenOffsets {
    TokenOffsets::from_spans(
        text,
        text.char_indices()
            .filter(|(_, c)| !c.is_whitespace())
            .map(|(i, c)| (i, i + c.len_utf8())),
    )
}

/// Each byte of a non-whitespace char is one token (like a byte-level BPE at its worst): the
/// spans get widened to the char, so a char of n bytes holds n tokens.
fn byte_tokens(text: &str) -> TokenOffsets {
    TokenOffsets::from_spans(
        text,
        text.char_indices()
            .filter(|(_, c)| !c.is_whitespace())
            .flat_map(|(i, c)| (i..i + c.len_utf8()).map(|b| (b, b + 1))),
    )
}

const FRAGMENTS: &[&str] = &[
    "Hello",
    "world",
    " ",
    "  ",
    "\n",
    "\n\n",
    ". ",
    "! ",
    "? ",
    ", ",
    "; ",
    ": ",
    "Dr. ",
    "U.S. ",
    "3.14",
    "e.g. ",
    "今天很好。",
    "你好吗？",
    "，",
    "、",
    "यह एक वाक्य है। ",
    "॥",
    "هل أنت بخير؟ ",
    "۔",
    "วันนี้อากาศดี ",
    "မင်္ဂလာပါ။",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "e\u{301}\u{302}",
    "\u{200f}",
    "שלום ",
    "# Title\n",
    "## Sub\n",
    "```rust\nfn main() {}\n```\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",
    "- item\n",
    "1. first\n",
    "> quote\n",
    "a,b,c\n",
    "1,2,3\n",
    "x\ty\n",
    "fn f() {\n",
    "}\n",
    "def g():\n",
    "    return 1\n",
    "<p>html</p>\n",
    "\t",
    "—",
    "supercalifragilistic",
    "\r\n",
];

fn text_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(FRAGMENTS), 0..80).prop_map(|parts| parts.concat()),
        1 => any::<String>(),
        1 => "[a-z .,\n]{0,300}",
    ]
}

fn strategy_strategy() -> impl Strategy<Value = super::Strategy> {
    prop::sample::select(vec![
        super::Strategy::Fixed,
        super::Strategy::Sentence,
        super::Strategy::Recursive,
        super::Strategy::Structure,
        super::Strategy::Auto,
        super::Strategy::Semantic,
        super::Strategy::Csv,
        super::Strategy::Code,
    ])
}

fn options_strategy() -> impl Strategy<Value = ChunkOptions> {
    (
        strategy_strategy(),
        1u32..40,
        0u32..40,
        prop::sample::select(vec![Unit::Tokens, Unit::Words, Unit::Chars]),
        prop::option::of(prop::collection::vec(
            prop::sample::select(vec!["\n", " ", ",", "", "ab", "。"]),
            0..4,
        )),
    )
        .prop_map(
            |(strategy, max_size, overlap, unit, separators)| ChunkOptions {
                strategy,
                max_size,
                overlap: overlap % max_size,
                unit,
                separators: separators.map(|list| {
                    list.into_iter()
                        .map(String::from)
                        .collect::<Vec<_>>()
                        .into()
                }),
            },
        )
}

fn threshold_strategy() -> impl Strategy<Value = SemanticThreshold> {
    prop_oneof![
        (0f32..100.0).prop_map(SemanticThreshold::Percentile),
        (0f32..4.0).prop_map(SemanticThreshold::StdDev),
        (0f32..3.0).prop_map(SemanticThreshold::Interquartile),
        (0f32..100.0).prop_map(SemanticThreshold::Gradient),
    ]
}

/// Runs the chunker twice (determinism) and checks the contract.
pub(super) fn run_and_check(
    text: &str,
    tokens: &TokenOffsets,
    options: &ChunkOptions,
    semantic: Option<&SemanticInput>,
) -> Vec<ChunkSpan> {
    let mut first = Vec::new();
    chunk_section(text, tokens, options, semantic, &mut first);
    if let Err(problem) = check_invariants(text, tokens, options, &first) {
        panic!("{problem}\noptions: {options:?}\ntext: {text:?}\nspans: {first:?}");
    }
    let mut second = Vec::new();
    chunk_section(text, tokens, options, semantic, &mut second);
    assert_eq!(first, second, "not deterministic");
    // Sentences known beforehand (as the server's section cache has them) change nothing.
    let mut known = Vec::new();
    sentences(text, &mut known);
    let mut third = Vec::new();
    chunk_section_with_sentences(text, tokens, &known, options, semantic, &mut third);
    assert_eq!(first, third, "known sentences changed the chunks");
    first
}

fn similarities_for(count: usize, seed: &[f32]) -> Vec<f32> {
    (0..count.saturating_sub(1))
        .map(|i| seed.get(i % seed.len().max(1)).copied().unwrap_or(0.5))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_strategy_keeps_the_contract(
        text in text_strategy(),
        options in options_strategy(),
        tokenizer in 0usize..3,
        threshold in threshold_strategy(),
        seed in prop::collection::vec(-1f32..1.0, 1..8),
        min_tokens in 0u32..20,
    ) {
        let tokens = match tokenizer {
            0 => TokenOffsets::whitespace(&text),
            1 => char_tokens(&text),
            _ => byte_tokens(&text),
        };
        let mut sentence_ranges: Vec<Range<u32>> = Vec::new();
        sentences(&text, &mut sentence_ranges);
        let similarities = similarities_for(sentence_ranges.len(), &seed);
        let input = SemanticInput { sentences: &sentence_ranges, similarities: &similarities, threshold, min_tokens };
        run_and_check(&text, &tokens, &options, Some(&input));
    }

    #[test]
    fn sentences_cover_every_visible_char_in_order(text in text_strategy()) {
        let mut ranges = Vec::new();
        sentences(&text, &mut ranges);
        let mut previous_end = 0;
        for range in &ranges {
            prop_assert!(range.start >= previous_end && range.start < range.end);
            let piece = &text[range.start as usize..range.end as usize];
            prop_assert_eq!(piece.trim(), piece);
            previous_end = range.end;
        }
        let covered: usize = ranges.iter().map(|r| text[r.start as usize..r.end as usize].chars().filter(|c| !c.is_whitespace()).count()).sum();
        prop_assert_eq!(covered, text.chars().filter(|c| !c.is_whitespace()).count());
    }
}

fn all_options(max_size: u32, overlap: u32) -> Vec<ChunkOptions> {
    let mut list = Vec::new();
    for strategy in [
        super::Strategy::Fixed,
        super::Strategy::Sentence,
        super::Strategy::Recursive,
        super::Strategy::Structure,
        super::Strategy::Auto,
        super::Strategy::Semantic,
        super::Strategy::Csv,
        super::Strategy::Code,
    ] {
        for unit in [Unit::Tokens, Unit::Words, Unit::Chars] {
            list.push(ChunkOptions {
                strategy,
                max_size,
                overlap,
                unit,
                separators: None,
            });
        }
    }
    list
}

#[test]
fn hard_inputs_keep_the_contract() {
    let huge_word = "x".repeat(1 << 20);
    let huge_cjk = "字".repeat(20_000);
    let inputs = [
        String::new(),
        " \n\t  \u{3000}".to_string(),
        huge_word,
        "y".repeat(1 << 16),
        huge_cjk,
        "e\u{301}\u{302}\u{303}".repeat(50),
        "👨‍👩‍👧‍👦🇫🇷👍🏽".repeat(40),
        "مرحبا بالعالم. هذا نص عربي؟ نعم۔ ".repeat(30),
        "Mixed English, 中文，हिन्दी। and עברית. ".repeat(30),
    ];
    for text in &inputs {
        // The 1 MB word runs as one token; a 64 KiB word covers the many-token case (a million
        // tokens would only add minutes of unoptimised test time).
        let mut tokenizers = vec![TokenOffsets::whitespace(text)];
        if text.len() < 200_000 {
            tokenizers.push(char_tokens(text));
            tokenizers.push(byte_tokens(text));
        }
        for tokens in tokenizers {
            for options in all_options(7, 3) {
                run_and_check(text, &tokens, &options, None);
            }
        }
    }
}

#[test]
fn fixed_token_windows_overlap_as_asked() {
    let text = "a b c d e f g h";
    let tokens = TokenOffsets::whitespace(text);
    let options = ChunkOptions {
        strategy: super::Strategy::Fixed,
        max_size: 3,
        overlap: 1,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces, ["a b c", "c d e", "e f g", "g h"]);
}

#[test]
fn fixed_word_and_char_windows() {
    let text = "one, two three. four five";
    let tokens = TokenOffsets::whitespace(text);
    let words = ChunkOptions {
        strategy: super::Strategy::Fixed,
        max_size: 2,
        overlap: 0,
        unit: Unit::Words,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &words, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces, ["one, two", "three. four", "five"]);
    let chars = ChunkOptions {
        unit: Unit::Chars,
        max_size: 10,
        overlap: 2,
        ..words
    };
    let spans = run_and_check(text, &tokens, &chars, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces, ["one, two t", "three. fo", "four five"]);
}

#[test]
fn sentence_overlap_repeats_whole_trailing_sentences() {
    let text = "Ab cd. Ef gh. Ij kl. Mn op.";
    let tokens = TokenOffsets::whitespace(text);
    let options = ChunkOptions {
        strategy: super::Strategy::Sentence,
        max_size: 4,
        overlap: 2,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces, ["Ab cd. Ef gh.", "Ef gh. Ij kl.", "Ij kl. Mn op."]);
}

#[test]
fn recursive_prefers_paragraphs_then_sentences() {
    let text = "One two three.\n\nFour five. Six seven eight nine.";
    let tokens = TokenOffsets::whitespace(text);
    let options = ChunkOptions {
        strategy: super::Strategy::Recursive,
        max_size: 4,
        overlap: 0,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(
        pieces,
        ["One two three.", "Four five.", "Six seven eight nine."]
    );
    let custom = ChunkOptions {
        separators: Some(Arc::from(vec![" ".to_string()])),
        ..options
    };
    let spans = run_and_check(text, &tokens, &custom, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(
        pieces,
        ["One two three.\n\nFour", "five. Six seven eight", "nine."]
    );
}

#[test]
fn semantic_breaks_at_low_similarity_and_falls_back_without_input() {
    let text = "Cats purr. Cats nap. Stocks fell. Bonds rose.";
    let tokens = TokenOffsets::whitespace(text);
    let mut sentence_ranges = Vec::new();
    sentences(text, &mut sentence_ranges);
    assert_eq!(sentence_ranges.len(), 4);
    let similarities = [0.9, 0.1, 0.8];
    let input = SemanticInput {
        sentences: &sentence_ranges,
        similarities: &similarities,
        threshold: SemanticThreshold::default(),
        min_tokens: 0,
    };
    let options = ChunkOptions {
        strategy: super::Strategy::Semantic,
        max_size: 100,
        overlap: 0,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, Some(&input));
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces, ["Cats purr. Cats nap.", "Stocks fell. Bonds rose."]);
    assert!(spans
        .iter()
        .all(|s| s.strategy == super::Strategy::Semantic));
    let spans = run_and_check(text, &tokens, &options, None);
    assert!(spans
        .iter()
        .all(|s| s.strategy == super::Strategy::Sentence));
    // min_tokens merges the small groups back together when the union fits.
    let merged = SemanticInput {
        min_tokens: 5,
        ..input
    };
    let spans = run_and_check(text, &tokens, &options, Some(&merged));
    assert_eq!(spans.len(), 1);
}

#[test]
fn structure_starts_chunks_at_headings_and_repeats_table_headers() {
    let text =
        "# A\n\nIntro text.\n\n## B\n\n| h1 | h2 |\n|----|----|\n| a | b |\n| c | d |\n| e | f |\n";
    let tokens = TokenOffsets::whitespace(text);
    let options = ChunkOptions {
        strategy: super::Strategy::Structure,
        max_size: 12,
        overlap: 0,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(pieces[0], "# A\n\nIntro text.");
    assert_eq!(pieces[1], "## B");
    assert!(pieces[2].starts_with("| h1 | h2 |"));
    let continuation = spans.last().expect("a continuation chunk");
    let header = continuation.header.expect("the header is reported");
    assert_eq!(
        &text[header.0 as usize..header.1 as usize],
        "| h1 | h2 |\n|----|----|"
    );
    let heading = continuation.heading.expect("the heading is reported");
    assert_eq!(&text[heading.0 as usize..heading.1 as usize], "## B");
}

#[test]
fn auto_routes_by_content() {
    let cases = [
        ("name,age\nann,3\nbob,4\ncid,5\n", super::Strategy::Csv),
        (
            "fn main() {\n    let x = 1;\n}\n\nfn other() {\n    x();\n}\n",
            super::Strategy::Code,
        ),
        (
            "def f(x):\n    return x\n\nclass A:\n    pass\n",
            super::Strategy::Code,
        ),
        (
            "# Title\n\nSome text.\n\n- a\n- b\n",
            super::Strategy::Structure,
        ),
        (
            "Plain prose. It has sentences, some with commas.",
            super::Strategy::Sentence,
        ),
    ];
    for (text, expected) in cases {
        let tokens = TokenOffsets::whitespace(text);
        let options = ChunkOptions {
            strategy: super::Strategy::Auto,
            max_size: 50,
            overlap: 0,
            unit: Unit::Tokens,
            separators: None,
        };
        let spans = run_and_check(text, &tokens, &options, None);
        assert!(
            spans.iter().all(|s| s.strategy == expected),
            "{text:?} gave {spans:?}"
        );
    }
}

#[test]
fn code_chunks_keep_functions_whole_with_their_comments() {
    let text = "use x;\n\n/// Doc.\nfn a() {\n    one();\n}\n\n#[test]\nfn b() {\n    two();\n}\n";
    let tokens = TokenOffsets::whitespace(text);
    let options = ChunkOptions {
        strategy: super::Strategy::Code,
        max_size: 8,
        overlap: 0,
        unit: Unit::Tokens,
        separators: None,
    };
    let spans = run_and_check(text, &tokens, &options, None);
    let pieces: Vec<&str> = spans
        .iter()
        .map(|s| &text[s.start as usize..s.end as usize])
        .collect();
    assert_eq!(
        pieces,
        [
            "use x;",
            "/// Doc.\nfn a() {\n    one();\n}",
            "#[test]\nfn b() {\n    two();\n}"
        ]
    );
}

#[test]
fn every_strategy_name_reads_back_as_its_strategy_and_other_names_do_not() {
    for strategy in super::Strategy::ALL {
        assert_eq!(
            super::Strategy::from_name(strategy.name()),
            Some(strategy),
            "{strategy:?}"
        );
    }
    // The stored names of collections made before the codec moved here.
    let stored = [
        "fixed",
        "sentence",
        "recursive",
        "structure",
        "auto",
        "semantic",
        "csv",
        "code",
    ];
    let names: Vec<&str> = super::Strategy::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(names, stored);
    for other in ["", "Fixed", "FIXED", "chunk_strategy_fixed", "unspecified"] {
        assert_eq!(super::Strategy::from_name(other), None, "{other:?}");
    }
}
