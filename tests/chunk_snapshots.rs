//! Snapshots of real inputs cut with the real MiniLM tokenizer; the contract is checked before
//! every snapshot, so a snapshot can only pin behaviour that is already valid.

use std::fmt::Write;

use lathe::chunk::{
    check_invariants, chunk_section, sentences, ChunkOptions, SemanticInput, SemanticThreshold,
    Strategy, Unit,
};
use lathe::tokens::TokenOffsets;
use tokenizers::Tokenizer;

fn tokenizer() -> Tokenizer {
    let mut tokenizer = Tokenizer::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/minilm/tokenizer.json"
    ))
    .expect("MiniLM tokenizer.json");
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).expect("no truncation");
    tokenizer
}

fn render(name: &str, strategy: Strategy, max_size: u32, overlap: u32, unit: Unit) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("test input");
    let encoding = tokenizer().encode(text.as_str(), false).expect("encodes");
    let tokens = TokenOffsets::from_spans(&text, encoding.get_offsets().iter().copied());
    let options = ChunkOptions {
        strategy,
        max_size,
        overlap,
        unit,
        separators: None,
    };
    let mut sentence_ranges = Vec::new();
    sentences(&text, &mut sentence_ranges);
    // A fixed similarity pattern: a topic shift every fourth sentence.
    let similarities: Vec<f32> = (0..sentence_ranges.len().saturating_sub(1))
        .map(|i| if i % 4 == 3 { 0.2 } else { 0.8 })
        .collect();
    let input = SemanticInput {
        sentences: &sentence_ranges,
        similarities: &similarities,
        threshold: SemanticThreshold::Percentile(95.0),
        min_tokens: 8,
    };
    let mut spans = Vec::new();
    chunk_section(&text, &tokens, &options, Some(&input), &mut spans);
    check_invariants(&text, &tokens, &options, &spans)
        .unwrap_or_else(|problem| panic!("{problem}"));
    let mut rendered = String::new();
    for span in &spans {
        let _ = write!(
            rendered,
            "[{}..{} {} tok {:?}",
            span.start, span.end, span.token_count, span.strategy
        );
        if let Some((a, b)) = span.header {
            let _ = write!(rendered, " header={:?}", &text[a as usize..b as usize]);
        }
        if let Some((a, b)) = span.heading {
            let _ = write!(rendered, " heading={:?}", &text[a as usize..b as usize]);
        }
        let _ = writeln!(
            rendered,
            "]\n{}\n",
            &text[span.start as usize..span.end as usize]
        );
    }
    rendered
}

macro_rules! snapshot {
    ($test:ident, $file:literal, $strategy:expr, $max:expr, $overlap:expr, $unit:expr) => {
        #[test]
        fn $test() {
            insta::assert_snapshot!(render($file, $strategy, $max, $overlap, $unit));
        }
    };
}

snapshot!(
    markdown_structure,
    "guide.md",
    Strategy::Structure,
    48,
    0,
    Unit::Tokens
);
snapshot!(
    markdown_auto,
    "guide.md",
    Strategy::Auto,
    64,
    8,
    Unit::Tokens
);
snapshot!(
    markdown_recursive,
    "guide.md",
    Strategy::Recursive,
    48,
    8,
    Unit::Tokens
);
snapshot!(csv_auto, "cities.csv", Strategy::Auto, 64, 0, Unit::Tokens);
snapshot!(rust_auto, "packer.rs", Strategy::Auto, 80, 0, Unit::Tokens);
snapshot!(python_auto, "stats.py", Strategy::Auto, 48, 0, Unit::Tokens);
snapshot!(
    chinese_sentence,
    "chinese.txt",
    Strategy::Sentence,
    48,
    16,
    Unit::Tokens
);
snapshot!(
    chinese_auto,
    "chinese.txt",
    Strategy::Auto,
    64,
    0,
    Unit::Tokens
);
snapshot!(
    chinese_fixed_chars,
    "chinese.txt",
    Strategy::Fixed,
    60,
    10,
    Unit::Chars
);
snapshot!(
    hindi_sentence,
    "hindi.txt",
    Strategy::Sentence,
    40,
    12,
    Unit::Tokens
);
snapshot!(
    hindi_semantic,
    "hindi.txt",
    Strategy::Semantic,
    64,
    0,
    Unit::Tokens
);
snapshot!(
    hindi_fixed_words,
    "hindi.txt",
    Strategy::Fixed,
    20,
    5,
    Unit::Words
);
