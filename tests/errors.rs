//! Every bad input gets the right status and a message naming the field and the allowed range;
//! nothing is half-applied and the server keeps serving.

mod common;

use common::*;
use lathe::api::proto;
use lathe::api::proto::DocumentFormat as Format;
use tonic::Code;

fn chunking(
    strategy: i32,
    max_tokens: Option<u32>,
    overlap_tokens: Option<u32>,
) -> Option<proto::ChunkingOptions> {
    Some(proto::ChunkingOptions {
        strategy,
        max_tokens,
        overlap_tokens,
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieve_arguments_are_checked_with_field_and_range() {
    Fixture::new()
        .collection("c")
        .documents(vec![document(
            "d",
            "Some text about lathes and chisels.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            let base = || retrieve_request("c", "lathes", 100);
            let cases: Vec<(proto::RetrieveRequest, &[&str])> = vec![
                (
                    proto::RetrieveRequest {
                        query: String::new(),
                        ..base()
                    },
                    &["query", "non-whitespace"],
                ),
                (
                    proto::RetrieveRequest {
                        query: " \n\t ".into(),
                        ..base()
                    },
                    &["query", "non-whitespace"],
                ),
                (
                    proto::RetrieveRequest {
                        query: "x".repeat(20_000),
                        ..base()
                    },
                    &["query", "1..=16384"],
                ),
                (
                    proto::RetrieveRequest {
                        token_budget: 0,
                        ..base()
                    },
                    &["token_budget", "1..=32768"],
                ),
                (
                    proto::RetrieveRequest {
                        token_budget: 32_769,
                        ..base()
                    },
                    &["token_budget", "1..=32768"],
                ),
                (
                    proto::RetrieveRequest {
                        top_k: Some(0),
                        ..base()
                    },
                    &["top_k", "1..=100"],
                ),
                (
                    proto::RetrieveRequest {
                        top_k: Some(1_000_000),
                        ..base()
                    },
                    &["top_k", "1..=100"],
                ),
                (
                    proto::RetrieveRequest {
                        chunking: chunking(42, None, None),
                        ..base()
                    },
                    &["chunking.strategy", "unknown strategy"],
                ),
                (
                    proto::RetrieveRequest {
                        chunking: chunking(1, Some(0), None),
                        ..base()
                    },
                    &["chunking.max_tokens", "1..=8192"],
                ),
                (
                    proto::RetrieveRequest {
                        chunking: chunking(1, Some(16), Some(16)),
                        ..base()
                    },
                    &["chunking.overlap_tokens", "0..=15"],
                ),
                (
                    proto::RetrieveRequest {
                        chunking: chunking(2, Some(16), Some(40)),
                        ..base()
                    },
                    &["chunking.overlap_tokens", "below"],
                ),
                (
                    proto::RetrieveRequest { order: 9, ..base() },
                    &["order", "unknown order"],
                ),
                (
                    proto::RetrieveRequest {
                        min_score: Some(f32::INFINITY),
                        ..base()
                    },
                    &["min_score", "finite"],
                ),
                (
                    proto::RetrieveRequest {
                        max_chunks_per_document: Some(0),
                        ..base()
                    },
                    &["max_chunks_per_document", "1..=1000"],
                ),
                (
                    proto::RetrieveRequest {
                        diversity: Some(-0.5),
                        ..base()
                    },
                    &["diversity", "0..=1"],
                ),
            ];
            for (request, needles) in cases {
                expect_code(
                    client.retrieve(request).await,
                    Code::InvalidArgument,
                    needles,
                );
            }
            expect_code(
                client
                    .retrieve(retrieve_request("nope", "lathes", 10))
                    .await,
                Code::NotFound,
                &["nope"],
            );
            // Still serving.
            assert!(!retrieve(&mut client, base()).await.chunks.is_empty());
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_arguments_are_checked_and_nothing_is_half_applied() {
    Fixture::new()
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            expect_code(
                client
                    .create_collection(proto::CreateCollectionRequest {
                        name: "c".into(),
                        settings: None,
                    })
                    .await,
                Code::AlreadyExists,
                &["`c`"],
            );
            expect_code(
                client
                    .create_collection(proto::CreateCollectionRequest {
                        name: "../evil".into(),
                        settings: None,
                    })
                    .await,
                Code::InvalidArgument,
                &["name", "[A-Za-z0-9_-]"],
            );
            expect_code(
                client
                    .create_collection(proto::CreateCollectionRequest {
                        name: "t".into(),
                        settings: Some(proto::CollectionSettings {
                            budget_tokenizer: "gpt9".into(),
                            ..Default::default()
                        }),
                    })
                    .await,
                Code::InvalidArgument,
                &["settings.budget_tokenizer", "cl100k_base"],
            );

            let upsert_request = |documents| proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents,
                wait: true,
                write_id: String::new(),
            };
            let good = document(
                "good",
                "A valid document that must not be applied alone.",
                Format::Plain,
            );
            let mut unknown_format = document("bad", "text", Format::Plain);
            unknown_format.format = 7;
            expect_code(
                client
                    .upsert_documents(upsert_request(vec![good.clone(), unknown_format]))
                    .await,
                Code::InvalidArgument,
                &["documents[1].format", "unknown format"],
            );
            expect_code(
                client
                    .upsert_documents(upsert_request(vec![
                        good.clone(),
                        document("", "text", Format::Plain),
                    ]))
                    .await,
                Code::InvalidArgument,
                &["documents[1].id", "empty"],
            );
            expect_code(
                client
                    .upsert_documents(upsert_request(vec![good.clone(), good.clone()]))
                    .await,
                Code::InvalidArgument,
                &["documents[1].id", "more than once"],
            );
            let mut bad_sections = document("s", "short text", Format::Plain);
            bad_sections.sections = vec![proto::SectionBoundary {
                start: 0,
                end: 500,
                title: String::new(),
            }];
            expect_code(
                client
                    .upsert_documents(upsert_request(vec![good.clone(), bad_sections]))
                    .await,
                Code::InvalidArgument,
                &["sections"],
            );
            let mut empty_key = document("m", "text", Format::Plain);
            empty_key.metadata.insert(String::new(), "v".into());
            expect_code(
                client
                    .upsert_documents(upsert_request(vec![empty_key]))
                    .await,
                Code::InvalidArgument,
                &["documents[0].metadata", "keys"],
            );
            expect_code(
                client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: "missing".into(),
                        documents: vec![good.clone()],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::NotFound,
                &["missing"],
            );

            // None of the rejected batches left anything behind.
            let stats = collection_stats(&mut client, "c").await;
            assert_eq!(stats.documents, 0);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_and_documents_are_resource_exhausted() {
    Fixture::new()
        .config(|config| {
            config.limits.max_message_bytes = 64 * 1024;
            config.limits.max_document_bytes = 16 * 1024;
        })
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            let huge = document("huge", &"word ".repeat(40_000), Format::Plain);
            let status = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: vec![huge],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(
                status.message().contains("too large"),
                "{}",
                status.message()
            );

            let just_over = document("over", &"x".repeat(16 * 1024 + 1), Format::Plain);
            let status = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: vec![just_over],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(
                status.message().contains("documents[0].text")
                    && status.message().contains("16384"),
                "{}",
                status.message()
            );
            let at_limit = document("limit", &"x".repeat(16 * 1024), Format::Plain);
            upsert(&mut client, "c", vec![at_limit]).await;
        })
        .await;
}
