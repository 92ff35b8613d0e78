//! A small pool of writer workers shared by every collection, with a cap on how many collections
//! hold an open index writer at once.
//!
//! Each collection registers a [`WriterJob`] and gets a [`SlotHandle`] to queue commands on. A
//! collection with queued commands waits in one FIFO queue; a worker takes the oldest, hands the
//! job everything queued for it (so the job can commit them as one group) and puts it back at the
//! end of the queue if more arrived meanwhile: one busy collection cannot starve the others. A job
//! may also ask to run again at a time of its choosing ([`JobState::wake_at`]: a commit falling due,
//! an idle writer to close) without any command.
//!
//! Open index writers cost threads, a file lock and an indexing arena each, so a job must hold a
//! [`Permit`] while its writer is open, and at most `max_open_writers` permits exist. A job that
//! needs one when none is free takes the permit of the least recently used collection that no
//! worker is running: the pool has that job commit and close its writer first
//! ([`WriterJob::close_writer`]). When every permit belongs to a running job, the asker waits for
//! one of those runs to end. Jobs never wait for a permit while holding one, so waiting cannot
//! deadlock.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// One collection's writer, as the pool drives it.
pub trait WriterJob: Send + Sized + 'static {
    type Command: Send + 'static;

    /// Applies `commands` in order and commits what is due. Before it opens its index writer the
    /// job must call [`Permit::acquire`] (a no-op when it already holds the permit).
    fn run(&mut self, commands: Vec<Self::Command>, permit: &mut Permit<'_, Self>) -> JobState;

    /// Commits what the job holds and closes its index writer: another collection needs the
    /// permit. Must not acquire a permit.
    fn close_writer(&mut self) -> JobState;
}

/// What a job reports after each run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobState {
    /// Its index writer is open (so it keeps its permit).
    pub writer_open: bool,
    /// When it wants to run again even if no command arrives.
    pub wake_at: Option<Instant>,
    /// It is done (shut down): the pool forgets it and refuses further commands.
    pub finished: bool,
}

type SlotId = u64;

struct Slot<J: WriterJob> {
    job: Arc<Mutex<J>>,
    /// Commands not yet handed to the job.
    inbox: Vec<J::Command>,
    /// In the ready queue.
    queued: bool,
    /// A worker is running the job, or closing its writer for another job's sake.
    running: bool,
    /// The job holds one of the permits.
    holds_permit: bool,
    wake_at: Option<Instant>,
    /// When a worker last let go of it (pool ticks), for least-recently-used eviction.
    last_used: u64,
}

struct State<J: WriterJob> {
    slots: HashMap<SlotId, Slot<J>>,
    ready: VecDeque<SlotId>,
    timers: BTreeSet<(Instant, SlotId)>,
    permits_held: usize,
    next_id: SlotId,
    tick: u64,
    /// The `WriterPool` was dropped: workers leave once no job is registered.
    closing: bool,
}

struct Shared<J: WriterJob> {
    state: Mutex<State<J>>,
    /// Signalled on every change a waiting worker may care about (work queued, a run ended).
    changed: Condvar,
    max_open_writers: usize,
    /// Writers closed to give their permit to another collection.
    evictions: AtomicU64,
}

impl<J: WriterJob> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // No code panics while holding this lock; recover the data if it ever happens.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The worker threads and the queue they serve.
pub struct WriterPool<J: WriterJob> {
    shared: Arc<Shared<J>>,
    workers: Vec<JoinHandle<()>>,
}

/// What a collection holds to queue commands for its job.
pub struct SlotHandle<J: WriterJob> {
    shared: Arc<Shared<J>>,
    id: SlotId,
}

/// A job's right to keep an index writer open (see the module doc).
pub struct Permit<'a, J: WriterJob> {
    shared: &'a Shared<J>,
    id: SlotId,
    held: bool,
}

impl<J: WriterJob> WriterPool<J> {
    /// Starts `threads` workers (at least one) sharing at most `max_open_writers` permits (at
    /// least one).
    pub fn new(threads: usize, max_open_writers: usize, name: &str) -> std::io::Result<Self> {
        Self::niced(threads, max_open_writers, name, 0)
    }

    /// [`WriterPool::new`], its threads (and the index writers' threads they start, which
    /// inherit it) at `nice` (0..=19; 0: the default), so that queries get the cores first.
    pub fn niced(
        threads: usize,
        max_open_writers: usize,
        name: &str,
        nice: i32,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: HashMap::new(),
                ready: VecDeque::new(),
                timers: BTreeSet::new(),
                permits_held: 0,
                next_id: 0,
                tick: 0,
                closing: false,
            }),
            changed: Condvar::new(),
            max_open_writers: max_open_writers.max(1),
            evictions: AtomicU64::new(0),
        });
        let mut pool = Self {
            shared,
            workers: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    crate::cpu_pool::lower_priority(nice);
                    work(&shared)
                })?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Registers a job; it runs when commands are submitted through the returned handle.
    pub fn register(&self, job: J) -> SlotHandle<J> {
        let mut state = self.shared.lock();
        let id = state.next_id;
        state.next_id += 1;
        let tick = state.tick;
        state.slots.insert(
            id,
            Slot {
                job: Arc::new(Mutex::new(job)),
                inbox: Vec::new(),
                queued: false,
                running: false,
                holds_permit: false,
                wake_at: None,
                last_used: tick,
            },
        );
        SlotHandle {
            shared: Arc::clone(&self.shared),
            id,
        }
    }

    /// Index writers open now.
    pub fn open_writers(&self) -> usize {
        self.shared.lock().permits_held
    }

    /// Writers closed so far to make room for another collection's (all permits were held).
    pub fn evictions(&self) -> u64 {
        self.shared.evictions.load(Ordering::Relaxed)
    }
}

impl<J: WriterJob> Drop for WriterPool<J> {
    fn drop(&mut self) {
        let all_jobs_gone = {
            let mut state = self.shared.lock();
            state.closing = true;
            state.slots.is_empty()
        };
        self.shared.changed.notify_all();
        // Jobs still registered belong to collections that outlive the pool: the workers serve
        // them until they finish, then leave on their own.
        if all_jobs_gone {
            for worker in self.workers.drain(..) {
                let _ = worker.join();
            }
        }
    }
}

impl<J: WriterJob> SlotHandle<J> {
    /// Queues `command` for the job; gives it back when the job has finished.
    pub fn submit(&self, command: J::Command) -> Result<(), J::Command> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let Some(slot) = state.slots.get_mut(&self.id) else {
            return Err(command);
        };
        slot.inbox.push(command);
        if !slot.queued && !slot.running {
            slot.queued = true;
            state.ready.push_back(self.id);
        }
        drop(guard);
        self.shared.changed.notify_all();
        Ok(())
    }
}

impl<J: WriterJob> Permit<'_, J> {
    /// Returns once the job holds a permit: at once when one is free, else after the least
    /// recently used idle collection closed its writer, else after a running job let go of one.
    pub fn acquire(&mut self) {
        if self.held {
            return;
        }
        let shared = self.shared;
        let mut state = shared.lock();
        loop {
            if state.permits_held < shared.max_open_writers {
                state.permits_held += 1;
                if let Some(slot) = state.slots.get_mut(&self.id) {
                    slot.holds_permit = true;
                }
                self.held = true;
                return;
            }
            let victim = state
                .slots
                .iter()
                .filter(|(id, slot)| **id != self.id && slot.holds_permit && !slot.running)
                .min_by_key(|(_, slot)| slot.last_used)
                .map(|(id, _)| *id);
            let Some(victim) = victim else {
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            };
            let job = {
                let slot = state
                    .slots
                    .get_mut(&victim)
                    .expect("the victim was just found");
                slot.running = true;
                Arc::clone(&slot.job)
            };
            drop(state);
            let victim_state =
                catch_unwind(AssertUnwindSafe(|| lock_job(&job).close_writer())).ok();
            state = shared.lock();
            let closed = victim_state.is_some_and(|outcome| !outcome.writer_open);
            // The victim's permit passes to this job when its writer closed; either way the
            // victim is released like after a run (its state decides its timers and queueing).
            release(&mut state, victim, victim_state);
            if closed {
                shared.evictions.fetch_add(1, Ordering::Relaxed);
                if let Some(slot) = state.slots.get_mut(&self.id) {
                    slot.holds_permit = true;
                }
                // `release` returned the victim's permit; take it back for this job.
                state.permits_held += 1;
                self.held = true;
                drop(state);
                shared.changed.notify_all();
                return;
            }
            shared.changed.notify_all();
        }
    }

    pub fn is_held(&self) -> bool {
        self.held
    }
}

fn lock_job<J>(job: &Mutex<J>) -> MutexGuard<'_, J> {
    // A job that panicked is forgotten by the pool (see `release`); its lock is not reused.
    job.lock().unwrap_or_else(|p| p.into_inner())
}

/// A worker: runs the oldest ready job, else sleeps until a timer falls due or work arrives.
fn work<J: WriterJob>(shared: &Shared<J>) {
    let mut state = shared.lock();
    loop {
        let now = Instant::now();
        promote_due_timers(&mut state, now);
        if let Some((id, commands, held, job)) = take_ready(&mut state) {
            drop(state);
            let mut permit = Permit { shared, id, held };
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                lock_job(&job).run(commands, &mut permit)
            }));
            if outcome.is_err() {
                tracing::error!(
                    "a collection's writer panicked; its writes are refused from now on"
                );
            }
            state = shared.lock();
            release(&mut state, id, outcome.ok());
            shared.changed.notify_all();
            continue;
        }
        if state.closing && state.slots.is_empty() {
            return;
        }
        state = match state.timers.first() {
            Some(&(at, _)) => {
                shared
                    .changed
                    .wait_timeout(state, at.saturating_duration_since(now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => shared
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner()),
        };
    }
}

/// The oldest ready job, marked running: its id, its queued commands, whether it holds a permit.
#[allow(clippy::type_complexity)]
fn take_ready<J: WriterJob>(
    state: &mut State<J>,
) -> Option<(SlotId, Vec<J::Command>, bool, Arc<Mutex<J>>)> {
    while let Some(id) = state.ready.pop_front() {
        let Some(slot) = state.slots.get_mut(&id) else {
            continue;
        };
        slot.queued = false;
        if slot.running {
            // Being closed for another job's sake; it is queued again when that ends.
            continue;
        }
        slot.running = true;
        if let Some(at) = slot.wake_at.take() {
            state.timers.remove(&(at, id));
        }
        let commands = std::mem::take(&mut slot.inbox);
        return Some((id, commands, slot.holds_permit, Arc::clone(&slot.job)));
    }
    None
}

fn promote_due_timers<J: WriterJob>(state: &mut State<J>, now: Instant) {
    while let Some(&(at, id)) = state.timers.first() {
        if at > now {
            return;
        }
        state.timers.remove(&(at, id));
        let Some(slot) = state.slots.get_mut(&id) else {
            continue;
        };
        slot.wake_at = None;
        if !slot.queued && !slot.running {
            slot.queued = true;
            state.ready.push_back(id);
        }
    }
}

/// Bookkeeping after a run or a forced close of job `id`; `outcome` is `None` when it panicked.
fn release<J: WriterJob>(state: &mut State<J>, id: SlotId, outcome: Option<JobState>) {
    state.tick += 1;
    let tick = state.tick;
    let Some(slot) = state.slots.get_mut(&id) else {
        return;
    };
    slot.running = false;
    slot.last_used = tick;
    if let Some(at) = slot.wake_at.take() {
        state.timers.remove(&(at, id));
    }
    let Some(outcome) = outcome.filter(|outcome| !outcome.finished) else {
        // Finished or panicked: forget the job (dropping it closes its writer). Commands still
        // queued are dropped, which answers their callers that the writer stopped.
        if let Some(slot) = state.slots.remove(&id) {
            if slot.holds_permit {
                state.permits_held -= 1;
            }
        }
        return;
    };
    debug_assert!(
        !outcome.writer_open || slot.holds_permit,
        "a job opened its writer without a permit"
    );
    if slot.holds_permit && !outcome.writer_open {
        slot.holds_permit = false;
        state.permits_held -= 1;
    }
    if let Some(at) = outcome.wake_at {
        slot.wake_at = Some(at);
        state.timers.insert((at, id));
    }
    if !slot.inbox.is_empty() && !slot.queued {
        slot.queued = true;
        state.ready.push_back(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A job that records what it ran; "opens a writer" on `Open`.
    struct Recorder {
        name: &'static str,
        log: mpsc::Sender<String>,
        writer_open: bool,
        wake_at: Option<Instant>,
    }

    enum Command {
        Open,
        Note(u32),
        WakeIn(Duration),
        /// Blocks the run until the test says go.
        Hold(mpsc::Receiver<()>),
        Finish,
        Panic,
    }

    impl WriterJob for Recorder {
        type Command = Command;

        fn run(&mut self, commands: Vec<Command>, permit: &mut Permit<'_, Self>) -> JobState {
            let mut finished = false;
            if commands.is_empty() {
                let _ = self.log.send(format!("{} woke", self.name));
                self.wake_at = None;
            }
            for command in commands {
                match command {
                    Command::Open => {
                        permit.acquire();
                        self.writer_open = true;
                        let _ = self.log.send(format!("{} opened", self.name));
                    }
                    Command::Note(n) => {
                        let _ = self.log.send(format!("{} {n}", self.name));
                    }
                    Command::WakeIn(after) => self.wake_at = Some(Instant::now() + after),
                    Command::Hold(go) => {
                        let _ = self.log.send(format!("{} holding", self.name));
                        let _ = go.recv();
                    }
                    Command::Finish => {
                        let _ = self.log.send(format!("{} finishing", self.name));
                        finished = true;
                    }
                    Command::Panic => {
                        let _ = self.log.send(format!("{} panicking", self.name));
                        panic!("job panics on purpose")
                    }
                }
            }
            JobState {
                writer_open: self.writer_open && !finished,
                wake_at: self.wake_at,
                finished,
            }
        }

        fn close_writer(&mut self) -> JobState {
            self.writer_open = false;
            let _ = self.log.send(format!("{} closed", self.name));
            JobState {
                writer_open: false,
                wake_at: None,
                finished: false,
            }
        }
    }

    fn recorder(name: &'static str, log: &mpsc::Sender<String>) -> Recorder {
        Recorder {
            name,
            log: log.clone(),
            writer_open: false,
            wake_at: None,
        }
    }

    fn next(log: &mpsc::Receiver<String>) -> String {
        log.recv_timeout(Duration::from_secs(30))
            .expect("the pool ran nothing within 30 s")
    }

    #[test]
    fn commands_of_one_job_run_in_order_and_queued_ones_run_as_one_group() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(1, 4, "test-writer").unwrap();
        let a = pool.register(recorder("a", &log_tx));
        let (go_tx, go) = mpsc::channel();
        a.submit(Command::Hold(go)).ok().unwrap();
        assert_eq!(next(&log), "a holding");
        for n in 0..5 {
            a.submit(Command::Note(n)).ok().unwrap();
        }
        go_tx.send(()).unwrap();
        let notes: Vec<String> = (0..5).map(|_| next(&log)).collect();
        assert_eq!(notes, ["a 0", "a 1", "a 2", "a 3", "a 4"]);
    }

    #[test]
    fn a_busy_job_goes_to_the_back_of_the_queue() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(1, 4, "test-writer").unwrap();
        let a = pool.register(recorder("a", &log_tx));
        let b = pool.register(recorder("b", &log_tx));
        let (go_tx, go) = mpsc::channel();
        a.submit(Command::Hold(go)).ok().unwrap();
        assert_eq!(next(&log), "a holding");
        // While a runs, more work for a arrives first, then work for b: b was queued first.
        a.submit(Command::Note(1)).ok().unwrap();
        b.submit(Command::Note(1)).ok().unwrap();
        go_tx.send(()).unwrap();
        assert_eq!(next(&log), "b 1");
        assert_eq!(next(&log), "a 1");
    }

    #[test]
    fn past_the_cap_the_least_recently_used_idle_writer_is_closed() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(1, 2, "test-writer").unwrap();
        let jobs: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| pool.register(recorder(name, &log_tx)))
            .collect();
        for job in &jobs[..2] {
            job.submit(Command::Open).ok().unwrap();
            next(&log);
        }
        assert_eq!(pool.open_writers(), 2);
        jobs[2].submit(Command::Open).ok().unwrap();
        assert_eq!(next(&log), "a closed");
        assert_eq!(next(&log), "c opened");
        assert_eq!(pool.open_writers(), 2);
        assert_eq!(pool.evictions(), 1);
    }

    #[test]
    fn a_job_waits_for_a_permit_held_by_a_running_job_without_deadlock() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(2, 1, "test-writer").unwrap();
        let a = pool.register(recorder("a", &log_tx));
        let b = pool.register(recorder("b", &log_tx));
        let (go_tx, go) = mpsc::channel();
        a.submit(Command::Open).ok().unwrap();
        assert_eq!(next(&log), "a opened");
        a.submit(Command::Hold(go)).ok().unwrap();
        assert_eq!(next(&log), "a holding");
        // b needs the only permit, which a holds while running: b waits until a's run ends,
        // then a (now idle) is closed for it.
        b.submit(Command::Open).ok().unwrap();
        assert!(log.recv_timeout(Duration::from_millis(200)).is_err());
        go_tx.send(()).unwrap();
        assert_eq!(next(&log), "a closed");
        assert_eq!(next(&log), "b opened");
        assert_eq!(pool.open_writers(), 1);
    }

    #[test]
    fn a_job_runs_again_when_its_timer_falls_due() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(1, 1, "test-writer").unwrap();
        let a = pool.register(recorder("a", &log_tx));
        a.submit(Command::WakeIn(Duration::from_millis(20)))
            .ok()
            .unwrap();
        assert_eq!(next(&log), "a woke");
    }

    #[test]
    fn a_finished_or_panicked_job_refuses_commands_and_frees_its_permit() {
        let (log_tx, log) = mpsc::channel();
        let pool = WriterPool::new(1, 1, "test-writer").unwrap();
        let a = pool.register(recorder("a", &log_tx));
        let b = pool.register(recorder("b", &log_tx));
        a.submit(Command::Open).ok().unwrap();
        assert_eq!(next(&log), "a opened");
        a.submit(Command::Finish).ok().unwrap();
        // Only once a's run holds the Finish: submitted while a's first run was still ending,
        // it would run after b's Open, which would then close a (idle, holding the permit).
        assert_eq!(next(&log), "a finishing");
        b.submit(Command::Open).ok().unwrap();
        assert_eq!(next(&log), "b opened");
        assert!(a.submit(Command::Note(1)).is_err());
        b.submit(Command::Panic).ok().unwrap();
        assert_eq!(next(&log), "b panicking");
        // The only worker releases b before it runs c: b's permit is free, nothing is closed.
        let c = pool.register(recorder("c", &log_tx));
        c.submit(Command::Open).ok().unwrap();
        assert_eq!(next(&log), "c opened");
        assert!(b.submit(Command::Note(1)).is_err());
        assert_eq!(pool.open_writers(), 1);
    }

    #[test]
    fn dropping_the_pool_with_no_job_joins_its_workers() {
        let pool: WriterPool<Recorder> = WriterPool::new(3, 1, "test-writer").unwrap();
        drop(pool);
    }
}
