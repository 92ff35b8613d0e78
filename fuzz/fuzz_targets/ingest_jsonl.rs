//! JSONL ingest: any bytes, read as a .jsonl file, either fail with a message naming a line or give
//! documents that the request conversion then accepts or rejects with a named field, never a panic.

#![no_main]

use lathe::api::convert::documents_from_proto;
use lathe::api::proto::DocumentFormat;
use lathe_tools::cli::documents_from_jsonl;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match documents_from_jsonl(text, DocumentFormat::Plain) {
        Err(error) => {
            let message = format!("{error:#}");
            assert!(message.contains("line "), "error names no line: {message}");
        }
        Ok(documents) => {
            let count = documents.len();
            if let Ok(inputs) = documents_from_proto(documents) {
                assert_eq!(inputs.len(), count);
            }
        }
    }
});
