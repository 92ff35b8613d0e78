//! Which collections are open. An open collection holds its index reader's memory maps (about
//! 7 per segment, against the kernel's `vm.max_map_count`), its dense index and some memory; a
//! closed one holds its name and settings only. So the process's maps, memory, start and clean
//! stop grow with the collections in use, not with the collections there are:
//! - at start the first `storage.max_open_collections` (by name) open, and every other
//!   collection's settings are read and it is listed closed;
//! - a closed collection opens on first use ([`Catalog::open_entry`]), under its gate, so that
//!   one open runs at a time and never beside its closing index;
//! - past the budget, the closer thread closes the least recently used collections nobody is
//!   using (their writer commits first), down to a little under it;
//! - while more than the budget and a quarter are open (every one in use), opening another is
//!   refused with RESOURCE_EXHAUSTED: never a failed map that aborts the process.
//!
//! Every change of the listing goes through [`Listing`], which keeps the count of open
//! collections in step with it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::entry::{ClosedCollection, CollectionEntry};
use super::Catalog;
use crate::error::{LatheError, Result};

/// Memory maps an open one-segment collection holds (tantivy's files and the dense segment),
/// about: what the start's check of the budget against `vm.max_map_count` counts per collection.
const MAPS_PER_COLLECTION: usize = 8;

/// How soon the closer looks again while past the budget with every collection in use.
const RETRY_CLOSING: Duration = Duration::from_millis(200);

/// The listing of a catalog's collections and how many of them are open.
pub(super) struct Residency<T> {
    entries: RwLock<BTreeMap<String, CollectionEntry<T>>>,
    open: AtomicUsize,
    /// `storage.max_open_collections`.
    budget: usize,
    clock: Instant,
    closed_total: AtomicU64,
}

impl<T> Residency<T> {
    pub(super) fn new(entries: BTreeMap<String, CollectionEntry<T>>, budget: usize) -> Self {
        let open = entries.values().filter(|entry| entry.is_open()).count();
        Self {
            entries: RwLock::new(entries),
            open: AtomicUsize::new(open),
            budget: budget.max(1),
            clock: Instant::now(),
            closed_total: AtomicU64::new(0),
        }
    }

    /// Logs a WARN when the budget's collections could hold more memory maps than the kernel
    /// allows the process (`vm.max_map_count`, Linux only): past it a map fails, and an open
    /// that fails to map can abort the process.
    pub(super) fn check_map_limit(&self) {
        let Ok(text) = std::fs::read_to_string("/proc/sys/vm/max_map_count") else {
            return;
        };
        let Ok(allowed) = text.trim().parse::<usize>() else {
            return;
        };
        let needed = self.hard_limit() * MAPS_PER_COLLECTION;
        if needed > allowed {
            tracing::warn!(
                max_open_collections = self.budget,
                maps_needed = needed,
                vm_max_map_count = allowed,
                "storage.max_open_collections may need more memory maps than vm.max_map_count allows: lower it, or raise vm.max_map_count"
            );
        }
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, CollectionEntry<T>>> {
        self.entries.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> Listing<'_, T> {
        Listing {
            entries: self.entries.write().unwrap_or_else(PoisonError::into_inner),
            open: &self.open,
        }
    }

    /// Milliseconds since the catalog opened: when a collection was last used.
    pub(super) fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    pub(super) fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub(super) fn closed_total(&self) -> u64 {
        self.closed_total.load(Ordering::Relaxed)
    }

    fn over_budget(&self) -> bool {
        self.open_count() > self.budget
    }

    /// Beyond this many open collections, opening another is refused.
    fn hard_limit(&self) -> usize {
        self.budget + (self.budget / 4).max(16)
    }

    /// That `closed` is still what the listing holds for `name`.
    pub(super) fn holds(&self, name: &str, closed: &Arc<ClosedCollection>) -> bool {
        matches!(self.read().get(name), Some(CollectionEntry::Closed(current)) if Arc::ptr_eq(current, closed))
    }

    /// Closes the least recently used collections nobody is using until the open ones are a
    /// little under the budget (a batch, so that the listing is not scanned at every open).
    fn close_idle(&self) {
        let open = self.open_count();
        if open <= self.budget {
            return;
        }
        let target = self.budget - self.budget / 32;
        let mut idle: Vec<(u64, String)> = self
            .read()
            .values()
            .filter_map(|entry| entry.open_collection())
            .filter(|open| Arc::strong_count(open) == 1)
            .map(|open| (open.last_used.load(Ordering::Relaxed), open.name.clone()))
            .collect();
        idle.sort_unstable();
        for (_, name) in idle.into_iter().take(open - target) {
            self.close(&name);
        }
    }

    /// Closes collection `name` if it is open and unused: listed closed first (under its gate,
    /// so that an open waits), then its writer commits and stops and its dense files are
    /// fenced, then the index is dropped with its maps. False when it was in use or gone.
    fn close(&self, name: &str) -> bool {
        let Some(open) = self
            .read()
            .get(name)
            .and_then(|entry| entry.open_collection().cloned())
        else {
            return false;
        };
        let closed = Arc::new(ClosedCollection::new(name, open.settings.clone()));
        let _gate = closed.gate.lock().unwrap_or_else(PoisonError::into_inner);
        {
            let mut listing = self.write();
            // The listing's and this one: no call holds it, and none can take it from here on.
            let unused = matches!(listing.get(name), Some(CollectionEntry::Ready(current)) if Arc::ptr_eq(current, &open))
                && Arc::strong_count(&open) == 2;
            if !unused {
                return false;
            }
            listing.insert(
                name.to_string(),
                CollectionEntry::Closed(Arc::clone(&closed)),
            );
        }
        open.index.shutdown();
        open.index.close_files();
        if let Ok(stats) = open.index.stats() {
            closed.set_stats(stats);
        }
        drop(open);
        self.closed_total.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(collection = %name, "closed an idle collection");
        true
    }
}

/// The listing, write-locked; the count of open collections follows every change.
pub(super) struct Listing<'a, T> {
    entries: RwLockWriteGuard<'a, BTreeMap<String, CollectionEntry<T>>>,
    open: &'a AtomicUsize,
}

impl<T> Listing<'_, T> {
    pub(super) fn get(&self, name: &str) -> Option<&CollectionEntry<T>> {
        self.entries.get(name)
    }

    pub(super) fn insert(&mut self, name: String, entry: CollectionEntry<T>) {
        let opens = entry.is_open();
        let old = self.entries.insert(name, entry);
        self.count(opens, old.as_ref());
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<CollectionEntry<T>> {
        let old = self.entries.remove(name);
        self.count(false, old.as_ref());
        old
    }

    fn count(&self, opens: bool, old: Option<&CollectionEntry<T>>) {
        let closes = old.is_some_and(CollectionEntry::is_open);
        match (opens, closes) {
            (true, false) => {
                self.open.fetch_add(1, Ordering::Relaxed);
            }
            (false, true) => {
                self.open.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// The thread that closes idle collections past the budget, woken by every open that passes
/// it; stopped (after the close under way) by [`Closer::stop`].
pub(super) struct Closer {
    wake: Mutex<Option<mpsc::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Closer {
    pub(super) fn start<T: Send + Sync + 'static>(residency: Arc<Residency<T>>) -> Result<Self> {
        let (wake, wakes) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lathe-closer".into())
            .spawn(move || loop {
                // Past the budget with every collection in use, it looks again shortly: the
                // calls holding them end without waking it.
                let woken = if residency.over_budget() {
                    wakes.recv_timeout(RETRY_CLOSING) != Err(mpsc::RecvTimeoutError::Disconnected)
                } else {
                    wakes.recv().is_ok()
                };
                if !woken {
                    return;
                }
                while wakes.try_recv().is_ok() {}
                residency.close_idle();
            })
            .map_err(|e| LatheError::io("spawning the collection closer thread", e))?;
        Ok(Self {
            wake: Mutex::new(Some(wake)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn wake(&self) {
        if let Some(wake) = &*self.wake.lock().unwrap_or_else(PoisonError::into_inner) {
            let _ = wake.send(());
        }
    }

    /// Stops the thread once the close under way (if any) has ended.
    pub(super) fn stop(&self) {
        drop(
            self.wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(thread) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = thread.join();
        }
    }
}

impl<T> Catalog<T> {
    /// The entry of `name` with its index open: a closed collection is opened now (a fault
    /// found makes it faulted, and that is what is returned). Never [`CollectionEntry::Closed`].
    /// RESOURCE_EXHAUSTED when too many collections are open and in use to open another.
    pub fn open_entry(&self, name: &str) -> Result<CollectionEntry<T>> {
        loop {
            let closed = match self.entry(name)? {
                CollectionEntry::Closed(closed) => closed,
                CollectionEntry::Ready(open) => {
                    open.touch(self.residency.now_ms());
                    return Ok(CollectionEntry::Ready(open));
                }
                faulted @ CollectionEntry::Faulted(_) => return Ok(faulted),
            };
            let _gate = closed.gate.lock().unwrap_or_else(PoisonError::into_inner);
            if !self.residency.holds(name, &closed) {
                // Opened, closed again or deleted while this call waited for the gate.
                continue;
            }
            self.check_room()?;
            let opened =
                self.opener()
                    .open_with(name, closed.settings.clone(), self.attach.as_ref());
            if let CollectionEntry::Ready(open) = &opened {
                open.touch(self.residency.now_ms());
            }
            // Every change of a closed entry holds its gate (see `delete_changing`), so the
            // listing still holds `closed`.
            self.residency
                .write()
                .insert(name.to_string(), opened.clone());
            self.after_open();
            return Ok(opened);
        }
    }

    /// RESOURCE_EXHAUSTED when another open would pass the hard limit (see the module doc);
    /// at the limit, first closes what is idle here and now.
    pub(super) fn check_room(&self) -> Result<()> {
        if self.residency.open_count() < self.residency.hard_limit() {
            return Ok(());
        }
        self.residency.close_idle();
        let open = self.residency.open_count();
        if open < self.residency.hard_limit() {
            return Ok(());
        }
        Err(LatheError::Overloaded(format!(
            "{open} collections are open and in use, past storage.max_open_collections = {} (each open collection holds memory maps, against the kernel's vm.max_map_count); retry in a moment, or raise the limit",
            self.residency.budget
        )))
    }

    /// Collections open now (at most about `storage.max_open_collections`).
    pub fn open_collections(&self) -> usize {
        self.residency.open_count()
    }

    /// Collections closed so far to keep the open ones within `storage.max_open_collections`.
    pub fn collection_closes(&self) -> u64 {
        self.residency.closed_total()
    }

    /// Wakes the closer after a collection was opened or created past the budget.
    pub(super) fn after_open(&self) {
        if self.residency.over_budget() {
            self.closer.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::folders::INDEX_DIR;
    use super::super::tests::{open_budgeted, record, settings};
    use super::*;
    use crate::index::collection::WriteOp;

    fn catalog(dir: &Path, max_open: usize) -> Catalog<()> {
        open_budgeted(dir, max_open, |_, _| Ok(()))
    }

    /// Creates `name` with one document, written without waiting: only a commit (at close or
    /// shutdown) makes it durable, the commit interval being an hour here.
    fn created(catalog: &Catalog<()>, name: &str) -> Arc<super::super::OpenCollection<()>> {
        let open = catalog.create(name, settings(), ()).unwrap();
        let op = WriteOp::Upsert(record("only", &format!("the note of {name}")));
        assert!(open.index.write(vec![op], false).unwrap().is_none());
        open
    }

    fn documents(catalog: &Catalog<()>, name: &str) -> u64 {
        catalog.get(name).unwrap().index.stats().unwrap().documents
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..2_000 {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("not within 20 s: {what}");
    }

    fn is_closed(catalog: &Catalog<()>, name: &str) -> bool {
        matches!(catalog.entry(name), Ok(CollectionEntry::Closed(_)))
    }

    #[test]
    fn past_the_budget_the_least_recently_used_idle_ones_close_and_reopen_whole() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog(dir.path(), 4);
        for i in 0..10 {
            drop(created(&catalog, &format!("c{i}")));
        }
        wait_until("six closed", || catalog.collection_closes() >= 6);
        assert_eq!(catalog.open_collections(), 4);
        // The six used first closed, each after committing its write.
        for i in 0..6 {
            let name = format!("c{i}");
            let CollectionEntry::Closed(closed) = catalog.entry(&name).unwrap() else {
                panic!("{name} is still open");
            };
            assert_eq!(closed.stats().map(|s| s.documents), Some(1), "{name}");
        }
        assert!((6..10).all(|i| !is_closed(&catalog, &format!("c{i}"))));
        for i in 0..6 {
            assert_eq!(documents(&catalog, &format!("c{i}")), 1, "c{i}");
        }
        catalog.shutdown();
        drop(catalog);
        // The start opens the first four by name; the rest open when used.
        let catalog = self::catalog(dir.path(), 4);
        assert_eq!(catalog.open_collections(), 4);
        assert!(is_closed(&catalog, "c9") && !is_closed(&catalog, "c0"));
        for i in 0..10 {
            assert_eq!(documents(&catalog, &format!("c{i}")), 1, "c{i}");
        }
        assert_eq!(catalog.entries().len(), 10);
    }

    #[test]
    fn a_collection_in_use_stays_open_and_past_the_hard_limit_an_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog(dir.path(), 1);
        // Budget 1: the hard limit is 17 open collections.
        let held: Vec<_> = (0..17)
            .map(|i| catalog.create(&format!("c{i}"), settings(), ()).unwrap())
            .collect();
        let refused = catalog
            .create("c17", settings(), ())
            .err()
            .expect("refused");
        assert!(
            matches!(&refused, LatheError::Overloaded(message) if message.contains("storage.max_open_collections = 1")),
            "{refused}"
        );
        assert!(catalog.entry("c17").is_err());
        assert!(!dir.path().join("collections/c17").exists());
        assert_eq!(catalog.open_collections(), 17);
        drop(held);
        // Idle now: the next open closes them first.
        catalog.create("c17", settings(), ()).unwrap();
        wait_until("back within the budget", || catalog.open_collections() <= 1);
        assert!(catalog.get("c17").is_ok());
    }

    #[test]
    fn a_closed_collection_deleted_while_others_open_it_is_gone_and_its_name_free() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(catalog(dir.path(), 1));
        for round in 0..20 {
            drop(created(&catalog, "doomed"));
            // Held until "doomed" closed: the closer's only idle choice, even while this
            // thread's look at the listing holds "doomed" for a moment.
            let other = created(&catalog, "other");
            wait_until(&format!("round {round}: doomed closed"), || {
                is_closed(&catalog, "doomed")
            });
            drop(other);
            let opener = {
                let catalog = Arc::clone(&catalog);
                std::thread::spawn(move || {
                    (0..50)
                        .map(|_| {
                            catalog
                                .get("doomed")
                                .map(|open| open.index.path().to_owned())
                        })
                        .collect::<Vec<_>>()
                })
            };
            catalog.delete("doomed").unwrap();
            for found in opener.join().unwrap() {
                assert!(
                    matches!(found, Ok(_) | Err(LatheError::CollectionNotFound { .. })),
                    "round {round}: {found:?}"
                );
            }
            assert!(catalog.entry("doomed").is_err(), "round {round}");
            assert!(!dir.path().join("collections/doomed").exists());
            catalog.delete("other").unwrap();
        }
    }

    #[test]
    fn a_budget_past_the_kernels_map_limit_is_warned_of_at_start() {
        let Some(allowed) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
        else {
            return; // not Linux: nothing to check against
        };
        let warned = |budget: usize| {
            let residency = Residency::<()>::new(BTreeMap::new(), budget);
            let ((), log) =
                crate::test_log::logged_while(tracing::Level::WARN, || residency.check_map_limit());
            log.contains("vm.max_map_count")
        };
        assert!(!warned(allowed / 64), "a budget well within {allowed} maps");
        assert!(warned(allowed), "a budget of {allowed} collections");
    }

    #[test]
    fn a_fault_of_a_closed_collection_is_found_when_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog(dir.path(), 10);
        for name in ["a", "b"] {
            drop(created(&catalog, name));
        }
        catalog.shutdown();
        drop(catalog);
        let meta = dir
            .path()
            .join("collections/b")
            .join(INDEX_DIR)
            .join("meta.json");
        std::fs::remove_file(&meta).unwrap();
        let catalog = self::catalog(dir.path(), 1);
        assert!(is_closed(&catalog, "b"));
        let error = catalog.get("b").err().expect("damaged");
        assert!(
            matches!(&error, LatheError::CollectionDamaged { .. })
                && error.to_string().contains("meta.json"),
            "{error}"
        );
        assert!(matches!(
            catalog.entry("b"),
            Ok(CollectionEntry::Faulted(_))
        ));
        assert_eq!(documents(&catalog, "a"), 1);
    }
}
