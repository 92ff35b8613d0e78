//! Shared by the sectioning fuzz targets: the first input byte picks the section limit (1..=64)
//! and the token counter (whitespace words or chars); the rest, made valid UTF-8 lossily, is the
//! document. Every guarantee of `split_document` is asserted.

use lathe_text::sections::{check_section_invariants, split_document, Format};

fn whitespace_words(text: &str) -> usize {
    text.split_whitespace().count()
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

pub fn check(data: &[u8], format: Format) {
    let Some((&control, document_bytes)) = data.split_first() else {
        return;
    };
    let section_tokens = usize::from(control & 0x3f) + 1;
    let count_tokens: &dyn Fn(&str) -> usize = if control & 0x40 == 0 {
        &whitespace_words
    } else {
        &chars
    };
    let text = String::from_utf8_lossy(document_bytes);
    let document = split_document(&text, format, section_tokens, count_tokens);
    if format != Format::Html {
        assert_eq!(document.text.as_ref(), text.as_ref());
    }
    if let Err(broken) =
        check_section_invariants(&document.text, &document.sections, section_tokens, count_tokens)
    {
        panic!("{format:?}, limit {section_tokens}: {broken}");
    }
}
