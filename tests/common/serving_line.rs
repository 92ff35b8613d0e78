//! Reading the address out of `lathe serve`'s JSON log line `lathe serving`. Shared with the
//! benchmarks that run the binary (`benches/common` includes this file by path).

/// The `address` field of a JSON log line, `None` when the line has none.
pub fn serving_address(log_line: &str) -> Option<String> {
    log_line
        .split("\"address\":\"")
        .nth(1)
        .map(|rest| rest.chars().take_while(|c| *c != '"').collect::<String>())
}
