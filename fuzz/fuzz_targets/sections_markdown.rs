#![no_main]

mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(data, lathe_text::sections::Format::Markdown));
