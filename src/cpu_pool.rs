//! A bounded pool of threads for CPU work (search, re-chunking, scoring, inference), so that async
//! tasks never block. Work whose caller has gone (cancelled request, passed deadline) is dropped
//! before it starts.

use tokio::sync::oneshot;

use crate::error::{LatheError, Result};

#[derive(Clone)]
pub struct CpuPool {
    pool: std::sync::Arc<rayon::ThreadPool>,
}

impl CpuPool {
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("lathe-cpu-{i}"))
            .build()
            .map_err(|e| LatheError::internal(format!("building the CPU pool: {e}")))?;
        Ok(Self {
            pool: std::sync::Arc::new(pool),
        })
    }

    /// Runs `work` on the pool and awaits its result.
    pub async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel();
        self.pool.spawn(move || {
            if sender.is_closed() {
                return;
            }
            let _ = sender.send(work());
        });
        receiver
            .await
            .map_err(|_| LatheError::internal("CPU pool task panicked"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_work_and_returns_its_result() {
        let pool = CpuPool::new(2).unwrap();
        let value = pool.run(|| Ok(21 * 2)).await.unwrap();
        assert_eq!(value, 42);
    }

    #[tokio::test]
    async fn work_nobody_awaits_is_skipped() {
        let pool = CpuPool::new(1).unwrap();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Block the only thread, then queue work and drop its future before it can start.
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let blocking_pool = pool.clone();
        let blocker = tokio::spawn(async move {
            blocking_pool
                .run(move || {
                    let _ = blocked.recv();
                    Ok(())
                })
                .await
        });
        tokio::task::yield_now().await;
        let flag = ran.clone();
        let abandoned = pool.run(move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        // Polled once (so it is queued), then given up on like a cancelled request.
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(20), abandoned).await;
        assert!(timed_out.is_err());
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        pool.run(|| Ok(())).await.unwrap();
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
