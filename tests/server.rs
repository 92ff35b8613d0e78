//! End-to-end behaviour through the real gRPC server: ingest in every format, retrieval within the
//! budget with exact offsets, replace and delete semantics, cache freshness, filters, ordering,
//! streaming upload, restart durability, health and reflection.

mod common;

use common::*;
use lathe::api::proto;
use lathe::api::proto::DocumentFormat as Format;

const MARKDOWN: &str = "# Installing Lathe\n\nLathe ships as one binary.\n\n## On Debian\n\nRun the installer with apt and then start the service. The daemon listens on port 50051.\n\n## On macOS\n\nUse Homebrew to install the formula.\n\n```sh\n# not a heading\nbrew install lathe\n```\n";
const HTML: &str = "<html><head><title>Guide</title><style>p { color: red }</style><script>var secret = 'scriptword';</script></head><body><h1>Volcanoes</h1><p>A volcano is a rupture in the crust of a planet.</p><h2>Eruptions</h2><p>Magma rises through vents and erupts as lava flows &amp; ash clouds.</p></body></html>";
const PLAIN: &str = "The quarterly report showed revenue growth of twelve percent.\n\nThe board approved a new dividend policy for shareholders.\n\nOperating costs fell because the logistics network was consolidated into three hubs.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingests_every_format_and_retrieves_within_budget_with_exact_offsets() {
    Fixture::new()
        .collection("docs")
        .documents(vec![
            document("guide.md", MARKDOWN, Format::Markdown),
            document("volcano.html", HTML, Format::Html),
            document("report.txt", PLAIN, Format::Plain),
        ])
        .run(|served| async move {
            let mut client = served.client;
            let written = served.written.expect("the fixture's upsert");
            assert_eq!(written.documents, 3);
            assert!(written.sections >= 3);
            assert!(
                written.generation > 0,
                "a wait write reports the generation it is visible at"
            );

            // Markdown: the heading path becomes the section title; offsets slice the original text.
            let response = retrieve(
                &mut client,
                retrieve_request("docs", "which port does the daemon listen on", 64),
            )
            .await;
            let best = &response.chunks[0];
            assert_eq!(best.doc_id, "guide.md");
            assert!(best.text.contains("50051"));
            assert_eq!(best.heading_path, vec!["Installing Lathe", "On Debian"]);
            let (bytes, chars) = (best.bytes.unwrap(), best.chars.unwrap());
            assert_eq!(
                &MARKDOWN[bytes.start as usize..bytes.end as usize],
                best.text
            );
            assert_eq!(char_slice(MARKDOWN, chars.start, chars.end), best.text);
            assert!(response.tokens_used <= 64);

            // HTML: text extracted, scripts and styles dropped.
            let response = retrieve(
                &mut client,
                retrieve_request("docs", "how does magma erupt", 64),
            )
            .await;
            assert_eq!(response.chunks[0].doc_id, "volcano.html");
            assert!(response.chunks[0].text.contains("lava flows & ash clouds"));
            let scripted = retrieve(
                &mut client,
                retrieve_request("docs", "scriptword secret", 64),
            )
            .await;
            assert!(scripted
                .chunks
                .iter()
                .all(|c| !c.text.contains("scriptword")));

            // Plain text.
            let response =
                retrieve(&mut client, retrieve_request("docs", "dividend policy", 32)).await;
            let best = &response.chunks[0];
            assert_eq!(best.doc_id, "report.txt");
            assert!(best.text.contains("dividend"));
            let chars = best.chars.unwrap();
            assert_eq!(char_slice(PLAIN, chars.start, chars.end), best.text);

            // Timings for each stage, and the cache answers the same request again.
            let stages: Vec<&str> = response.timings.iter().map(|t| t.stage.as_str()).collect();
            for stage in ["coarse", "analyze", "rechunk", "score", "pack", "total"] {
                assert!(stages.contains(&stage), "{stages:?}");
            }
            assert!(!response.cache_hit);
            let again = retrieve(
                &mut client,
                retrieve_request("docs", "  dividend   policy ", 32),
            )
            .await;
            assert!(again.cache_hit, "normalised query hits the cache");
            assert_eq!(again.chunks, response.chunks);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_is_never_exceeded_and_no_text_is_returned_twice() {
    let docs = std::fs::read_to_string("../shared/eval/squad-a/docs.jsonl")
        .or_else(|_| {
            std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/eval/squad-a/docs.jsonl"
            ))
        })
        .expect("the squad-a eval set beside the repo");
    let mut texts = std::collections::HashMap::new();
    let documents: Vec<proto::Document> = docs
        .lines()
        .take(6)
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = value["doc_id"].as_str().unwrap().to_string();
            let text = value["text"].as_str().unwrap().to_string();
            texts.insert(id.clone(), text.clone());
            document(&id, &text, Format::Plain)
        })
        .collect();
    Fixture::new()
        .collection("squad")
        .documents(documents)
        .run(|Served { mut client, .. }| async move {
            let questions = [
                "Who won Super Bowl 50?",
                "What is the capital?",
                "When was the university founded?",
                "the and of",
            ];
            // `None`: no chunking options, so the sections are cut at the budget's sizes (half, once
            // and twice its chunk size), candidates that overlap each other.
            let strategies = [
                Some(proto::ChunkStrategy::Fixed),
                Some(proto::ChunkStrategy::Sentence),
                None,
            ];
            for budget in [1, 7, 32, 128, 512, 2048] {
                for strategy in strategies {
                    for question in questions {
                        let mut request = retrieve_request("squad", question, budget);
                        request.chunking = strategy.map(|strategy| proto::ChunkingOptions {
                            strategy: strategy as i32,
                            max_tokens: Some(48),
                            overlap_tokens: Some(if strategy == proto::ChunkStrategy::Fixed {
                                16
                            } else {
                                0
                            }),
                            ..Default::default()
                        });
                        let response = retrieve(&mut client, request).await;
                        let recounted: usize =
                            response.chunks.iter().map(|c| minilm_count(&c.text)).sum();
                        assert!(
                            recounted <= budget as usize,
                            "{recounted} tokens over budget {budget}"
                        );
                        assert_eq!(response.tokens_used as usize, recounted);
                        let mut spans: Vec<(String, u64, u64)> = Vec::new();
                        for chunk in &response.chunks {
                            let bytes = chunk.bytes.unwrap();
                            let text = &texts[&chunk.doc_id];
                            assert_eq!(&text[bytes.start as usize..bytes.end as usize], chunk.text);
                            for (doc, start, end) in &spans {
                                assert!(
                                    *doc != chunk.doc_id
                                        || bytes.end <= *start
                                        || bytes.start >= *end,
                                    "text returned twice: {start}..{end} and {}..{}",
                                    bytes.start,
                                    bytes.end
                                );
                            }
                            spans.push((chunk.doc_id.clone(), bytes.start, bytes.end));
                        }
                    }
                }
            }
            // Without a size the same sections are cut at 32, 64 and 128 tokens: more candidates than
            // the 64-token chunks alone.
            let question = questions[0];
            let defaults = retrieve(&mut client, retrieve_request("squad", question, 512)).await;
            let mut one_size = retrieve_request("squad", question, 512);
            one_size.chunking = Some(proto::ChunkingOptions {
                strategy: proto::ChunkStrategy::Sentence as i32,
                max_tokens: Some(64),
                ..Default::default()
            });
            let one_size = retrieve(&mut client, one_size).await;
            assert_eq!(defaults.sections_considered, one_size.sections_considered);
            assert!(
                defaults.chunks_considered > one_size.chunks_considered,
                "{} candidates without a size, {} with 64 tokens",
                defaults.chunks_considered,
                one_size.chunks_considered
            );
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_replaces_delete_removes_and_writes_invalidate_the_cache() {
    Fixture::new()
        .collection("c")
        .documents(vec![document(
            "a",
            "The old zeppelin text about airships.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            let first = retrieve(&mut client, retrieve_request("c", "zeppelin airships", 64)).await;
            assert!(first.chunks[0].text.contains("old zeppelin"));
            let cached =
                retrieve(&mut client, retrieve_request("c", "zeppelin airships", 64)).await;
            assert!(cached.cache_hit);

            upsert(
                &mut client,
                "c",
                vec![document(
                    "a",
                    "The new zeppelin text about airships and blimps.",
                    Format::Plain,
                )],
            )
            .await;
            let after = retrieve(&mut client, retrieve_request("c", "zeppelin airships", 64)).await;
            assert!(
                !after.cache_hit,
                "a write moves the generation: the cached answer is not served"
            );
            assert_eq!(after.chunks.len(), 1, "the old version's sections are gone");
            assert!(after.chunks[0].text.contains("new zeppelin"));
            let stats = collection_stats(&mut client, "c").await;
            assert_eq!((stats.documents, stats.sections), (1, 1));
            assert_eq!(
                stats.bytes,
                "The new zeppelin text about airships and blimps.".len() as u64
            );

            let deleted = client
                .delete_documents(proto::DeleteDocumentsRequest {
                    collection: "c".into(),
                    ids: vec!["a".into()],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(deleted.generation > after.generation);
            let gone = retrieve(&mut client, retrieve_request("c", "zeppelin airships", 64)).await;
            assert!(gone.chunks.is_empty());
            assert!(!gone.cache_hit);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_position_order() {
    let mut a = document(
        "a",
        "Rust ownership rules.\n\nBorrowing in Rust avoids data races.",
        Format::Plain,
    );
    a.metadata.insert("lang".into(), "rust".into());
    let mut b = document(
        "b",
        "Go has goroutines and Rust has async tasks.",
        Format::Plain,
    );
    b.metadata.insert("lang".into(), "go".into());
    Fixture::new()
        .collection("c")
        .documents(vec![a, b])
        .run(|Served { mut client, .. }| async move {
            let mut request = retrieve_request("c", "rust", 256);
            request.filter = Some(proto::Filter {
                metadata: vec![proto::MetadataTerm {
                    key: "lang".into(),
                    value: "go".into(),
                }],
                doc_ids: vec![],
            });
            let response = retrieve(&mut client, request).await;
            assert!(!response.chunks.is_empty());
            assert!(response
                .chunks
                .iter()
                .all(|c| c.doc_id == "b" && c.metadata["lang"] == "go"));

            let mut request = retrieve_request("c", "rust", 256);
            request.filter = Some(proto::Filter {
                metadata: vec![],
                doc_ids: vec!["a".into()],
            });
            let response = retrieve(&mut client, request).await;
            assert!(!response.chunks.is_empty() && response.chunks.iter().all(|c| c.doc_id == "a"));

            let mut request = retrieve_request("c", "rust", 256);
            request.filter = Some(proto::Filter {
                metadata: vec![proto::MetadataTerm {
                    key: "missing".into(),
                    value: "x".into(),
                }],
                doc_ids: vec![],
            });
            assert!(
                retrieve(&mut client, request).await.chunks.is_empty(),
                "a filter on a missing key matches nothing"
            );

            // Score order puts the strongest chunk (at the end of the document) first; position order
            // returns the same spans in document order.
            let filler = "Nothing relevant is said in this sentence at all. ".repeat(30);
            let text = format!("Ownership is strict. {filler}Borrowing avoids data races.");
            upsert(&mut client, "c", vec![document("p", &text, Format::Plain)]).await;
            let ordered = |order: proto::ResultOrder| {
                let mut request = retrieve_request("c", "borrowing data races ownership", 12);
                request.order = order as i32;
                request.filter = Some(proto::Filter {
                    metadata: vec![],
                    doc_ids: vec!["p".into()],
                });
                request.chunking = Some(proto::ChunkingOptions {
                    strategy: proto::ChunkStrategy::Sentence as i32,
                    max_tokens: Some(8),
                    ..Default::default()
                });
                request
            };
            let by_score = retrieve(&mut client, ordered(proto::ResultOrder::Score)).await;
            let by_position = retrieve(&mut client, ordered(proto::ResultOrder::Position)).await;
            let starts = |response: &proto::RetrieveResponse| {
                response
                    .chunks
                    .iter()
                    .map(|c| c.bytes.unwrap().start)
                    .collect::<Vec<_>>()
            };
            assert!(
                by_score.chunks[0]
                    .text
                    .contains("Borrowing avoids data races."),
                "{by_score:?}"
            );
            assert!(
                by_score.chunks[1].text.contains("Ownership is strict."),
                "{by_score:?}"
            );
            let mut sorted = starts(&by_score);
            sorted.sort_unstable();
            assert_eq!(starts(&by_position), sorted);
            assert_ne!(starts(&by_score), sorted);

            // Position order reads each chunk under its heading path, counted in the budget: the same
            // chunks cost more tokens than in score order, and the budget still holds.
            let guide =
        "# Guide\n\n## Install on Debian\n\nRun apt install lathe as root. It takes a minute.\n\n\
                 ## Upgrade\n\nRun apt upgrade lathe. The data directory is kept.\n";
            upsert(
                &mut client,
                "c",
                vec![document("g", guide, Format::Markdown)],
            )
            .await;
            let headed = |order: proto::ResultOrder, budget: u32| {
                let mut request = retrieve_request("c", "apt install lathe upgrade", budget);
                request.order = order as i32;
                request.filter = Some(proto::Filter {
                    metadata: vec![],
                    doc_ids: vec!["g".into()],
                });
                request
            };
            let by_score = retrieve(&mut client, headed(proto::ResultOrder::Score, 200)).await;
            let by_position =
                retrieve(&mut client, headed(proto::ResultOrder::Position, 200)).await;
            assert!(
                by_score.chunks.iter().all(|c| c.context.is_empty()),
                "{by_score:?}"
            );
            assert_eq!(
                by_position.chunks.len(),
                by_score.chunks.len(),
                "{by_position:?}"
            );
            for chunk in &by_position.chunks {
                assert!(
                    chunk.heading_path.first().is_some_and(|h| h == "Guide"),
                    "{chunk:?}"
                );
                assert_eq!(chunk.context, chunk.heading_path.join(" > "), "{chunk:?}");
            }
            let tokens =
                |r: &proto::RetrieveResponse| r.chunks.iter().map(|c| c.token_count).sum::<u32>();
            assert_eq!(tokens(&by_position), by_position.tokens_used);
            assert!(
                by_position.tokens_used > by_score.tokens_used,
                "{by_position:?}"
            );
            // A budget that holds the text alone but not with its heading lines takes less.
            let tight = retrieve(
                &mut client,
                headed(proto::ResultOrder::Position, by_score.tokens_used),
            )
            .await;
            assert!(tight.tokens_used <= by_score.tokens_used, "{tight:?}");
            assert!(
                tight.chunks.iter().map(|c| c.text.len()).sum::<usize>()
                    < by_score.chunks.iter().map(|c| c.text.len()).sum::<usize>(),
                "{tight:?}"
            );
        })
        .await;
}

/// An answer running over a section boundary comes back as one chunk: the spans of the two
/// neighbouring sections are joined with the whitespace between them, exactly as the document
/// has it, in either order and within the budget; a section under another heading stays apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_neighbouring_sections_come_back_as_one_exact_chunk() {
    let parts = [
        (
            "Pilots",
            "Harbour pilots guide every tanker through the narrow channel.",
        ),
        (
            "Pilots",
            "Each pilot boards the tanker two miles out, by ladder.",
        ),
        ("Museum", "The maritime museum opens at nine on weekdays."),
    ];
    let mut text = String::new();
    let mut sections = Vec::new();
    for (title, part) in parts {
        if !text.is_empty() {
            text.push_str("\n\n  ");
        }
        let start = text.chars().count() as u64;
        text.push_str(part);
        sections.push(proto::SectionBoundary {
            start,
            end: text.chars().count() as u64,
            title: title.to_string(),
        });
    }
    let mut port = document("port", &text, Format::Plain);
    port.sections = sections;
    Fixture::new()
        .collection("c")
        .documents(vec![port])
        .run(|Served { mut client, .. }| async move {
            for order in [proto::ResultOrder::Score, proto::ResultOrder::Position] {
                let mut request = retrieve_request("c", "pilot boards tanker channel museum", 512);
                request.order = order as i32;
                let response = retrieve(&mut client, request).await;
                let texts: Vec<&str> = response.chunks.iter().map(|c| c.text.as_str()).collect();
                let pilots = format!("{}\n\n  {}", parts[0].1, parts[1].1);
                assert!(texts.contains(&pilots.as_str()), "{order:?}: {texts:?}");
                assert!(texts.contains(&parts[2].1), "{order:?}: {texts:?}");
                for chunk in &response.chunks {
                    let (bytes, chars) = (chunk.bytes.unwrap(), chunk.chars.unwrap());
                    assert_eq!(&text[bytes.start as usize..bytes.end as usize], chunk.text);
                    assert_eq!(char_slice(&text, chars.start, chars.end), chunk.text);
                }
                let counted: u32 = response.chunks.iter().map(|c| c.token_count).sum();
                assert_eq!(counted, response.tokens_used);
                assert!(response.tokens_used <= 512);
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_upload_and_wait_writes_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut client = server.client.clone();
    create_collection(&mut client, "c").await;
    let messages: Vec<proto::UpsertDocumentsRequest> = (0..5)
        .map(|batch| proto::UpsertDocumentsRequest {
            collection: "c".into(),
            documents: (0..10)
                .map(|i| {
                    document(
                        &format!("doc-{batch}-{i}"),
                        &format!(
                            "Document number {i} of batch {batch} mentions keyword{batch}x{i}."
                        ),
                        Format::Plain,
                    )
                })
                .collect(),
            wait: batch == 4,
            write_id: String::new(),
        })
        .collect();
    let response = client
        .upload_documents(tokio_stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.documents, 50);
    assert!(response.generation > 0);
    let found = retrieve(&mut client, retrieve_request("c", "keyword3x7", 64)).await;
    assert_eq!(found.chunks[0].doc_id, "doc-3-7");
    server.stop().await;

    let server = TestServer::start(dir.path()).await;
    let mut client = server.client.clone();
    let stats = collection_stats(&mut client, "c").await;
    assert_eq!(stats.documents, 50);
    assert!(stats.generation >= response.generation);
    let found = retrieve(&mut client, retrieve_request("c", "keyword4x9", 64)).await;
    assert_eq!(found.chunks[0].doc_id, "doc-4-9");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_are_listed_and_deleted() {
    Fixture::new()
        .collection("one")
        .run(|Served { mut client, .. }| async move {
            client
                .create_collection(proto::CreateCollectionRequest {
                    name: "two".into(),
                    settings: Some(proto::CollectionSettings {
                        budget_tokenizer: "cl100k_base".into(),
                        default_chunking: Some(proto::ChunkingOptions {
                            strategy: proto::ChunkStrategy::Fixed as i32,
                            max_tokens: Some(32),
                            ..Default::default()
                        }),
                        section_tokens: Some(256),
                    }),
                })
                .await
                .unwrap();
            let listed = client
                .list_collections(proto::ListCollectionsRequest {})
                .await
                .unwrap()
                .into_inner()
                .collections;
            let names: Vec<&str> = listed.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["one", "two"]);
            let two = &listed[1].settings.as_ref().unwrap();
            assert_eq!(two.budget_tokenizer, "cl100k_base");
            assert_eq!(two.section_tokens, Some(256));

            upsert(
                &mut client,
                "two",
                vec![document(
                    "x",
                    "Tiktoken counts this budget in cl100k tokens.",
                    Format::Plain,
                )],
            )
            .await;
            let response =
                retrieve(&mut client, retrieve_request("two", "tiktoken budget", 100)).await;
            assert_eq!(
                response.chunks[0].strategy,
                proto::ChunkStrategy::Fixed as i32,
                "the collection's default strategy"
            );
            let bpe = tiktoken_rs::cl100k_base_singleton();
            assert_eq!(
                response.tokens_used as usize,
                bpe.encode_ordinary(&response.chunks[0].text).len()
            );

            client
                .delete_collection(proto::DeleteCollectionRequest { name: "one".into() })
                .await
                .unwrap();
            let status = client
                .get_collection(proto::GetCollectionRequest { name: "one".into() })
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::NotFound);
            // Recreated under the same name: empty, and no old cached answer leaks through.
            create_collection(&mut client, "one").await;
            let stats = collection_stats(&mut client, "one").await;
            assert_eq!(stats.documents, 0);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_answer_without_a_proto_file() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    Fixture::new()
        .run(|served| async move {
            let channel = tonic::transport::Channel::from_shared(served.channel_uri())
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut health = HealthClient::new(channel.clone());
            for service in ["", "lathe.v1.Lathe"] {
                let status = health
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .status;
                assert_eq!(status, ServingStatus::Serving as i32, "service `{service}`");
            }

            use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
            use tonic_reflection::pb::v1::ServerReflectionRequest;
            let channel_v1alpha = channel.clone();
            let mut reflection = ServerReflectionClient::new(channel);
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut stream = reflection
                .server_reflection_info(tokio_stream::iter(vec![request]))
                .await
                .unwrap()
                .into_inner();
            let response = stream.message().await.unwrap().unwrap();
            let Some(MessageResponse::ListServicesResponse(list)) = response.message_response
            else {
                panic!("unexpected reflection answer");
            };
            let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            assert!(names.contains(&"lathe.v1.Lathe".to_string()), "{names:?}");
            assert!(
                names.contains(&"grpc.health.v1.Health".to_string()),
                "{names:?}"
            );

            // v1alpha, which Python's grpcio-reflection and older grpcurl speak, lists the same.
            use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as AlphaClient;
            use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaRequest;
            use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResponse;
            let mut alpha = AlphaClient::new(channel_v1alpha);
            let request = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(AlphaRequest::ListServices(String::new())),
            };
            let mut stream = alpha
                .server_reflection_info(tokio_stream::iter(vec![request]))
                .await
                .expect("reflection v1alpha is served")
                .into_inner();
            let response = stream.message().await.unwrap().unwrap();
            let Some(AlphaResponse::ListServicesResponse(list)) = response.message_response else {
                panic!("unexpected v1alpha reflection answer");
            };
            let alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            assert!(
                alpha_names.contains(&"lathe.v1.Lathe".to_string()),
                "{alpha_names:?}"
            );
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_continuing_a_table_carries_its_header_as_counted_context() {
    let header = "| element | symbol | use |\n|---|---|---|";
    let elements = [
        "hydrogen",
        "helium",
        "lithium",
        "beryllium",
        "boron",
        "carbon",
        "nitrogen",
        "oxygen",
        "fluorine",
        "neon",
        "sodium",
        "magnesium",
        "aluminium",
        "silicon",
        "phosphorus",
        "sulfur",
        "chlorine",
        "argon",
        "potassium",
        "calcium",
        "titanium",
        "chromium",
        "iron",
        "cobalt",
        "nickel",
        "copper",
        "zinc",
        "gallium",
    ];
    let mut markdown = format!("# Elements\n\nA table of elements and their uses.\n\n{header}\n");
    for (i, element) in elements.iter().enumerate() {
        markdown.push_str(&format!(
            "| {element} | E{i} | found in things of kind {i} |\n"
        ));
    }
    let csv = {
        let mut csv = String::from("city,country,river\n");
        for i in 0..40 {
            csv.push_str(&format!("town{i},land{i},stream{i}\n"));
        }
        csv
    };
    Fixture::new()
        .collection("tables")
        // Sections large enough to hold each table whole: the header is context of the chunks of
        // the section that holds it (a table cut over two sections starts the second without
        // one).
        .settings(proto::CollectionSettings {
            section_tokens: Some(1024),
            ..Default::default()
        })
        .documents(vec![
            document("md", &markdown, Format::Markdown),
            document("csv", &csv, Format::Plain),
        ])
        .run(|Served { mut client, .. }| async move {
            let cases = [
                (
                    "md",
                    "zinc gallium",
                    proto::ChunkStrategy::Structure,
                    header,
                ),
                ("md", "zinc gallium", proto::ChunkStrategy::Auto, header),
                (
                    "csv",
                    "town37 land37",
                    proto::ChunkStrategy::Csv,
                    "city,country,river",
                ),
                (
                    "csv",
                    "town37 land37",
                    proto::ChunkStrategy::Auto,
                    "city,country,river",
                ),
            ];
            for (doc, query, strategy, expected_header) in cases {
                let budget = 60;
                let mut request = retrieve_request("tables", query, budget);
                request.filter = Some(proto::Filter {
                    metadata: vec![],
                    doc_ids: vec![doc.into()],
                });
                request.chunking = Some(proto::ChunkingOptions {
                    strategy: strategy as i32,
                    max_tokens: Some(40),
                    ..Default::default()
                });
                let response = retrieve(&mut client, request).await;
                let best = response.chunks.first().expect("a chunk");
                assert!(
                    best.text.contains(query.split(' ').next().unwrap()),
                    "{best:?}"
                );
                assert_eq!(best.context, expected_header, "{strategy:?}: {best:?}");
                assert!(!best.text.contains(expected_header));
                let mut used = 0;
                for chunk in &response.chunks {
                    let read = if chunk.context.is_empty() {
                        chunk.text.clone()
                    } else {
                        format!("{}\n{}", chunk.context, chunk.text)
                    };
                    assert_eq!(chunk.token_count as usize, minilm_count(&read), "{chunk:?}");
                    used += chunk.token_count;
                }
                assert_eq!(response.tokens_used, used);
                assert!(used <= budget, "{used} > {budget}");
            }
        })
        .await;
}

/// `lathe ingest` (the real binary) in batches of at most two documents, two batches in flight:
/// every document is stored once, whatever order the batches land in, and a document id given
/// twice ends with its last version (such an ingest sends one batch at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lathe_ingest_in_flight_batches_store_everything_and_the_last_version_wins() {
    Fixture::lexical()
        .run(|served| async move {
            let mut client = served.client;
            let corpus = served.dir.join("corpus");
            std::fs::create_dir(&corpus).unwrap();
            for i in 0..24 {
                std::fs::write(
                    corpus.join(format!("doc{i:02}.md")),
                    format!("# Part {i}\n\nThe lathe turns blank{i} into shavings.\n"),
                )
                .unwrap();
            }
            const BATCHES: &[&str] = &[
                "--batch",
                "2",
                "--first-batch-bytes",
                "1",
                "--in-flight",
                "2",
            ];
            let ingest = |path| common::binary::lathe_ingest(served.address, "shop", BATCHES, path);
            let output = ingest(corpus.clone()).await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{stderr}");
            assert!(!stderr.contains("repeat"), "{stderr}");
            assert_eq!(
                stderr.matches("documents ").count(),
                12,
                "a line per batch: {stderr}"
            );
            let stats = collection_stats(&mut client, "shop").await;
            assert_eq!((stats.documents, stats.sections), (24, 24));
            for i in [0, 11, 23] {
                let response = retrieve(
                    &mut client,
                    retrieve_request("shop", &format!("blank{i}"), 64),
                )
                .await;
                assert_eq!(response.chunks[0].doc_id, format!("doc{i:02}.md"));
            }
            // Run again (a resume): the same documents, still once each.
            assert!(ingest(corpus).await.status.success());
            let stats = collection_stats(&mut client, "shop").await;
            assert_eq!((stats.documents, stats.sections), (24, 24));

            let repeated = served.dir.join("repeated.jsonl");
            let mut lines = String::new();
            for version in ["walnut", "maple", "cherry"] {
                for id in ["x", "y", "z"] {
                    lines.push_str(&format!(
                        "{{\"id\":\"{id}\",\"text\":\"Bowl {id} is turned from {version}.\"}}\n"
                    ));
                }
            }
            std::fs::write(&repeated, lines).unwrap();
            let output = ingest(repeated).await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{stderr}");
            assert!(stderr.contains("ids repeat"), "{stderr}");
            for id in ["x", "y", "z"] {
                let response = retrieve(
                    &mut client,
                    retrieve_request("shop", &format!("bowl {id}"), 64),
                )
                .await;
                let chunk = response
                    .chunks
                    .iter()
                    .find(|c| c.doc_id == id)
                    .expect("stored");
                assert!(chunk.text.contains("cherry"), "{id}: {:?}", chunk.text);
            }
            assert_eq!(collection_stats(&mut client, "shop").await.documents, 27);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_query_is_answered_from_more_documents_unless_diversity_is_set() {
    // Every paper states a conclusion in the same words; "a" states several, and alone
    // mentions ferrets.
    let mut documents = vec![document(
        "a",
        &(0..20)
            .map(|i| format!("The conclusion of this study is finding number {i} on ferrets."))
            .collect::<Vec<_>>()
            .join(" "),
        Format::Plain,
    )];
    for id in ["b", "c", "d", "e", "f"] {
        let text = format!(
            "The conclusion of this study is finding {id}. Weather stations logged rain and \
             wind across the valley for many seasons."
        );
        documents.push(document(id, &text, Format::Plain));
    }
    Fixture::lexical()
        .config(|config| {
            // The whole score range: any query whose candidates come from five documents or more is
            // ambiguous (where the line lies is `diversify::is_ambiguous`'s unit test), and MMR strong
            // enough to take a second document within this small budget, so that this test is about the
            // request field and the settings, not BM25's exact figures.
            config.retrieval.ambiguous_gap = 1.0;
            config.retrieval.ambiguous_diversity = 0.5;
        })
        .collection("c")
        .documents(documents)
        .run(|Served { mut client, .. }| async move {
            const BUDGET: u32 = 96;
            let documents_answering = |response: &proto::RetrieveResponse| {
                let mut ids: Vec<String> =
                    response.chunks.iter().map(|c| c.doc_id.clone()).collect();
                ids.sort();
                ids.dedup();
                ids
            };
            let ask = |query: &str, diversity: Option<f32>| {
                let mut request = retrieve_request("c", query, BUDGET);
                request.diversity = diversity;
                request
            };

            // "a"'s chunks outscore the rest: ranked by score alone, they fill the budget.
            let unset = retrieve(&mut client, ask("conclusion of this study", None)).await;
            let off = retrieve(&mut client, ask("conclusion of this study", Some(0.0))).await;
            let unset_documents = documents_answering(&unset);
            let off_documents = documents_answering(&off);
            assert!(
                unset_documents.len() > off_documents.len(),
                "unset {unset_documents:?}, diversity 0 {off_documents:?}"
            );
            for response in [&unset, &off] {
                assert!(response.tokens_used <= BUDGET);
            }

            // One document holds what the query names: not ambiguous, nothing changes.
            let unset = retrieve(&mut client, ask("ferrets", None)).await;
            let off = retrieve(&mut client, ask("ferrets", Some(0.0))).await;
            assert_eq!(documents_answering(&unset), ["a"]);
            assert_eq!(unset.chunks, off.chunks);
        })
        .await;
}

/// The CLI prints a status the server answered as gRPC names it, with the server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_names_a_refusal_by_its_grpc_code() {
    common::Fixture::lexical()
        .run(|served| async move {
            let address = served.address.to_string();
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_lathe"))
                    .args(["query", "--addr", &address, "-c", "nope", "hello"])
                    .output()
            })
            .await
            .unwrap()
            .expect("run lathe query");
            assert!(!output.status.success());
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                stderr.contains("NOT_FOUND: collection `nope` not found"),
                "{stderr}"
            );
        })
        .await;
}

/// `lathe query --json` prints the RetrieveResponse in the proto3 JSON mapping (as grpcurl and
/// the Python client's `MessageToJson` write it), which reads back to the same chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_the_response_as_proto3_json() {
    let text = "Lathes turn wood. A spindle holds the work. Chisels cut it to shape.";
    common::Fixture::lexical()
        .collection("docs")
        .documents(vec![common::document(
            "a",
            text,
            proto::DocumentFormat::Plain,
        )])
        .run(|mut served| async move {
            let address = served.address.to_string();
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_lathe"))
                    .args([
                        "query", "--addr", &address, "-c", "docs", "--json", "spindle",
                    ])
                    .output()
            })
            .await
            .unwrap()
            .expect("run lathe query");
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            // The mapping's spelling: lowerCamelCase, 64-bit integers as strings.
            let chunk = &printed["chunks"][0];
            assert_eq!(chunk["docId"], "a");
            assert!(chunk["bytes"]["end"].is_string(), "{chunk}");
            assert!(printed["tokensUsed"].is_number(), "{printed}");
            let parsed: proto::RetrieveResponse = serde_json::from_value(printed).unwrap();
            let direct = common::retrieve(
                &mut served.client,
                common::retrieve_request("docs", "spindle", 512),
            )
            .await;
            assert_eq!(parsed.chunks, direct.chunks);
            assert_eq!(parsed.generation, direct.generation);
        })
        .await;
}

/// A streamed upload with `wait` answers the sections its writes made, as a unary upsert does
/// (each message is queued without waiting; the count comes once all are applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_with_wait_counts_the_sections_it_wrote() {
    common::Fixture::lexical()
        .collection("docs")
        .run(|mut served| async move {
            let messages: Vec<proto::UpsertDocumentsRequest> = [0..3, 3..5]
                .into_iter()
                .map(|range| proto::UpsertDocumentsRequest {
                    collection: "docs".into(),
                    documents: range.map(common::sectioned_document).collect(),
                    wait: true,
                    write_id: String::new(),
                })
                .collect();
            let written = served
                .client
                .upload_documents(tokio_stream::iter(messages))
                .await
                .expect("upload")
                .into_inner();
            let stats = common::collection_stats(&mut served.client, "docs").await;
            assert_eq!(written.documents, 5);
            assert!(written.sections >= 5, "{written:?}");
            assert_eq!(u64::from(written.sections), stats.sections);
        })
        .await;
}
