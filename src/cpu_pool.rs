//! A bounded pool of threads for CPU work (search, re-chunking, scoring, inference), so that async
//! tasks never block. Work whose caller has gone (cancelled request, passed deadline) is dropped
//! before it starts, and long work that has started can ask [`current_job_abandoned`] between
//! steps and stop early (model inference does, between model runs).
//!
//! At shutdown [`CpuPool::stop`] abandons everything and [`CpuPool::wait_idle`] waits until no job
//! runs: the process must not exit while inference runs, because exiting destroys ONNX Runtime's
//! C++ statics under the running kernel (which then fails with `GetElementType is not
//! implemented`, logged at ERROR, or could crash).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{LatheError, Result};

#[derive(Clone)]
pub struct CpuPool {
    pool: Arc<rayon::ThreadPool>,
    jobs: Arc<Jobs>,
}

/// Jobs submitted and not yet finished (queued or running), and whether the pool is stopping.
#[derive(Default)]
struct Jobs {
    unfinished: Mutex<usize>,
    all_finished: Condvar,
    stopping: AtomicBool,
}

/// What the job running on a pool thread can ask about itself.
struct JobContext {
    abandoned: Arc<AtomicBool>,
    jobs: Arc<Jobs>,
}

thread_local! {
    static CURRENT_JOB: RefCell<Option<JobContext>> = const { RefCell::new(None) };
    /// The jobs of the pool this thread belongs to (None outside pool threads): also seen by the
    /// parts of a job that rayon runs on another of the pool's threads.
    static POOL_JOBS: RefCell<Option<Arc<Jobs>>> = const { RefCell::new(None) };
}

/// True when the pool job running on this thread has no caller any more (its future was dropped:
/// the request was cancelled or timed out) or the pool is stopping; its result would be thrown
/// away, so long work should stop at its next step. False outside pool jobs.
pub fn current_job_abandoned() -> bool {
    CURRENT_JOB.with(|job| {
        job.borrow().as_ref().is_some_and(|job| {
            job.abandoned.load(Ordering::Relaxed) || job.jobs.stopping.load(Ordering::Relaxed)
        })
    })
}

/// True on a thread of a pool whose only job is the one running here (none other queued or
/// running), so that spreading its own work over the pool's threads takes nothing from anyone.
/// A job that fans out waits inside rayon for its parts, and rayon lets a waiting thread run
/// queued jobs meanwhile: a loaded pool would make every fanned-out job wait for others' whole
/// jobs, so under load each job keeps to its thread. False outside pool threads.
pub fn may_fan_out() -> bool {
    POOL_JOBS.with(|jobs| {
        jobs.borrow().as_ref().is_some_and(|jobs| {
            *jobs
                .unfinished
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                <= 1
        })
    })
}

/// Lowers the calling thread's scheduling priority to `nice` (Linux: per thread; threads it
/// starts afterwards inherit it). 0 leaves it as it is. Raising it back would need privileges,
/// so only threads that keep the lower priority for good call this.
pub fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    // SAFETY: plain system calls on the calling thread's own id.
    let result = unsafe {
        let thread = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, thread, nice)
    };
    if result != 0 {
        tracing::warn!(
            nice,
            error = %std::io::Error::last_os_error(),
            "cannot lower a background thread's priority; it runs at the default"
        );
    }
}

/// `a` and `b`: side by side when [`may_fan_out`], else one after the other on this thread.
pub fn join<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    if may_fan_out() {
        rayon::join(a, b)
    } else {
        (a(), b())
    }
}

/// The `with_min_len` for a parallel iterator of a pool job: 1 (split freely) when
/// [`may_fan_out`], else no split at all, so the iterator runs on this thread.
pub fn min_split_len() -> usize {
    if may_fan_out() {
        1
    } else {
        usize::MAX
    }
}

/// Marks the job abandoned when the caller's future is dropped before the result came.
struct AbandonOnDrop {
    abandoned: Arc<AtomicBool>,
    armed: bool,
}

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.abandoned.store(true, Ordering::Relaxed);
        }
    }
}

/// Counts a job as finished when dropped (also when the job panics).
struct FinishOnDrop(Arc<Jobs>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        let mut unfinished = self
            .0
            .unfinished
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *unfinished -= 1;
        if *unfinished == 0 {
            self.0.all_finished.notify_all();
        }
    }
}

impl CpuPool {
    pub fn new(threads: usize) -> Result<Self> {
        Self::named(threads, "lathe-cpu", 0)
    }

    /// A pool for background work (the index workers' embedding): its threads run at `nice`
    /// (0..=19), so that when queries want the same cores the kernel gives them the cores first.
    pub fn background(threads: usize, nice: i32) -> Result<Self> {
        Self::named(threads, "lathe-bg", nice)
    }

    fn named(threads: usize, name: &'static str, nice: i32) -> Result<Self> {
        let jobs = Arc::new(Jobs::default());
        let pool_jobs = Arc::clone(&jobs);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(move |i| format!("{name}-{i}"))
            .start_handler(move |_| {
                lower_priority(nice);
                POOL_JOBS.with(|jobs| *jobs.borrow_mut() = Some(Arc::clone(&pool_jobs)))
            })
            .build()
            .map_err(|e| LatheError::internal(format!("building the CPU pool: {e}")))?;
        Ok(Self {
            pool: Arc::new(pool),
            jobs,
        })
    }

    /// Runs `work` on the pool and awaits its result.
    pub async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel();
        let abandoned = Arc::new(AtomicBool::new(false));
        let mut abandon_on_drop = AbandonOnDrop {
            abandoned: Arc::clone(&abandoned),
            armed: true,
        };
        *self
            .jobs
            .unfinished
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        let jobs = Arc::clone(&self.jobs);
        self.pool.spawn(move || {
            let _finished = FinishOnDrop(Arc::clone(&jobs));
            if sender.is_closed() || jobs.stopping.load(Ordering::Relaxed) {
                return;
            }
            // A job that waits inside rayon (a join, a parallel iterator) may run another job on
            // this thread meanwhile: each one gives back the context it found.
            let outer = CURRENT_JOB.with(|job| job.replace(Some(JobContext { abandoned, jobs })));
            let result = work();
            CURRENT_JOB.with(|job| *job.borrow_mut() = outer);
            let _ = sender.send(result);
        });
        let result = receiver.await;
        abandon_on_drop.armed = false;
        result.map_err(|_| {
            if self.jobs.stopping.load(Ordering::Relaxed) {
                LatheError::Unavailable("the server is stopping".to_string())
            } else {
                LatheError::internal("CPU pool task panicked")
            }
        })?
    }

    /// Abandons all work: queued jobs are skipped, and running ones see
    /// [`current_job_abandoned`]. For shutdown; the pool runs nothing after it.
    pub fn stop(&self) {
        self.jobs.stopping.store(true, Ordering::Relaxed);
    }

    /// Blocks until no job is queued or running, or `limit` has passed; true when idle.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut unfinished = self
            .jobs
            .unfinished
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *unfinished > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            unfinished = self
                .jobs
                .all_finished
                .wait_timeout(unfinished, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Occupies one thread of `pool` with a job that runs until `release` is sent to, and
    /// returns once the job has started: the release and the job's task.
    async fn block_one_thread(
        pool: &CpuPool,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<()>>,
    ) {
        let (started, blocker_started) = oneshot::channel::<()>();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let blocking_pool = pool.clone();
        let blocker = tokio::spawn(async move {
            blocking_pool
                .run(move || {
                    let _ = started.send(());
                    let _ = blocked.recv();
                    Ok(())
                })
                .await
        });
        blocker_started.await.unwrap();
        (release, blocker)
    }

    #[tokio::test]
    async fn runs_work_and_returns_its_result() {
        let pool = CpuPool::new(2).unwrap();
        let value = pool.run(|| Ok(21 * 2)).await.unwrap();
        assert_eq!(value, 42);
    }

    #[tokio::test]
    async fn work_nobody_awaits_is_skipped() {
        use futures::FutureExt;
        let pool = CpuPool::new(1).unwrap();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Block the only thread, and know that it is blocked before queueing more work.
        let (release, blocker) = block_one_thread(&pool).await;
        let flag = ran.clone();
        let abandoned = pool.run(move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        // Polled once (so it is queued behind the blocker), then given up on like a cancelled
        // request: it cannot have run, the only thread being blocked.
        assert!(abandoned.now_or_never().is_none());
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        // Queued after the abandoned work on the one thread: once it has run, so has that.
        pool.run(|| Ok(())).await.unwrap();
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// A job whose caller drops its future sees `current_job_abandoned` turn true while it runs,
    /// and `wait_idle` returns only once it has finished.
    #[tokio::test]
    async fn running_work_learns_it_was_abandoned_and_wait_idle_waits_for_it() {
        use futures::FutureExt;
        let pool = CpuPool::new(1).unwrap();
        assert!(!current_job_abandoned(), "outside a job");
        let (started, job_started) = oneshot::channel::<()>();
        let (saw_abandoned, job_saw) = std::sync::mpsc::channel::<bool>();
        let running = pool.run(move || {
            let _ = started.send(());
            // Steps of long work: stop once nobody waits for the result.
            while !current_job_abandoned() {
                std::thread::yield_now();
            }
            let _ = saw_abandoned.send(true);
            Ok(())
        });
        let mut running = Box::pin(running);
        assert!((&mut running).now_or_never().is_none());
        job_started.await.unwrap();
        assert!(!pool.wait_idle(Duration::ZERO), "the job is still running");
        drop(running);
        assert!(job_saw.recv().unwrap());
        assert!(pool.wait_idle(Duration::from_secs(60)));
    }

    /// After `stop`, queued work is skipped and running work is abandoned.
    #[tokio::test]
    async fn stop_abandons_running_work_and_skips_queued_work() {
        let pool = CpuPool::new(1).unwrap();
        let (started, job_started) = oneshot::channel::<()>();
        let running_pool = pool.clone();
        let running = tokio::spawn(async move {
            running_pool
                .run(move || {
                    let _ = started.send(());
                    while !current_job_abandoned() {
                        std::thread::yield_now();
                    }
                    Ok("stopped early")
                })
                .await
        });
        job_started.await.unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let queued_pool = pool.clone();
        let queued = tokio::spawn(async move {
            queued_pool
                .run(move || {
                    flag.store(true, Ordering::SeqCst);
                    Ok("ran")
                })
                .await
        });
        pool.stop();
        assert_eq!(running.await.unwrap().unwrap(), "stopped early");
        let skipped = queued.await.unwrap().unwrap_err();
        assert!(skipped.to_string().contains("stopping"), "{skipped}");
        assert!(!ran.load(Ordering::SeqCst));
        assert!(pool.wait_idle(Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn a_lone_job_fans_out_and_its_parts_see_the_same() {
        assert!(!may_fan_out(), "outside the pool");
        let pool = CpuPool::new(2).unwrap();
        let (lone, parts) = pool
            .run(|| {
                let lone = may_fan_out();
                let parts = join(may_fan_out, may_fan_out);
                Ok((lone, parts))
            })
            .await
            .unwrap();
        assert!(lone);
        assert_eq!(parts, (true, true));
    }

    #[tokio::test]
    async fn a_job_beside_another_keeps_to_its_thread() {
        let pool = CpuPool::new(2).unwrap();
        let (release, blocker) = block_one_thread(&pool).await;
        let (fans_out, split) = pool
            .run(|| {
                let threads: std::collections::HashSet<_> = (0..64)
                    .into_par_iter()
                    .with_min_len(min_split_len())
                    .map(|_| std::thread::current().id())
                    .collect();
                Ok((may_fan_out(), threads.len()))
            })
            .await
            .unwrap();
        assert!(!fans_out);
        assert_eq!(split, 1, "the iterator ran on one thread");
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
    }
}
