//! Calls cut short (rows 52 to 56 of docs/bad-input.md): a client that gives up mid-write gets
//! every batch applied whole or not at all, a deadline shorter than the work is answered
//! DEADLINE_EXCEEDED, and calls over the concurrency limit are shed with RESOURCE_EXHAUSTED
//! without hanging or losing a permit; the server keeps serving after each.

mod common;

use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::proto::DocumentFormat as Format;
use tonic::transport::Channel;
use tonic::Code;

/// A client that gives up (drops the call) mid-upload or mid-write: every batch is applied whole
/// or not at all, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_uploads_and_writes_are_applied_whole_or_not_at_all() {
    Fixture::new()
        .collection("c")
        .documents(vec![document(
            "keep",
            "Dovetail joints by hand.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            // A streaming upload that sends two batches (3 and 5 documents) and then stalls.
            let (sender, receiver) = tokio::sync::mpsc::channel(4);
            let batch = |prefix: &str, count: usize| proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents: (0..count)
                    .map(|i| {
                        document(
                            &format!("{prefix}{i}"),
                            &format!("Mortise {prefix} {i}."),
                            Format::Plain,
                        )
                    })
                    .collect(),
                wait: true,
                write_id: String::new(),
            };
            sender.send(batch("a", 3)).await.unwrap();
            sender.send(batch("b", 5)).await.unwrap();
            let upload =
                client.upload_documents(tokio_stream::wrappers::ReceiverStream::new(receiver));
            let cut = tokio::time::timeout(Duration::from_millis(300), upload).await;
            assert!(
                cut.is_err(),
                "the upload cannot finish while its stream is open"
            );
            drop(sender);

            // A unary wait-write of 100 documents, dropped by the client after 20 ms.
            let documents: Vec<_> = (0..100)
                .map(|i| {
                    document(
                        &format!("w{i}"),
                        &format!("Tenon number {i} with a shoulder."),
                        Format::Plain,
                    )
                })
                .collect();
            let write = client.upsert_documents(proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents,
                wait: true,
                write_id: String::new(),
            });
            let _ = tokio::time::timeout(Duration::from_millis(20), write).await;

            // A wait write commits whatever the cancelled calls queued.
            let mut fresh = client.clone();
            upsert(
                &mut fresh,
                "c",
                vec![document("after", "Marking gauges.", Format::Plain)],
            )
            .await;
            let applied = collection_stats(&mut fresh, "c").await.documents - 2;
            let upload_part = applied % 100;
            let write_part = applied - upload_part;
            assert!(
                [0, 3, 8].contains(&upload_part),
                "upload applied {upload_part} documents"
            );
            assert!(
                [0, 100].contains(&write_part),
                "write applied {write_part} documents"
            );
            still_serving(&mut fresh, "c", "dovetail", "keep").await;
            still_serving(&mut fresh, "c", "gauges", "after").await;
        })
        .await;
}

/// A client deadline shorter than the work: DEADLINE_EXCEEDED naming the deadline, and the server
/// keeps serving. The work is longer than the deadline by construction, not by the speed of the
/// build: the request message is withheld until the answer has come, and no server can finish a
/// Retrieve it has not received (in a release build, 20 short documents are searched within
/// 1 ms, so a deadline that relied on the search being slow was met).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_work_is_deadline_exceeded() {
    let documents: Vec<_> = (0..20)
        .map(|i| {
            document(
                &format!("d{i}"),
                &format!("Bench plane {i} shavings and a sharp iron."),
                Format::Plain,
            )
        })
        .collect();
    Fixture::new()
        .collection("c")
        .documents(documents)
        .run(|served| async move {
            let mut client = served.client;
            // The server's own answer, seen through a raw HTTP/2 client.
            for (i, timeout, shown) in [(0, "1m", "1 ms"), (1, "50m", "50 ms")] {
                let (code, message) = raw_retrieve_with_grpc_timeout(
                    served.address,
                    retrieve_request("c", &format!("plane iron {i}"), 300),
                    timeout,
                )
                .await;
                assert_eq!(code, Code::DeadlineExceeded as i32, "{message}");
                assert!(
                    message.contains("Retrieve")
                        && message.contains("deadline")
                        && message.contains(shown),
                    "{message}"
                );
            }
            // tonic's client enforces the same grpc-timeout itself and reports its own expiry as
            // CANCELLED "Timeout expired" when its timer fires before the server's answer arrives.
            // It sends a unary request at once, so the held-back work is an upload whose stream
            // stays open: the call cannot end before its deadline.
            for _ in 0..10 {
                let (_open, batches) =
                    tokio::sync::mpsc::channel::<proto::UpsertDocumentsRequest>(1);
                let mut request =
                    tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(batches));
                request.set_timeout(Duration::from_millis(1));
                let status = client.upload_documents(request).await.unwrap_err();
                assert!(
                    status.code() == Code::DeadlineExceeded
                        || (status.code() == Code::Cancelled
                            && status.message() == "Timeout expired"),
                    "{status:?}"
                );
            }
            still_serving(&mut client, "c", "plane iron", "d0").await;
        })
        .await;
}

/// Sends the headers of one Retrieve over a bare HTTP/2 stream with `grpc-timeout: timeout`,
/// holds the request message back until the server has answered, and returns the server's
/// grpc-status and grpc-message (from the headers of a trailers-only answer, or the trailers).
async fn raw_retrieve_with_grpc_timeout(
    address: std::net::SocketAddr,
    request: proto::RetrieveRequest,
    timeout: &str,
) -> (i32, String) {
    use prost::Message;
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let head = http::Request::post(format!("http://{address}/lathe.v1.Lathe/Retrieve"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(head, false).unwrap();
    let response = response.await.unwrap();
    // Only now the message: the server answered without it, so before any work could be done.
    let message = request.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    // The stream may be closed already: a failed send is not the question here.
    let _ = body.send_data(prost::bytes::Bytes::from(frame), true);
    let read = |headers: &http::HeaderMap| {
        let code = headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok());
        let message = headers
            .get("grpc-message")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).replace("%20", " "))
            .unwrap_or_default();
        code.map(|code| (code, message))
    };
    if let Some(answer) = read(response.headers()) {
        return answer;
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    read(&trailers).expect("grpc-status in the trailers")
}

/// 10,000 Retrieve calls at once over 100 connections against `server.max_concurrent_requests =
/// 16`: each ends OK or RESOURCE_EXHAUSTED, none hangs, and no permit is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_calls_end_ok_or_resource_exhausted() {
    const CALLS: usize = 10_000;
    const CONNECTIONS: usize = 100;
    const LIMIT: usize = 16;
    Fixture::lexical()
        .config(|config| config.server.max_concurrent_requests = LIMIT)
        .collection("c")
        .documents(vec![document(
            "d",
            "Coping saws cut curves.",
            Format::Plain,
        )])
        .run(|served| async move {
            let mut client = served.client.clone();
            let mut clients = Vec::with_capacity(CONNECTIONS);
            for _ in 0..CONNECTIONS {
                let channel = Channel::from_shared(served.channel_uri())
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
                clients.push(LatheClient::new(channel));
            }
            let storm = |clients: &Vec<LatheClient<Channel>>| {
                let mut calls = tokio::task::JoinSet::new();
                for i in 0..CALLS {
                    let mut client = clients[i % CONNECTIONS].clone();
                    calls.spawn(async move {
                        let request =
                            retrieve_request("c", &format!("coping saws {}", i % 50), 100);
                        match client.retrieve(request).await {
                            Ok(_) => Code::Ok,
                            Err(status) => {
                                if status.code() == Code::ResourceExhausted {
                                    assert!(
                                        status.message().contains("server.max_concurrent_requests"),
                                        "{status:?}"
                                    );
                                }
                                status.code()
                            }
                        }
                    });
                }
                async move {
                    let mut counts = std::collections::BTreeMap::<i32, usize>::new();
                    while let Some(code) = calls.join_next().await {
                        *counts.entry(code.expect("call task") as i32).or_default() += 1;
                    }
                    counts
                }
            };

            // Hold every permit with uploads whose streams stay open: all 10,000 calls are shed.
            let hold = |client: &LatheClient<Channel>| {
                let (sender, receiver) =
                    tokio::sync::mpsc::channel::<proto::UpsertDocumentsRequest>(1);
                let mut holder = client.clone();
                let task = tokio::spawn(async move {
                    holder
                        .upload_documents(tokio_stream::wrappers::ReceiverStream::new(receiver))
                        .await
                        .map(|_| ())
                });
                (task, sender)
            };
            let mut holders: Vec<_> = clients.iter().take(LIMIT).map(hold).collect();
            loop {
                // A holder that lost its slot to the probe below was shed: it holds nothing, so
                // another takes its place.
                for (slot, client) in holders.iter_mut().zip(&clients) {
                    if slot.0.is_finished() {
                        let (finished, _) = std::mem::replace(slot, hold(client));
                        let status = finished
                            .await
                            .unwrap()
                            .expect_err("an open upload cannot end");
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    }
                }
                // Shed only once the holders have every slot.
                match client.retrieve(retrieve_request("c", "coping", 100)).await {
                    Err(status) if status.code() == Code::ResourceExhausted => break,
                    _ => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            let counts = storm(&clients).await;
            assert_eq!(
                counts,
                [(Code::ResourceExhausted as i32, CALLS)].into(),
                "{counts:?}"
            );

            // Release them: the storm now ends in OK and RESOURCE_EXHAUSTED only.
            for (task, sender) in holders {
                drop(sender);
                task.await.unwrap().expect("a held upload ends OK");
            }
            let counts = storm(&clients).await;
            let ok = counts.get(&(Code::Ok as i32)).copied().unwrap_or(0);
            let shed = counts
                .get(&(Code::ResourceExhausted as i32))
                .copied()
                .unwrap_or(0);
            assert_eq!(ok + shed, CALLS, "{counts:?}");
            assert!(ok >= 1, "{counts:?}");
            eprintln!("10,000 concurrent Retrieve calls: {ok} OK, {shed} RESOURCE_EXHAUSTED");

            // No permit leaked: LIMIT calls at once are all admitted.
            let mut calls = tokio::task::JoinSet::new();
            for client in clients.iter().take(LIMIT) {
                let mut client = client.clone();
                calls.spawn(async move {
                    client
                        .retrieve(retrieve_request("c", "coping", 100))
                        .await
                        .map(|_| ())
                });
            }
            while let Some(result) = calls.join_next().await {
                result.unwrap().expect("admitted once the storm is over");
            }
            still_serving(&mut client, "c", "coping saws", "d").await;
        })
        .await;
}
