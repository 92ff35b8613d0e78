//! Runs one function over many items on a few scoped threads, keeping the items' order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `work` applied to every item of `items` on up to `threads` threads; results in item order.
pub fn map_in_parallel<T, R>(items: Vec<T>, threads: usize, work: impl Fn(T) -> R + Sync) -> Vec<R>
where
    T: Send,
    R: Send,
{
    let count = items.len();
    let threads = threads.clamp(1, count.max(1));
    if threads == 1 {
        return items.into_iter().map(work).collect();
    }
    // Each slot is taken once (by the index handed out below), so the locks never contend.
    let inputs: Vec<Mutex<Option<T>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let outputs: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let item = inputs[i].lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(item) = item {
                    let result = work(item);
                    *outputs[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                }
            });
        }
    });
    outputs
        .into_iter()
        .filter_map(|slot| slot.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_item_order_for_any_thread_count() {
        for threads in [0, 1, 3, 64] {
            let squares = map_in_parallel((0..100u64).collect(), threads, |n| n * n);
            assert_eq!(squares, (0..100u64).map(|n| n * n).collect::<Vec<_>>());
        }
        assert!(map_in_parallel(Vec::<u8>::new(), 4, |n| n).is_empty());
    }
}
