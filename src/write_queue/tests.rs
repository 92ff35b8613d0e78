use super::*;
use crate::types::OperationState;

fn limits() -> QueueLimits {
    QueueLimits {
        max_queued_bytes: 100,
        max_queued_bytes_total: 150,
        dedupe_window: Duration::from_secs(60),
        retention: Duration::from_secs(120),
    }
}

fn deletes(ids: &[&str]) -> QueuedWrite {
    QueuedWrite::Delete(ids.iter().map(|id| id.to_string()).collect())
}

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
}

#[test]
fn a_write_is_pending_until_finished_and_survives_a_reopen_in_order() {
    let dir = tempfile::tempdir().unwrap();
    {
        let queue = WriteQueue::open(dir.path(), limits()).unwrap();
        let first = queue.enqueue("c", &deletes(&["a"]), "", at(0)).unwrap();
        let second = queue.enqueue("c", &deletes(&["b"]), "", at(1)).unwrap();
        let other = queue.enqueue("d", &deletes(&["x"]), "", at(2)).unwrap();
        assert_eq!(
            [first.operation.id, second.operation.id, other.operation.id],
            [1, 2, 3]
        );
        assert_eq!(first.operation.state, OperationState::Queued);
        assert!(!queue.visible("c", 1));
        assert!(queue.visible("c", 0));
    }
    // Reopened as after a crash: everything pending, in order, and ids go on.
    let queue = WriteQueue::open(dir.path(), limits()).unwrap();
    let mut pending = queue.pending_collections();
    pending.sort();
    assert_eq!(pending, ["c", "d"]);
    let (id, write) = queue.next("c").unwrap().unwrap();
    assert_eq!(id, 1);
    assert!(matches!(write, QueuedWrite::Delete(ids) if ids == ["a"]));
    assert_eq!(
        queue.operation(1).unwrap().unwrap().state,
        OperationState::Running
    );
    queue.finish(1, Ok((0, 7))).unwrap();
    let applied = queue.operation(1).unwrap().unwrap();
    assert_eq!(applied.state, OperationState::Applied);
    assert_eq!(applied.generation, 7);
    assert!(queue.visible("c", 1));
    assert!(!queue.visible("c", 2));
    assert_eq!(queue.next("c").unwrap().unwrap().0, 2);
    let next = queue.enqueue("c", &deletes(&["z"]), "", at(3)).unwrap();
    assert_eq!(next.operation.id, 4);
    let listed: Vec<u64> = queue
        .operations("c", 10)
        .unwrap()
        .iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(listed, [4, 2, 1], "newest first, this collection's only");
}

#[test]
fn the_same_write_id_answers_the_first_operation_and_another_write_under_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let queue = WriteQueue::open(dir.path(), limits()).unwrap();
    let first = queue.enqueue("c", &deletes(&["a"]), "w1", at(0)).unwrap();
    let again = queue.enqueue("c", &deletes(&["a"]), "w1", at(10)).unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.operation.id, first.operation.id);
    assert_eq!(queue.depth()[0].documents, 1, "nothing queued twice");
    let other = queue.enqueue("c", &deletes(&["b"]), "w1", at(11));
    assert!(
        matches!(&other, Err(LatheError::InvalidArgument { field, .. }) if field == "write_id"),
        "{other:?}"
    );
    // Another collection has its own ids; past the window the id is new again.
    assert!(
        !queue
            .enqueue("d", &deletes(&["a"]), "w1", at(12))
            .unwrap()
            .deduplicated
    );
    let late = queue.enqueue("c", &deletes(&["a"]), "w1", at(61)).unwrap();
    assert!(!late.deduplicated);
    assert_ne!(late.operation.id, first.operation.id);
}

#[test]
fn past_the_bound_a_write_is_refused_with_a_retry_delay_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let queue = WriteQueue::open(dir.path(), limits()).unwrap();
    let sixty = "x".repeat(60);
    // Into an empty queue a write is always taken, whatever its size.
    queue.enqueue("c", &deletes(&[&sixty]), "", at(0)).unwrap();
    let refused = queue.enqueue("c", &deletes(&[&sixty]), "", at(1));
    let Err(LatheError::QueueFull {
        field, retry_after, ..
    }) = &refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!(*field, "max_queued_bytes");
    assert!(*retry_after >= Duration::from_secs(1));
    // Another collection fits under its own bound, until the total is passed.
    queue.enqueue("d", &deletes(&[&sixty]), "", at(2)).unwrap();
    let total = queue.enqueue("e", &deletes(&[&sixty]), "", at(3));
    assert!(
        matches!(&total, Err(LatheError::QueueFull { field, .. }) if *field == "max_queued_bytes_total"),
        "{total:?}"
    );
    assert_eq!(queue.depth().iter().map(|d| d.bytes).sum::<u64>(), 120);
}

#[test]
fn a_purge_fails_the_pending_operations_and_forgets_the_write_ids() {
    let dir = tempfile::tempdir().unwrap();
    let queue = WriteQueue::open(dir.path(), limits()).unwrap();
    let first = queue.enqueue("c", &deletes(&["a"]), "w", at(0)).unwrap();
    queue.next("c").unwrap();
    queue.purge("c", "collection `c` was deleted").unwrap();
    let failed = queue.operation(first.operation.id).unwrap().unwrap();
    assert_eq!(failed.state, OperationState::Failed);
    assert!(failed.error.contains("deleted"));
    assert!(queue.visible("c", first.operation.id));
    // The worker's finish of the purged write changes nothing.
    queue.finish(first.operation.id, Ok((1, 1))).unwrap();
    assert_eq!(
        queue.operation(first.operation.id).unwrap().unwrap().state,
        OperationState::Failed
    );
    assert!(
        !queue
            .enqueue("c", &deletes(&["a"]), "w", at(1))
            .unwrap()
            .deduplicated
    );
}

#[test]
fn ended_operations_are_pruned_after_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let queue = WriteQueue::open(dir.path(), limits()).unwrap();
    let id = queue
        .enqueue("c", &deletes(&["a"]), "w", SystemTime::now())
        .unwrap()
        .operation
        .id;
    queue.next("c").unwrap();
    queue.finish(id, Ok((0, 1))).unwrap();
    queue
        .prune(SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    assert!(
        queue.operation(id).unwrap().is_some(),
        "kept within retention"
    );
    queue
        .prune(SystemTime::now() + Duration::from_secs(121))
        .unwrap();
    assert!(queue.operation(id).unwrap().is_none());
}
