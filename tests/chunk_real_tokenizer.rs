//! The contract under the real MiniLM (WordPiece) tokenizer, and what re-tokenizing a chunk's text
//! on its own gives compared with its `token_count`.

use std::sync::OnceLock;

use lathe::chunk::{check_invariants, chunk_section, ChunkOptions, Strategy, Unit};
use lathe::tokens::TokenOffsets;
use proptest::prelude::*;
use tokenizers::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let mut tokenizer = Tokenizer::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/models/minilm/tokenizer.json"
        ))
        .expect("MiniLM tokenizer.json");
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).expect("no truncation");
        tokenizer
    })
}

fn offsets(text: &str) -> TokenOffsets {
    let encoding = tokenizer().encode(text, false).expect("encodes");
    TokenOffsets::from_spans(text, encoding.get_offsets().iter().copied())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn contract_holds_with_minilm(
        text in prop_oneof![any::<String>(), "[a-zA-Z0-9 .,;:!?\n#|`-]{0,400}", "(\\PC{1,12}[ .。，\n]){0,40}"],
        strategy in 0..Strategy::ALL.len(),
        max_size in 1u32..64,
        overlap in 0u32..64,
        unit in prop::sample::select(vec![Unit::Tokens, Unit::Words, Unit::Chars]),
    ) {
        let tokens = offsets(&text);
        let options = ChunkOptions { strategy: Strategy::ALL[strategy], max_size, overlap: overlap % max_size, unit, separators: None };
        let mut spans = Vec::new();
        chunk_section(&text, &tokens, &options, None, &mut spans);
        if let Err(problem) = check_invariants(&text, &tokens, &options, &spans) {
            panic!("{problem}\n{options:?}\n{text:?}\n{spans:?}");
        }
    }
}

/// Re-tokenizes every chunk of the test inputs on its own and tallies chunks whose independent
/// count differs from `token_count` (the count inside the section's single tokenization).
#[test]
fn independent_retokenization_compared_with_token_count() {
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let mut texts: Vec<String> = std::fs::read_dir(folder)
        .expect("tests/data")
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .collect();
    // Plus the benchmark corpus when it has been fetched (scripts/fetch-debian-docs.sh).
    if let Ok(corpus) = std::env::var("LATHE_DEBIAN_DOCS") {
        if let Ok(entries) = std::fs::read_dir(corpus) {
            texts.extend(
                entries
                    .take(40)
                    .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()),
            );
        }
    }
    let mut spans = Vec::new();
    for (strategy, max_size) in Strategy::ALL.into_iter().flat_map(|s| [(s, 16), (s, 64)]) {
        let (mut chunks, mut more, mut fewer, mut worst_excess) = (0usize, 0usize, 0usize, 0i64);
        let mut example = String::new();
        for text in &texts {
            let tokens = offsets(text);
            let options = ChunkOptions {
                strategy,
                max_size,
                overlap: 4,
                unit: Unit::Tokens,
                separators: None,
            };
            chunk_section(text, &tokens, &options, None, &mut spans);
            check_invariants(text, &tokens, &options, &spans).unwrap_or_else(|p| panic!("{p}"));
            for span in &spans {
                let piece = &text[span.start as usize..span.end as usize];
                let independent = tokenizer().encode(piece, false).expect("encodes").len() as i64;
                let excess = independent - i64::from(span.token_count);
                chunks += 1;
                if excess > 0 {
                    more += 1;
                    if excess > worst_excess {
                        worst_excess = excess;
                        example = piece.chars().take(60).collect();
                    }
                } else if excess < 0 {
                    fewer += 1;
                }
            }
        }
        // Fixed windows cut mid-word by design; every other strategy backs its token-level cuts
        // off to word starts, and here none re-tokenizes to more tokens.
        if strategy != Strategy::Fixed {
            assert_eq!(more, 0, "{strategy:?} max {max_size}: {example:?}");
        }
        println!(
            "{strategy:?} max {max_size}: {chunks} chunks, {more} re-tokenize to MORE tokens (worst +{worst_excess}), \
             {fewer} to fewer; worst starts {example:?}"
        );
    }
}
