//! The ONNX Runtime side of MiniLM: the process's one environment, the sessions (each on the
//! optimised model written once at open, or on the model file), and which session a run takes.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session};

use super::{MiniLmConfig, MiniLmEmbedder};
use crate::embed::EmbedError;

/// ort allows one environment per process, ever (its slot is never cleared), so every embedder of
/// the process shares this one. A failed load is not remembered: a later call may retry.
static ORT_ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);

/// The process-wide onnxruntime environment, loading the library from `library_path` on first use.
/// Later calls return the same environment whatever path they pass (a process can load only one
/// onnxruntime library).
pub fn ort_environment(library_path: &Path) -> Result<Environment, EmbedError> {
    let mut slot = ORT_ENVIRONMENT
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(environment) = slot.as_ref() {
        return Ok(environment.clone());
    }
    let library_error = |message: String| EmbedError::RuntimeLibrary {
        path: library_path.to_path_buf(),
        message,
    };
    // `init_from` reports a missing or incompatible library as an error; loading it implicitly
    // would panic instead.
    let builder = ort::init_from(library_path).map_err(|error| library_error(error.to_string()))?;
    let environment = builder
        .with_name("lathe")
        .with_telemetry(false)
        .build()
        .map_err(|error| library_error(error.to_string()))?;
    *slot = Some(environment.clone());
    Ok(environment)
}

/// Which work a model run is for: sentence vectors at ingest, or texts (queries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SessionSide {
    Ingest,
    Query,
}

impl MiniLmEmbedder {
    /// A session for `side`. With two or more, the last is the queries' own and ingest takes
    /// any of the others (the first free, else waits for the first): a query never waits
    /// behind an ingest batch, nor runs on the ingest session's lower-priority threads, and
    /// only the ingest sessions' memory grows to a batch's. With one, both share it.
    pub(super) fn acquire_session(&self, side: SessionSide) -> MutexGuard<'_, Session> {
        let count = self.sessions.len();
        let lock = |index: usize| {
            // A panic inside a run leaves the session itself usable: runs keep no state
            // between calls.
            self.sessions[index]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if count < 2 {
            return lock(0);
        }
        match side {
            SessionSide::Query => lock(count - 1),
            SessionSide::Ingest => (0..count - 1)
                .find_map(|index| self.sessions[index].try_lock().ok())
                .unwrap_or_else(|| lock(0)),
        }
    }
}

/// The error of a model file that will not load or run.
fn model_error(config: &MiniLmConfig, error: &dyn std::fmt::Display) -> EmbedError {
    EmbedError::ModelFile {
        path: config.model_path.clone(),
        message: error.to_string(),
    }
}

/// `config.session_count` sessions (at least one), and whether they loaded the optimised model:
/// with [`MiniLmConfig::optimized_model_dir`] set, the optimised model is written there and the
/// sessions load it, falling back to the model file when that fails; the directory is removed
/// once they have loaded.
pub(super) fn open_sessions(
    environment: &Environment,
    config: &MiniLmConfig,
) -> Result<(Vec<Mutex<Session>>, bool), EmbedError> {
    let optimized_model = config.optimized_model_dir.as_deref().and_then(|dir| {
        write_optimized_model(environment, config, dir)
            .inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "cannot write the optimised MiniLM model; each session optimises its own copy"
                );
            })
            .ok()
    });
    let count = config.session_count.max(1);
    let open_sessions = |model_path: &Path| {
        (0..count)
            .map(|index| {
                let nice = match (index, count) {
                    (0, 2..) => config.ingest_session_nice,
                    _ => 0,
                };
                // The queries' own session (beside an ingest session) does not spin between
                // runs: its idle threads would take the CPU the niced ingest could use.
                let spin = !(index > 0 && count >= 2);
                open_session_at(environment, config, model_path, nice, spin)
                    .map(Mutex::new)
                    .map_err(|error| model_error(config, &error))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let opened = match optimized_model.as_deref().map(open_sessions) {
        Some(Ok(sessions)) => Ok((sessions, true)),
        Some(Err(error)) => {
            tracing::warn!(%error, "cannot load the optimised MiniLM model; loading the original");
            open_sessions(&config.model_path).map(|sessions| (sessions, false))
        }
        None => open_sessions(&config.model_path).map(|sessions| (sessions, false)),
    };
    // Each session has mapped or pre-packed the weights it keeps: the files can go.
    if let Some(dir) = &config.optimized_model_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    opened
}

/// With the arena on, the run options of an ingest call's last run (see
/// `MiniLmEmbedder::shrink_arena`); `None` with it off.
pub(super) fn shrink_arena_options(
    config: &MiniLmConfig,
) -> Result<Option<RunOptions>, EmbedError> {
    if !config.memory_arena {
        return Ok(None);
    }
    let mut options = RunOptions::new().map_err(|error| model_error(config, &error))?;
    options
        .set("memory.enable_memory_arena_shrinkage", "cpu:0")
        .map_err(|error| model_error(config, &error))?;
    Ok(Some(options))
}

/// One inference session on `model_path`, as `config` sets it up.
/// [`open_session`], on a thread of its own at `nice` when above 0: ONNX Runtime starts the
/// session's intra-op threads as it opens, and they inherit their creator's priority.
fn open_session_at(
    environment: &Environment,
    config: &MiniLmConfig,
    model_path: &Path,
    nice: i32,
    spin: bool,
) -> ort::Result<Session> {
    if nice <= 0 {
        return open_session(environment, config, model_path, spin);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                crate::cpu_pool::lower_priority(nice);
                open_session(environment, config, model_path, spin)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn open_session(
    environment: &Environment,
    config: &MiniLmConfig,
    model_path: &Path,
    spin: bool,
) -> ort::Result<Session> {
    Session::builder(environment)?
        .with_config_entry(
            "session.intra_op.allow_spinning",
            if spin { "1" } else { "0" },
        )?
        .with_memory_pattern(config.memory_arena)?
        .with_execution_providers([ort::ep::CPU::default()
            .with_arena_allocator(config.memory_arena)
            .build()])?
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_intra_threads(config.intra_op_threads.max(1))?
        .commit_from_file(model_path)
}

/// The file name, inside [`MiniLmConfig::optimized_model_dir`], of the optimised model; its
/// weights lie beside it in [`OPTIMIZED_WEIGHTS_FILE`].
const OPTIMIZED_MODEL_FILE: &str = "model.onnx";
const OPTIMIZED_WEIGHTS_FILE: &str = "weights.bin";

/// Writes ONNX Runtime's optimised form of `config.model_path` into `dir` (emptied first) and
/// returns the model file's path.
///
/// The shipped model stores its weights as int8 with a scale (`Cast` and `Mul` before each
/// `MatMul`). Constant folding turns them into f32 when a session is created, and a session that
/// optimises the model itself keeps the folded weights beside the pre-packed copies its kernels
/// make: about 100 MiB a session. Written out with the folded weights in an external file, the
/// model loads with those weights memory-mapped, and a session keeps only what it pre-packs
/// (about 40 MiB). The optimisation written is ONNX Runtime's extended level, which is not
/// specific to this machine's CPU; each session still applies every level when it loads.
fn write_optimized_model(
    environment: &Environment,
    config: &MiniLmConfig,
    dir: &Path,
) -> Result<PathBuf, EmbedError> {
    let model_error = |error: &dyn std::fmt::Display| EmbedError::ModelFile {
        path: dir.join(OPTIMIZED_MODEL_FILE),
        message: error.to_string(),
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(model_error(&error)),
    }
    std::fs::create_dir_all(dir).map_err(|error| model_error(&error))?;
    let model_path = dir.join(OPTIMIZED_MODEL_FILE);
    // The session that writes the file is not kept: creating it is what writes it.
    let write = || -> ort::Result<Session> {
        Session::builder(environment)?
            .with_optimization_level(GraphOptimizationLevel::Level2)?
            .with_optimized_model_path(&model_path)?
            .with_config_entry(
                "session.optimized_model_external_initializers_file_name",
                OPTIMIZED_WEIGHTS_FILE,
            )?
            .with_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                "1024",
            )?
            .commit_from_file(&config.model_path)
    };
    write().map_err(|error| model_error(&error))?;
    Ok(model_path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::minilm::two_session_embedder;

    /// Which of the two sessions are held now.
    fn held(embedder: &MiniLmEmbedder) -> [bool; 2] {
        [0, 1].map(|i| embedder.sessions[i].try_lock().is_err())
    }

    #[test]
    fn ingest_and_queries_each_keep_to_their_own_session() {
        let embedder = two_session_embedder();
        {
            let _ingest = embedder.acquire_session(SessionSide::Ingest);
            assert_eq!(held(&embedder), [true, false]);
            // With the ingest session busy, a query still gets a session at once.
            let _query = embedder.acquire_session(SessionSide::Query);
            assert_eq!(held(&embedder), [true, true]);
        }
        // A second ingest run waits for the ingest session: it never takes the queries'.
        let first = embedder.acquire_session(SessionSide::Ingest);
        std::thread::scope(|scope| {
            let second = scope.spawn(|| {
                let _second = embedder.acquire_session(SessionSide::Ingest);
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(held(&embedder), [true, false]);
            assert!(!second.is_finished());
            drop(first);
            second.join().unwrap();
        });
        assert_eq!(held(&embedder), [false, false]);
    }
}
