//! The single node's durable write queue, through the real gRPC server: a write is acknowledged
//! from the queue with its operation, followed to `applied`, deduplicated by its `write_id`,
//! refused past the queue's bound (reads go on), named when a `wait` outlasts its deadline; and,
//! against the real binary with MiniLM, acknowledged writes survive SIGKILL at random points of
//! the queue's work and are applied exactly once, whole.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use proto::DocumentFormat as Format;
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

fn upsert_request(
    collection: &str,
    documents: Vec<proto::Document>,
) -> proto::UpsertDocumentsRequest {
    proto::UpsertDocumentsRequest {
        collection: collection.into(),
        documents,
        wait: false,
        write_id: String::new(),
    }
}

fn state(operation: &proto::Operation) -> proto::OperationState {
    proto::OperationState::try_from(operation.state).expect("a known state")
}

/// Waits (in calls of at most 10 s) until the operation ends.
async fn until_ended(client: &mut LatheClient<Channel>, id: u64) -> proto::Operation {
    loop {
        let operation = client
            .wait_operation(proto::WaitOperationRequest {
                id,
                timeout_ms: Some(10_000),
            })
            .await
            .expect("wait operation")
            .into_inner();
        if matches!(
            state(&operation),
            proto::OperationState::Applied | proto::OperationState::Failed
        ) {
            return operation;
        }
    }
}

async fn doc_ids(client: &mut LatheClient<Channel>, collection: &str, query: &str) -> Vec<String> {
    let mut request = retrieve_request(collection, query, 4096);
    request.top_k = Some(50);
    let mut ids: Vec<String> = retrieve(client, request)
        .await
        .chunks
        .into_iter()
        .map(|chunk| chunk.doc_id)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Plain text of about `bytes` bytes, in paragraphs.
fn long_text(seed: usize, bytes: usize) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "Paragraph {i} of volume {seed} tells how the spindle of lathe {seed} turns the blank while the gouge {i} shapes it.\n\n"
        ));
        i += 1;
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_acknowledged_with_its_operation_and_followed_to_applied() {
    Fixture::lexical()
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            let response = client
                .upsert_documents(upsert_request(
                    "c",
                    vec![
                        document("a", "Lathes turn wood on a spindle.", Format::Plain),
                        document("b", "Chisels cut mortises by hand.", Format::Plain),
                    ],
                ))
                .await
                .expect("upsert")
                .into_inner();
            let operation = response
                .operation
                .expect("a single node answers the operation");
            assert_eq!(response.operation_ids, [operation.id]);
            assert_eq!(response.consistency_token, operation.id);
            assert_eq!(operation.collection, "c");
            assert_eq!(operation.documents_total, 2);
            assert_eq!(
                operation.bytes_total,
                ("Lathes turn wood on a spindle.".len()
                    + "a".len()
                    + "Chisels cut mortises by hand.".len()
                    + "b".len()) as u64
            );
            // Read your writes: the token makes the Retrieve wait for the write.
            let mut request = retrieve_request("c", "spindle", 1024);
            request.consistency_token = response.consistency_token;
            let answer = retrieve(&mut client, request).await;
            assert_eq!(answer.chunks[0].doc_id, "a");

            let applied = until_ended(&mut client, operation.id).await;
            assert_eq!(
                state(&applied),
                proto::OperationState::Applied,
                "{applied:?}"
            );
            assert_eq!(applied.documents_done, 2);
            assert_eq!(applied.sections, 2);
            assert!(applied.generation > 0);
            assert!(applied.finished_unix_ms >= applied.created_unix_ms);

            let deleted = client
                .delete_documents(proto::DeleteDocumentsRequest {
                    collection: "c".into(),
                    ids: vec!["a".into()],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .expect("delete")
                .into_inner();
            let delete = deleted.operation.expect("the delete's operation");
            assert_eq!(state(&delete), proto::OperationState::Applied);
            assert_eq!(
                proto::OperationKind::try_from(delete.kind).unwrap(),
                proto::OperationKind::Delete
            );
            assert_eq!(doc_ids(&mut client, "c", "spindle chisels").await, ["b"]);

            let listed = client
                .list_operations(proto::ListOperationsRequest {
                    collection: "c".into(),
                    limit: 0,
                })
                .await
                .expect("list")
                .into_inner()
                .operations;
            let ids: Vec<u64> = listed.iter().map(|o| o.id).collect();
            assert_eq!(ids, [delete.id, operation.id], "newest first");

            let unknown = client
                .get_operation(proto::GetOperationRequest { id: 999_999 })
                .await;
            expect_code(unknown, Code::NotFound, &["operation 999999"]);
            let too_many = client
                .list_operations(proto::ListOperationsRequest {
                    collection: "c".into(),
                    limit: 5000,
                })
                .await;
            expect_code(too_many, Code::InvalidArgument, &["limit", "0..=1000"]);
            let long_id = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    write_id: "w".repeat(129),
                    ..upsert_request("c", vec![document("x", "text", Format::Plain)])
                })
                .await;
            expect_code(
                long_id,
                Code::InvalidArgument,
                &["write_id", "129 bytes", "0..=128"],
            );
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_write_id_sent_three_times_applies_once() {
    Fixture::lexical()
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            let request = proto::UpsertDocumentsRequest {
                write_id: "import-7".into(),
                ..upsert_request(
                    "c",
                    vec![document(
                        "a",
                        "Lathes turn wood on a spindle.",
                        Format::Plain,
                    )],
                )
            };
            let mut ids = Vec::new();
            for wait in [false, false, true] {
                let response = client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        wait,
                        ..request.clone()
                    })
                    .await
                    .expect("upsert")
                    .into_inner();
                ids.push(response.operation.unwrap().id);
            }
            assert_eq!(ids, [ids[0]; 3], "one operation answers all three");
            let listed = client
                .list_operations(proto::ListOperationsRequest {
                    collection: "c".into(),
                    limit: 0,
                })
                .await
                .unwrap()
                .into_inner()
                .operations;
            assert_eq!(listed.len(), 1, "nothing queued twice: {listed:?}");
            assert_eq!(listed[0].write_id, "import-7");
            assert_eq!(collection_stats(&mut client, "c").await.documents, 1);

            // The same id with another write is refused, naming the first operation.
            let other = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    write_id: "import-7".into(),
                    ..upsert_request("c", vec![document("b", "Another write.", Format::Plain)])
                })
                .await;
            let first = ids[0].to_string();
            expect_code(
                other,
                Code::InvalidArgument,
                &["write_id", "import-7", "different write", &first],
            );
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_its_deadline_names_the_operation_which_then_applies() {
    Fixture::new()
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            // MiniLM embeds 5 to 20 KB a second here: 80 KB keeps the worker busy for 4 to 16 s,
            // well past the 1.5 s deadline below, and well within TEST_LIMIT on a loaded machine.
            let ahead: Vec<proto::Document> = (0..2)
                .map(|i| document(&format!("long{i}"), &long_text(i, 40_000), Format::Plain))
                .collect();
            client
                .upsert_documents(upsert_request("c", ahead))
                .await
                .expect("the long write is queued");

            let mut behind = tonic::Request::new(proto::UpsertDocumentsRequest {
                wait: true,
                write_id: "behind-1".into(),
                ..upsert_request(
                    "c",
                    vec![document(
                        "short",
                        "A tailstock holds the far end.",
                        Format::Plain,
                    )],
                )
            });
            behind.set_timeout(Duration::from_millis(1500));
            let status = client
                .upsert_documents(behind)
                .await
                .expect_err("the write waits behind seconds of embedding");
            assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
            assert!(
                status.message().contains("queued as operation")
                    && status.message().contains("will be applied")
                    && status.message().contains("behind-1"),
                "{status:?}"
            );
            let details = status.get_error_details();
            let info = details.error_info().expect("ErrorInfo details");
            assert_eq!(info.reason, "WRITE_QUEUED");
            let id: u64 = info.metadata["operation_id"].parse().unwrap();

            let applied = until_ended(&mut client, id).await;
            assert_eq!(
                state(&applied),
                proto::OperationState::Applied,
                "{applied:?}"
            );
            assert!(doc_ids(&mut client, "c", "tailstock far end")
                .await
                .contains(&"short".to_string()));
            // The retry a client makes after DEADLINE_EXCEEDED queues nothing twice.
            let retried = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    write_id: "behind-1".into(),
                    ..upsert_request(
                        "c",
                        vec![document(
                            "short",
                            "A tailstock holds the far end.",
                            Format::Plain,
                        )],
                    )
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(retried.operation.unwrap().id, id);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_a_write_is_refused_with_a_retry_delay_and_reads_go_on() {
    Fixture::new()
        .config(|config| config.ingest.max_queued_bytes = 1 << 20)
        .collection("c")
        .documents(vec![document(
            "kept",
            "Lathes turn wood on a spindle.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            let big = |prefix: &str| -> Vec<proto::Document> {
                (0..10)
                    .map(|i| {
                        document(
                            &format!("{prefix}{i}"),
                            &long_text(i, 55_000),
                            Format::Plain,
                        )
                    })
                    .collect()
            };
            let first = client
                .upsert_documents(upsert_request("c", big("first")))
                .await
                .expect("a write into an empty queue is taken")
                .into_inner();
            let refused = client
                .upsert_documents(upsert_request("c", big("second")))
                .await
                .expect_err("the queue holds 550 KB of its 1 MiB");
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
            for part in [
                "ingest.max_queued_bytes",
                "1048576",
                "nothing was stored",
                "retry in",
            ] {
                assert!(refused.message().contains(part), "{part}: {refused:?}");
            }
            // gRPC retry policies read the pushback trailer (gRFC A6): retry after the delay.
            let pushback: u64 = refused
                .metadata()
                .get("grpc-retry-pushback-ms")
                .expect("the pushback trailer")
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(pushback >= 1000, "{pushback}");
            let details = refused.get_error_details();
            let retry = details.retry_info().expect("RetryInfo details");
            assert!(retry
                .retry_delay
                .is_some_and(|d| d >= Duration::from_secs(1)));

            // Reads and health go on while the queue is full.
            let started = Instant::now();
            assert!(doc_ids(&mut client, "c", "spindle")
                .await
                .contains(&"kept".to_string()));
            assert!(started.elapsed() < Duration::from_secs(60));

            // Nothing of the refused write was stored; once the queue drains, it is taken.
            let applied = until_ended(&mut client, first.operation.unwrap().id).await;
            assert_eq!(state(&applied), proto::OperationState::Applied);
            assert_eq!(collection_stats(&mut client, "c").await.documents, 11);
            client
                .upsert_documents(upsert_request("c", big("second")))
                .await
                .expect("taken once the queue has room");
        })
        .await;
}

const KILL_ROUNDS: usize = 10;
const KILL_DOCUMENTS: usize = 8;
const KILL_SECTIONS: usize = 3;

/// Document `doc` at write `sequence`: three caller sections, each carrying the marker.
fn marked_document(doc: usize, sequence: u64) -> proto::Document {
    let mut text = String::new();
    let mut sections = Vec::new();
    for part in 0..KILL_SECTIONS {
        let start = text.chars().count() as u64;
        text.push_str(&long_text(doc * 10 + part, 1200));
        text.push_str(&format!(
            "Part {part} of doc{doc} carries marker{sequence}end.\n\n"
        ));
        sections.push(proto::SectionBoundary {
            start,
            end: text.chars().count() as u64 - 2,
            title: format!("part {part}"),
        });
    }
    let mut document = document(&format!("doc{doc}"), &text, Format::Plain);
    document.sections = sections;
    document
}

/// The markers of every section the server holds of `doc` (empty when it holds none).
async fn markers(client: &mut LatheClient<Channel>, doc: usize) -> Vec<u64> {
    let mut request = retrieve_request("q", &format!("doc{doc} carries marker"), 16_384);
    request.top_k = Some(20);
    request.filter = Some(proto::Filter {
        metadata: vec![],
        doc_ids: vec![format!("doc{doc}")],
    });
    request.chunking = Some(proto::ChunkingOptions {
        strategy: proto::ChunkStrategy::Fixed as i32,
        max_tokens: Some(2048),
        overlap_tokens: Some(0),
        ..Default::default()
    });
    let mut found: Vec<u64> = retrieve(client, request)
        .await
        .chunks
        .iter()
        .flat_map(|chunk| {
            chunk
                .text
                .split("marker")
                .skip(1)
                .filter_map(|rest| rest.split("end").next()?.parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_queued_writes_survive_sigkill_and_apply_once_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    // What the server acknowledged, per document: the sequence of its last write (None: deleted).
    let mut known: HashMap<usize, Option<u64>> = HashMap::new();
    let mut sequence = 0u64;
    let mut seed = 0x9e3779b97f4a7c15_u64;
    let mut next_random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut last_write: Option<(proto::UpsertDocumentsRequest, u64)> = None;
    let mut killed_with_work_pending = 0;
    // Each round verifies what the rounds before acknowledged; the last only verifies.
    for round in 0..=KILL_ROUNDS {
        let server = binary::start(dir.path(), &[]);
        let mut child = server.child;
        let mut client = binary::connect(&server.address).await;
        if round == 0 {
            create_collection(&mut client, "q").await;
        }
        // What was queued before the kill is applied now, once, whole.
        drain_queue(&mut client, "q").await;
        for (&doc, expected) in &known {
            let found = markers(&mut client, doc).await;
            let wanted = match expected {
                Some(sequence) => vec![*sequence; KILL_SECTIONS],
                None => vec![],
            };
            assert_eq!(found, wanted, "round {round}: doc{doc}");
        }
        let present = known.values().filter(|v| v.is_some()).count() as u64;
        let stats = collection_stats(&mut client, "q").await;
        assert_eq!(stats.documents, present, "round {round}");
        assert_eq!(
            stats.sections,
            present * KILL_SECTIONS as u64,
            "round {round}"
        );
        // A retry of the last acknowledged write, after the restart, queues nothing.
        if let Some((request, id)) = &last_write {
            let again = client
                .upsert_documents(request.clone())
                .await
                .unwrap()
                .into_inner();
            assert_eq!(again.operation.unwrap().id, *id, "round {round}");
        }

        if round == KILL_ROUNDS {
            child.kill().expect("stop");
            let _ = child.wait();
            break;
        }
        // Queue writes without waiting, then kill at a random point of the worker's progress.
        for _ in 0..(3 + next_random() % 4) {
            let doc = (next_random() % KILL_DOCUMENTS as u64) as usize;
            sequence += 1;
            let write_id = format!("w{sequence}");
            if next_random() % 5 == 0 {
                client
                    .delete_documents(proto::DeleteDocumentsRequest {
                        collection: "q".into(),
                        ids: vec![format!("doc{doc}")],
                        wait: false,
                        write_id,
                    })
                    .await
                    .expect("delete acknowledged");
                known.insert(doc, None);
            } else {
                let request = proto::UpsertDocumentsRequest {
                    write_id,
                    ..upsert_request("q", vec![marked_document(doc, sequence)])
                };
                let response = client
                    .upsert_documents(request.clone())
                    .await
                    .expect("upsert acknowledged")
                    .into_inner();
                last_write = Some((request, response.operation.unwrap().id));
                known.insert(doc, Some(sequence));
            }
        }
        tokio::time::sleep(Duration::from_millis(next_random() % 2500)).await;
        let listed = client
            .list_operations(proto::ListOperationsRequest {
                collection: "q".into(),
                limit: 1,
            })
            .await
            .unwrap()
            .into_inner()
            .operations;
        if listed
            .first()
            .is_some_and(|o| state(o) != proto::OperationState::Applied)
        {
            killed_with_work_pending += 1;
        }
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }
    assert!(
        killed_with_work_pending >= 3,
        "the kills must land while writes are queued or running: {killed_with_work_pending} of {KILL_ROUNDS}"
    );
}
