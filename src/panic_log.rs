//! Panics as log lines. Rust's default hook writes a panic as several plain lines on stderr,
//! which breaks a JSON log into pieces a collector cannot parse, and says nothing of the file a
//! dependency was reading when it panicked. `lathe serve` installs [`install`]'s hook once its
//! logging runs: a panic becomes one ERROR event (`thread`, `location`, `panic`, and the
//! backtrace when `RUST_BACKTRACE` asks for one) in the log's own format. The places that read
//! files through a dependency that may panic on damaged bytes (tantivy's doc-store blocks,
//! hnsw_rs's dumps) run it under [`catch`]: such a panic is not logged by the hook at all, and
//! comes back as an error message, which the caller logs once, naming the file.
//!
//! Where no subscriber is set (the CLI's other commands, unit tests), the hook hands the panic to
//! the hook it replaced, so nothing is ever swallowed.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

thread_local! {
    /// How many [`catch`] calls this thread is inside.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
    /// The last panic caught by [`catch`] on this thread, as its message and location.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the hook (once per process; later calls do nothing).
pub fn install() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| hook(info, &*previous)));
    });
}

fn hook(info: &PanicHookInfo<'_>, previous: &(dyn Fn(&PanicHookInfo<'_>) + Send + Sync)) {
    let message = payload_text(info.payload());
    let location = info
        .location()
        .map(|l| format!("{}:{}", l.file(), l.line()))
        .unwrap_or_default();
    if CATCHING.get() > 0 {
        CAUGHT.set(Some(format!("{message} (at {location})")));
        return;
    }
    let logging = tracing::dispatcher::get_default(|dispatch| {
        !dispatch.is::<tracing::subscriber::NoSubscriber>()
    });
    if !logging {
        previous(info);
        return;
    }
    let thread = std::thread::current();
    let backtrace = std::backtrace::Backtrace::capture();
    let backtrace = match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => backtrace.to_string(),
        _ => String::new(),
    };
    tracing::error!(
        thread = thread.name().unwrap_or("unnamed"),
        %location,
        panic = %message,
        backtrace = %backtrace,
        "a thread panicked"
    );
}

/// Runs `run`, turning a panic into an error holding its message and location, which the hook
/// does not log (the caller logs it with what it was reading).
pub fn catch<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    CATCHING.set(CATCHING.get() + 1);
    let outcome = panic::catch_unwind(AssertUnwindSafe(run));
    CATCHING.set(CATCHING.get() - 1);
    outcome.map_err(|payload| {
        CAUGHT
            .take()
            .unwrap_or_else(|| payload_text(payload.as_ref()))
    })
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_log::logged_while;

    #[test]
    fn a_panic_is_one_json_line_and_a_caught_one_is_the_callers_to_tell() {
        install();
        let ((), log) = logged_while(tracing::Level::INFO, || {
            let outcome = panic::catch_unwind(|| panic!("the {} went wrong", "block"));
            assert!(outcome.is_err());
        });
        assert_eq!(log.lines().count(), 1, "{log}");
        let line: serde_json::Value = serde_json::from_str(log.trim_end()).unwrap();
        assert_eq!(line["level"], "ERROR");
        assert_eq!(line["fields"]["panic"], "the block went wrong");
        assert!(
            line["fields"]["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("src/panic_log.rs:")),
            "{log}"
        );

        let (caught, log) = logged_while(tracing::Level::INFO, || {
            catch(|| -> u32 { panic!("a damaged dump") })
        });
        assert_eq!(log, "", "a caught panic is not logged by the hook");
        let error = caught.unwrap_err();
        assert!(
            error.starts_with("a damaged dump (at src/panic_log.rs:"),
            "{error}"
        );
        // Nothing is left behind for the next catch, and a value comes back as it is.
        assert_eq!(catch(|| 7), Ok(7));
        assert_eq!(CAUGHT.take(), None);
    }
}
