//! Values built from files that operators replace under a running server: the TLS certificate,
//! key and client CA (cert-manager renews them in place) and the API keys file. Each is rebuilt
//! when its files' bytes change, checked every `server.reload_interval_ms`; a rebuild that fails
//! (a key half written, a certificate that does not match its key) keeps the previous value and
//! says why, once per content, so a renewal never takes the server down.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Result;

/// The newest good value built from a set of files.
pub struct Reloadable<T> {
    current: RwLock<Arc<T>>,
}

impl<T> Reloadable<T> {
    /// A value that never changes.
    pub fn fixed(value: T) -> Self {
        Self {
            current: RwLock::new(Arc::new(value)),
        }
    }

    /// The value now (what each new connection or call uses).
    pub fn get(&self) -> Arc<T> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn set(&self, value: T) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

/// Builds the value from `files` with `build`, then rebuilds it whenever their bytes change,
/// checking every `interval` (never when it is zero) until `stop` turns true.
pub fn watch_files<T, Build>(
    what: &'static str,
    files: Vec<PathBuf>,
    interval: Duration,
    stop: watch::Receiver<bool>,
    build: Build,
) -> Result<Arc<Reloadable<T>>>
where
    T: Send + Sync + 'static,
    Build: Fn() -> Result<T> + Send + Sync + 'static,
{
    let seen = fingerprint(&files);
    let value = Arc::new(Reloadable::fixed(build()?));
    if !interval.is_zero() {
        let watched = Arc::downgrade(&value);
        tokio::spawn(watch_loop(
            what, files, interval, stop, build, seen, watched,
        ));
    }
    Ok(value)
}

async fn watch_loop<T, Build>(
    what: &'static str,
    files: Vec<PathBuf>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    build: Build,
    mut seen: Option<blake3::Hash>,
    watched: std::sync::Weak<Reloadable<T>>,
) where
    T: Send + Sync + 'static,
    Build: Fn() -> Result<T> + Send + Sync + 'static,
{
    let build = Arc::new(build);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let (files_now, build_now) = (files.clone(), Arc::clone(&build));
        let checked = tokio::task::spawn_blocking(move || {
            let now = fingerprint(&files_now);
            (now, (now != seen).then(|| build_now()))
        })
        .await;
        let Ok((now, rebuilt)) = checked else {
            continue;
        };
        let Some(target) = watched.upgrade() else {
            return; // Nothing uses the value any more.
        };
        match rebuilt {
            None => {}
            Some(Ok(value)) => {
                target.set(value);
                tracing::info!(what, "reloaded: its files changed");
            }
            Some(Err(error)) => {
                tracing::warn!(what, %error, "its files changed but cannot be used; the previous stays in use")
            }
        }
        seen = now;
    }
}

/// The BLAKE3 of the files' bytes in order (a missing file reads as empty: being replaced);
/// None when one cannot be read at all.
fn fingerprint(files: &[PathBuf]) -> Option<blake3::Hash> {
    let mut hasher = blake3::Hasher::new();
    for file in files {
        match std::fs::read(file) {
            Ok(bytes) => {
                hasher.update(&(bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                hasher.update(&u64::MAX.to_le_bytes());
            }
            Err(_) => return None,
        }
    }
    Some(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_changed_file_is_rebuilt_and_a_bad_one_keeps_the_previous_value() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("number");
        std::fs::write(&path, "1").unwrap();
        let (_stop_tx, stop) = watch::channel(false);
        let read = {
            let path = path.clone();
            move || {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| crate::error::LatheError::io("reading", e))?;
                text.trim()
                    .parse::<u32>()
                    .map_err(|e| crate::error::LatheError::invalid("number", e))
            }
        };
        let value = watch_files(
            "number",
            vec![path.clone()],
            Duration::from_millis(10),
            stop,
            read,
        )
        .unwrap();
        assert_eq!(*value.get(), 1);
        let becomes = |expected: u32| {
            let value = Arc::clone(&value);
            async move {
                for _ in 0..500 {
                    if *value.get() == expected {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            }
        };
        std::fs::write(&path, "2").unwrap();
        assert!(becomes(2).await);
        std::fs::write(&path, "not a number").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*value.get(), 2, "a bad file keeps the previous value");
        std::fs::write(&path, "3").unwrap();
        assert!(becomes(3).await);
    }
}
