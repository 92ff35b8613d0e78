//! For unit tests: what a closure logs, as the server's JSON lines, under a subscriber of this
//! thread's own (so tests running side by side never see each other's lines).

use std::sync::{Arc, Mutex};

/// A `Write` into a buffer the test reads back.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `run`'s value and the JSON lines it logged at `level` or above.
pub fn logged_while<T>(level: tracing::Level, run: impl FnOnce() -> T) -> (T, String) {
    let written = Written::default();
    let writer = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(level)
        .with_writer(move || writer.clone())
        .finish();
    let value = tracing::subscriber::with_default(subscriber, run);
    let bytes = written.0.lock().unwrap().clone();
    (value, String::from_utf8(bytes).unwrap())
}
