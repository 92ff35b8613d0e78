//! What a replica knows of its own progress through the log, shared by the apply loop (which
//! moves it), the service (read-your-writes waits, the position in answers) and the health
//! check (ready once caught up, not while lagging or stopped).

use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::error::{LatheError, Result};

/// One replica's progress, as last published by its apply loop and its log watch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Every entry up to this stream sequence is applied, committed and visible.
    pub applied: u64,
    /// The replica has applied everything the log held at some moment since it started.
    pub caught_up: bool,
    /// Log positions after `applied` (entries and the parts of split versions), when last known.
    pub pending: u64,
    /// When the oldest log entry this replica has not applied was stored, when last known
    /// (`None`: every entry the log held is applied). Read from the log itself on a timer (the
    /// watch), so a stalled delivery cannot hide it.
    pub oldest_unapplied: Option<SystemTime>,
    /// When this replica last learned the log's state: its watch read the log's head, or it was
    /// delivered an entry with nothing after it. With nothing known unapplied, the replica is
    /// at most this old (a replica that cannot reach its log, or was paused, cannot know more).
    pub known_at: Option<SystemTime>,
    /// When the newest applied entry was published.
    pub applied_published: Option<SystemTime>,
    /// Why the apply loop stopped for good (an entry it cannot decode, another log's data dir):
    /// the replica then serves what it has and is never ready again until restarted.
    pub stopped: Option<String>,
    /// Why the log this replica's data came from is gone (the stream deleted, purged or made
    /// again): applying stops, writes are refused, and the replica is not ready until an
    /// operator decides (README, "Replicas").
    pub lost: Option<String>,
    /// The failure an apply is being retried after (a full disk, an index that cannot be
    /// written); cleared by the next applied batch.
    pub retrying: Option<String>,
    /// The work stream of queued writes (see `work`), when last read by the watch.
    pub work: WorkDepth,
}

/// Writes queued in the work stream, not yet embedded and published (see `work`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkDepth {
    pub messages: u64,
    pub bytes: u64,
    /// When the oldest queued message was stored (`None` when none waits).
    pub oldest: Option<SystemTime>,
}

impl Progress {
    /// How far behind the replica may be: the age of the oldest log entry it has not applied,
    /// else how long ago it last learned that it had applied everything. Every answer it gives
    /// misses at most the writes stored in that time.
    pub fn lag(&self, now: SystemTime) -> Duration {
        self.oldest_unapplied
            .or(self.known_at)
            .and_then(|since| now.duration_since(since).ok())
            .unwrap_or(Duration::ZERO)
    }

    /// Ready to serve reads: caught up once, not stopped, its log not lost, its last apply not
    /// failing (a full disk: it cannot bring its data up to date, however young the lag still
    /// is), and not further behind than `max_lag` (zero: never too far).
    pub fn ready(&self, max_lag: Duration, now: SystemTime) -> bool {
        self.caught_up
            && self.stopped.is_none()
            && self.lost.is_none()
            && self.retrying.is_none()
            && (max_lag.is_zero() || self.lag(now) <= max_lag)
    }
}

/// The shared progress, behind a watch channel so that waiters wake when it moves.
pub struct ReplicaState {
    progress: watch::Sender<Progress>,
    /// The NATS URL, for messages.
    url: String,
}

impl ReplicaState {
    pub fn new(url: &str) -> Self {
        Self {
            progress: watch::Sender::new(Progress::default()),
            url: url.to_string(),
        }
    }

    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    pub(super) fn update(&self, change: impl FnOnce(&mut Progress)) {
        self.progress.send_modify(change);
    }

    /// Waits until every entry up to `position` is visible here; UNAVAILABLE once the apply
    /// loop has stopped short of it. The caller's deadline bounds the wait.
    pub async fn wait_applied(&self, position: u64) -> Result<()> {
        let mut progress = self.progress.subscribe();
        let reached = progress
            .wait_for(|p| p.applied >= position || p.stopped.is_some() || p.lost.is_some())
            .await
            .map_err(|_| LatheError::Unavailable("the replica's apply loop is gone".into()))?
            .clone();
        if reached.applied >= position {
            return Ok(());
        }
        if let Some(lost) = reached.lost {
            return Err(LatheError::Precondition(format!(
                "this replica applied its log up to position {} and stopped: {lost}; position {position} cannot be read here",
                reached.applied
            )));
        }
        Err(LatheError::Unavailable(format!(
            "this replica applied the log of {} up to position {} and stopped: {}; position {position} cannot be read here",
            self.url,
            reached.applied,
            reached.stopped.unwrap_or_default()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_ready_once_caught_up_and_not_while_far_behind_or_stopped() {
        let now = SystemTime::now();
        let max_lag = Duration::from_secs(30);
        let mut progress = Progress::default();
        assert!(!progress.ready(max_lag, now), "not caught up yet");
        progress.caught_up = true;
        progress.known_at = Some(now - Duration::from_secs(1));
        assert!(progress.ready(max_lag, now));
        // Nothing known unapplied, but the log last read long ago (unreachable, or the process
        // was paused): it may miss what was stored since.
        progress.known_at = Some(now - Duration::from_secs(45));
        assert_eq!(progress.lag(now), Duration::from_secs(45));
        assert!(!progress.ready(max_lag, now));
        progress.known_at = Some(now);
        // Missing an entry stored a minute ago: not ready; however old what it applied, with
        // nothing unapplied it is.
        progress.applied_published = Some(now - Duration::from_secs(600));
        progress.oldest_unapplied = Some(now - Duration::from_secs(60));
        assert_eq!(progress.lag(now), Duration::from_secs(60));
        assert!(!progress.ready(max_lag, now));
        assert!(progress.ready(Duration::ZERO, now), "0 = lag never matters");
        progress.oldest_unapplied = None;
        assert!(progress.ready(max_lag, now));
        progress.lost = Some("the stream was purged".into());
        assert!(!progress.ready(max_lag, now));
        progress.lost = None;
        // An apply failing (a full disk): not ready, however young the lag; ready once it goes.
        progress.retrying = Some("entries 7..=9: No space left on device".into());
        assert!(!progress.ready(max_lag, now));
        progress.retrying = None;
        assert!(progress.ready(max_lag, now));
        progress.stopped = Some("poison".into());
        assert!(!progress.ready(max_lag, now));
    }

    #[tokio::test]
    async fn waiters_wake_when_the_position_passes_theirs_or_the_loop_stops() {
        let state = std::sync::Arc::new(ReplicaState::new("nats://127.0.0.1:4222"));
        let waiter = tokio::spawn({
            let state = std::sync::Arc::clone(&state);
            async move { state.wait_applied(10).await }
        });
        state.update(|p| p.applied = 9);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        state.update(|p| p.applied = 12);
        waiter.await.unwrap().unwrap();

        state.update(|p| p.stopped = Some("entry 13 is not a log entry".into()));
        let error = state.wait_applied(20).await.unwrap_err().to_string();
        assert!(
            error.contains("up to position 12") && error.contains("entry 13"),
            "{error}"
        );
    }
}
