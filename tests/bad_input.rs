//! The bad-input table (docs/bad-input.md): each row's input gets its status and a message naming
//! the problem, nothing already stored is lost, nothing of a rejected batch is applied, and the
//! server answers a normal query afterwards. Calls cut short (cancelled, past their deadline, shed
//! under load) are in `calls_cut_short.rs`, TLS in `tls.rs`, API keys in `auth.rs`.

mod common;

use common::*;
use lathe::api::proto;
use lathe::api::proto::DocumentFormat as Format;
use tonic::Code;

/// The text of every chunk of `doc_id` that `query` retrieves, joined.
async fn retrieved_text(
    client: &mut lathe::api::proto::lathe_client::LatheClient<tonic::transport::Channel>,
    collection: &str,
    query: &str,
    doc_id: &str,
) -> String {
    let response = retrieve(client, retrieve_request(collection, query, 2000)).await;
    response
        .chunks
        .iter()
        .filter(|chunk| chunk.doc_id == doc_id)
        .map(|chunk| chunk.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_megabyte_query_is_rejected_by_the_query_limit_or_the_message_limit() {
    let megabyte_query = "lathe ".repeat((1 << 20) / 6 + 1);
    assert!(megabyte_query.len() >= 1 << 20);
    let megabyte_query = &megabyte_query;
    Fixture::lexical()
        .collection("c")
        .documents(vec![document("d", "Lathes turn wood.", Format::Plain)])
        .run(|Served { mut client, .. }| async move {
            // The default message limit (64 MiB) admits it; the query limit (16 KiB) does not.
            expect_code(
                client
                    .retrieve(retrieve_request("c", megabyte_query, 100))
                    .await,
                Code::InvalidArgument,
                &[
                    "query",
                    &format!("is {} bytes", megabyte_query.trim_end().len()),
                    "1..=16384 bytes",
                ],
            );
            still_serving(&mut client, "c", "lathes", "d").await;
        })
        .await;

    // With a 64 KiB message limit the same query is over the message limit itself.
    Fixture::lexical()
        .config(|config| config.limits.max_message_bytes = 64 * 1024)
        .collection("c")
        .documents(vec![document("d", "Lathes turn wood.", Format::Plain)])
        .run(|Served { mut client, .. }| async move {
            expect_code(
                client
                    .retrieve(retrieve_request("c", megabyte_query, 100))
                    .await,
                Code::ResourceExhausted,
                &["message length too large", "65536"],
            );
            still_serving(&mut client, "c", "lathes", "d").await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_of_zero_bytes_and_of_the_limit_are_accepted_one_byte_over_is_not() {
    Fixture::lexical()
        .config(|config| {
            config.limits.max_document_bytes = 1024;
            config.limits.max_batch_documents = 4;
        })
        .collection("c")
        // An empty document is accepted and holds no section: nothing to count or retrieve.
        .documents(vec![document("empty", "", Format::Plain)])
        .run(|served| async move {
            let mut client = served.client;
            let outcome = served.written.expect("the fixture's upsert");
            assert_eq!((outcome.documents, outcome.sections), (1, 0));
            assert_eq!(collection_stats(&mut client, "c").await.documents, 0);
            let at_limit_text = format!("{:x<1024}", "lathe chisel ");
            assert_eq!(at_limit_text.len(), 1024);
            upsert(
                &mut client,
                "c",
                vec![document("limit", &at_limit_text, Format::Plain)],
            )
            .await;
            assert_eq!(collection_stats(&mut client, "c").await.documents, 1);

            let over = document("over", &"y".repeat(1025), Format::Plain);
            let good = document("good", "Chisels are sharp.", Format::Plain);
            expect_code(
                client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: "c".into(),
                        documents: vec![good.clone(), over],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::ResourceExhausted,
                &["documents[1].text", "1025", "1024"],
            );
            let five: Vec<_> = (0..5)
                .map(|i| document(&format!("b{i}"), "chisels", Format::Plain))
                .collect();
            expect_code(
                client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: "c".into(),
                        documents: five,
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::InvalidArgument,
                &["documents", "holds 5 documents", "0..=4"],
            );
            assert_eq!(collection_stats(&mut client, "c").await.documents, 1);
            still_serving(&mut client, "c", "lathe", "limit").await;
        })
        .await;
}

/// 100,000 sections: over `limits.max_sections_per_document` (50,000) they are rejected naming the
/// count and the limit; under a limit that admits them they are stored and queryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_sections_are_rejected_over_the_limit_or_stored_and_queryable() {
    // 100,000 Markdown headings: one section each.
    let headings: String = (0..100_000)
        .map(|i| format!("# heading{i}\n\nbody{i}\n\n"))
        .collect();
    let headings_request = |collection: &str| proto::UpsertDocumentsRequest {
        collection: collection.into(),
        documents: vec![document("headings", &headings, Format::Markdown)],
        wait: true,
        write_id: String::new(),
    };
    let headings_request = &headings_request;
    Fixture::lexical()
        .collection("c")
        .documents(vec![document("keep", "Lathes turn wood.", Format::Plain)])
        .run(|Served { mut client, .. }| async move {
            // Caller-given boundaries: one section per line.
            let lines: Vec<String> = (0..100_000).map(|i| format!("line{i} ")).collect();
            let text = lines.concat();
            let mut sections = Vec::with_capacity(lines.len());
            let mut start = 0u64;
            for line in &lines {
                let end = start + line.chars().count() as u64;
                sections.push(proto::SectionBoundary {
                    start,
                    end,
                    title: String::new(),
                });
                start = end;
            }
            let mut caller_sections = document("many", &text, Format::Plain);
            caller_sections.sections = sections;
            expect_code(
                client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: "c".into(),
                        documents: vec![caller_sections],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::InvalidArgument,
                &["documents[many].text", "100000 sections", "0..=50000"],
            );

            // The 100,000 Markdown headings are over the limit too.
            expect_code(
                client.upsert_documents(headings_request("c")).await,
                Code::InvalidArgument,
                &["documents[headings].text", "100000 sections", "0..=50000"],
            );
            let stats = collection_stats(&mut client, "c").await;
            assert_eq!(stats.documents, 1);
            still_serving(&mut client, "c", "lathes", "keep").await;
        })
        .await;

    // Under a limit that admits them, they are stored and each is queryable.
    Fixture::lexical()
        .config(|config| config.limits.max_sections_per_document = 100_000)
        .collection("c")
        .run(|Served { mut client, .. }| async move {
            let outcome = client
                .upsert_documents(headings_request("c"))
                .await
                .expect("100,000 sections under a limit of 100,000")
                .into_inner();
            assert_eq!(outcome.sections, 100_000);
            for word in ["body0", "body50000", "body99999"] {
                let text = retrieved_text(&mut client, "c", word, "headings").await;
                assert!(text.contains(word), "{word}: {text:?}");
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_and_malformed_html_are_accepted_and_queryable() {
    let depth = 10_000;
    let quotes = format!(
        "# Quoted\n\n{} quotedword at the bottom\n",
        ">".repeat(depth)
    );
    // Each `- ` on one line opens a list inside the previous item; then quotes inside lists.
    let list = format!(
        "# Listed\n\n{} listedword at the bottom\n\n{} mixedword too\n",
        "- ".repeat(depth),
        "> - ".repeat(depth / 2)
    );
    let mut headings = String::new();
    for level in 0..depth {
        headings.push_str(&"#".repeat(level % 6 + 1));
        headings.push_str(&format!(" level{level}\n"));
    }
    headings.push_str("headingword under the deepest heading\n");
    // 4,000 elements deep: under `limits.max_html_depth` (4,096).
    let divs = format!(
        "<html><body>{}divword inside{}</body></html>",
        "<div><span>".repeat(1_999),
        "</span></div>".repeat(1_999)
    );
    let malformed =
        "<html><body></div></div><p class=unquoted id=x>malformedword in an unclosed paragraph\
            <div><b>bold never closed<i>italic<table><tr><td>cell</div></span>\
            <p>second <a href=http://x.test/?a=1&b=2>link</p></em></body>";
    Fixture::lexical()
        .collection("c")
        .documents(vec![
            document("quotes", &quotes, Format::Markdown),
            document("list", &list, Format::Markdown),
            document("headings", &headings, Format::Markdown),
            document("divs", &divs, Format::Html),
            document("malformed", malformed, Format::Html),
        ])
        .run(|Served { mut client, .. }| async move {
            for (word, doc_id) in [
                ("quotedword", "quotes"),
                ("listedword", "list"),
                ("mixedword", "list"),
                ("headingword", "headings"),
                ("divword", "divs"),
                ("malformedword", "malformed"),
            ] {
                let text = retrieved_text(&mut client, "c", word, doc_id).await;
                assert!(text.contains(word), "`{word}` in {doc_id}: {text:?}");
            }
            let text = retrieved_text(&mut client, "c", "link second", "malformed").await;
            assert!(text.contains("second link"), "{text:?}");

            // Deeper HTML would cost the parser time quadratic in the depth: refused before parsing.
            let too_deep = format!(
                "<html><body>{}deepword inside{}</body></html>",
                "<div><span>".repeat(depth),
                "</span></div>".repeat(depth)
            );
            let status = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: vec![
                        document("fine", "<p>fineword</p>", Format::Html),
                        document("too-deep", &too_deep, Format::Html),
                    ],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .expect_err("too deep");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            assert!(
                status.message().contains("documents[1].text")
                    && status.message().contains("20002 elements deep")
                    && status.message().contains("0..=4096"),
                "{status:?}"
            );
            let response =
                retrieve(&mut client, retrieve_request("c", "fineword deepword", 64)).await;
            assert!(
                response
                    .chunks
                    .iter()
                    .all(|c| c.doc_id != "fine" && c.doc_id != "too-deep"),
                "nothing of the rejected batch is applied: {response:?}"
            );
        })
        .await;
}

/// Control characters, U+FFFD, NUL, bidi and zero-width marks are legal in a protobuf string:
/// accepted in text, ids, metadata and queries, stored and returned byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_and_nul_are_accepted_and_returned_byte_for_byte() {
    let garbage: String = (0u32..0x20)
        .chain([
            0x7f, 0x85, 0xa0, 0xfffd, 0xfeff, 0x200b, 0x202e, 0x2028, 0x10ffff,
        ])
        .filter_map(char::from_u32)
        .collect();
    let text = format!(
            "Garbled{garbage}prefix then gearbox words.\u{0}\u{0}Nul separated spindle.\n\n\u{fffd}\u{fffd} replacement tailstock {garbage}"
        );
    let mut with_nul = document("id\u{0}with\u{1}nul", &text, Format::Plain);
    with_nul
        .metadata
        .insert("key\u{0}nul".into(), "value\u{0}\u{7}".into());
    Fixture::new()
        .collection("c")
        .documents(vec![with_nul])
        .run(|Served { mut client, .. }| async move {
            for query in [
                "gearbox",
                "spindle\u{0}",
                "\u{0}tailstock\u{fffd}",
                "\u{1}\u{2} spindle \u{7f}",
            ] {
                let response = retrieve(&mut client, retrieve_request("c", query, 500)).await;
                assert!(!response.chunks.is_empty(), "{query:?}");
                for chunk in &response.chunks {
                    assert_eq!(chunk.doc_id, "id\u{0}with\u{1}nul");
                    assert_eq!(chunk.metadata["key\u{0}nul"], "value\u{0}\u{7}");
                    let bytes = chunk.bytes.as_ref().unwrap();
                    assert_eq!(chunk.text, text[bytes.start as usize..bytes.end as usize]);
                    let chars = chunk.chars.as_ref().unwrap();
                    assert_eq!(chunk.text, char_slice(&text, chars.start, chars.end));
                }
            }
            // A filter on the NUL key and value finds it.
            let mut filtered = retrieve_request("c", "gearbox", 500);
            filtered.filter = Some(proto::Filter {
                metadata: vec![proto::MetadataTerm {
                    key: "key\u{0}nul".into(),
                    value: "value\u{0}\u{7}".into(),
                }],
                doc_ids: vec![],
            });
            assert!(!retrieve(&mut client, filtered).await.chunks.is_empty());
            // A query of nothing but control characters and NULs holds no word, but it is not empty:
            // OK (the dense leg still ranks sections by the query vector).
            retrieve(&mut client, retrieve_request("c", "\u{0}\u{1}\u{7f}", 500)).await;
            // Deleting by the NUL id removes it.
            client
                .delete_documents(proto::DeleteDocumentsRequest {
                    collection: "c".into(),
                    ids: vec!["id\u{0}with\u{1}nul".into()],
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .unwrap();
            assert_eq!(collection_stats(&mut client, "c").await.documents, 0);
        })
        .await;
}

/// The metadata term is `key U+001F value`: a key holding U+001F would make two different pairs
/// one term (`a\u{1f}b = c` and `a = b\u{1f}c`), so such keys are rejected by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_key_cannot_forge_another_pair() {
    let mut honest = document("honest", "Spindle speeds for hardwood.", Format::Plain);
    honest.metadata.insert("team".into(), "blue".into());
    Fixture::lexical()
        .collection("c")
        .documents(vec![honest])
        .run(|Served { mut client, .. }| async move {
            let mut forged = document("forged", "Spindle speeds for softwood.", Format::Plain);
            forged.metadata.insert("team\u{1f}red".into(), "x".into());
            let result = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: vec![forged],
                    wait: true,
                    write_id: String::new(),
                })
                .await;
            expect_code(
                result,
                Code::InvalidArgument,
                &["documents[0].metadata", "U+001F"],
            );
            let mut filter_request = retrieve_request("c", "spindle", 500);
            filter_request.filter = Some(proto::Filter {
                metadata: vec![proto::MetadataTerm {
                    key: "team".into(),
                    value: "red\u{1f}x".into(),
                }],
                doc_ids: vec![],
            });
            assert!(retrieve(&mut client, filter_request)
                .await
                .chunks
                .is_empty());
            let mut bad_filter = retrieve_request("c", "spindle", 500);
            bad_filter.filter = Some(proto::Filter {
                metadata: vec![proto::MetadataTerm {
                    key: "team\u{1f}red".into(),
                    value: "x".into(),
                }],
                doc_ids: vec![],
            });
            expect_code(
                client.retrieve(bad_filter).await,
                Code::InvalidArgument,
                &["filter.metadata[0].key", "U+001F"],
            );
            still_serving(&mut client, "c", "spindle", "honest").await;
        })
        .await;
}

/// Every kind of rejected batch leaves the stored version in place and adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_batches_leave_earlier_versions_in_place() {
    Fixture::lexical()
        .config(|config| {
            config.limits.max_document_bytes = 4096;
            config.limits.max_sections_per_document = 3;
        })
        .collection("c")
        .documents(vec![document(
            "keep",
            "Original lathe manual text.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            let generation = collection_stats(&mut client, "c").await.generation;

            let replacement = document("keep", "Replacement chisel guide text.", Format::Plain);
            let newcomer = document("new", "A newcomer about gouges.", Format::Plain);
            let mut empty_key = document("m", "text", Format::Plain);
            empty_key.metadata.insert(String::new(), "v".into());
            let mut unknown_format = document("f", "text", Format::Plain);
            unknown_format.format = 9;
            let mut bad_sections = document("s", "short", Format::Plain);
            bad_sections.sections = vec![proto::SectionBoundary {
                start: 3,
                end: 2,
                title: String::new(),
            }];
            let four_sections = document(
                "four",
                "# a\n\none\n\n# b\n\ntwo\n\n# c\n\nthree\n\n# d\n\nfour\n",
                Format::Markdown,
            );
            let batches: Vec<(Vec<proto::Document>, Code, &[&str])> = vec![
                (
                    vec![replacement.clone(), newcomer.clone(), replacement.clone()],
                    Code::InvalidArgument,
                    &["documents[2].id", "`keep` appears more than once"],
                ),
                (
                    vec![replacement.clone(), newcomer.clone(), empty_key],
                    Code::InvalidArgument,
                    &["documents[2].metadata", "keys must not be empty"],
                ),
                (
                    vec![replacement.clone(), newcomer.clone(), unknown_format],
                    Code::InvalidArgument,
                    &["documents[2].format", "unknown format 9"],
                ),
                (
                    vec![replacement.clone(), newcomer.clone(), bad_sections],
                    Code::InvalidArgument,
                    &["documents[s].sections"],
                ),
                (
                    vec![replacement.clone(), newcomer.clone(), four_sections],
                    Code::InvalidArgument,
                    &["documents[four].text", "produces 4 sections", "0..=3"],
                ),
                (
                    vec![
                        replacement.clone(),
                        newcomer.clone(),
                        document("big", &"z".repeat(4097), Format::Plain),
                    ],
                    Code::ResourceExhausted,
                    &["documents[2].text", "4097", "4096"],
                ),
                (
                    vec![
                        replacement.clone(),
                        newcomer.clone(),
                        document("", "no id", Format::Plain),
                    ],
                    Code::InvalidArgument,
                    &["documents[2].id", "must not be empty"],
                ),
            ];
            for (documents, code, needles) in batches {
                expect_code(
                    client
                        .upsert_documents(proto::UpsertDocumentsRequest {
                            collection: "c".into(),
                            documents,
                            wait: true,
                            write_id: String::new(),
                        })
                        .await,
                    code,
                    needles,
                );
            }
            expect_code(
                client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: "absent".into(),
                        documents: vec![replacement.clone()],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::NotFound,
                &["collection `absent` not found"],
            );
            expect_code(
                client
                    .delete_documents(proto::DeleteDocumentsRequest {
                        collection: "c".into(),
                        ids: vec!["keep".into(), String::new()],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await,
                Code::InvalidArgument,
                &["ids[1]", "must not be empty"],
            );
            let stats = collection_stats(&mut client, "c").await;
            assert_eq!((stats.documents, stats.generation), (1, generation));
            let text = retrieved_text(&mut client, "c", "lathe chisel gouges", "keep").await;
            assert_eq!(text, "Original lathe manual text.");
            assert!(retrieved_text(&mut client, "c", "gouges", "new")
                .await
                .is_empty());
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_on_missing_keys_find_nothing_and_empty_filter_keys_are_rejected() {
    let mut tagged = document("tagged", "Bandsaw blades and tension.", Format::Plain);
    tagged.metadata.insert("lang".into(), "en".into());
    Fixture::lexical()
        .collection("c")
        .documents(vec![tagged])
        .run(|Served { mut client, .. }| async move {
            let with_filter = |metadata: Vec<(&str, &str)>, doc_ids: Vec<&str>| {
                let mut request = retrieve_request("c", "bandsaw", 200);
                request.filter = Some(proto::Filter {
                    metadata: metadata
                        .into_iter()
                        .map(|(key, value)| proto::MetadataTerm {
                            key: key.into(),
                            value: value.into(),
                        })
                        .collect(),
                    doc_ids: doc_ids.into_iter().map(String::from).collect(),
                });
                request
            };
            for request in [
                with_filter(vec![("missing", "en")], vec![]),
                with_filter(vec![("lang", "fr")], vec![]),
                with_filter(vec![("lang", "")], vec![]),
                with_filter(vec![], vec!["no-such-doc"]),
            ] {
                let response = retrieve(&mut client, request.clone()).await;
                assert!(response.chunks.is_empty(), "{request:?}: {response:?}");
            }
            let response = retrieve(&mut client, with_filter(vec![("lang", "en")], vec![])).await;
            assert_eq!(response.chunks[0].doc_id, "tagged");
            expect_code(
                client.retrieve(with_filter(vec![("", "en")], vec![])).await,
                Code::InvalidArgument,
                &["filter.metadata[0].key", "must not be empty"],
            );
            still_serving(&mut client, "c", "bandsaw", "tagged").await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chunking_options_and_mixed_uploads_name_the_field() {
    Fixture::lexical()
        .collection("c")
        .documents(vec![document(
            "d",
            "Router bits and collets.",
            Format::Plain,
        )])
        .run(|Served { mut client, .. }| async move {
            create_collection(&mut client, "other").await;
            let with_chunking = |chunking: proto::ChunkingOptions| proto::RetrieveRequest {
                chunking: Some(chunking),
                ..retrieve_request("c", "router", 100)
            };
            let cases: Vec<(proto::RetrieveRequest, &[&str])> = vec![
                (
                    with_chunking(proto::ChunkingOptions {
                        unit: 7,
                        ..Default::default()
                    }),
                    &["chunking.unit", "unknown unit 7"],
                ),
                (
                    with_chunking(proto::ChunkingOptions {
                        strategy: proto::ChunkStrategy::Semantic as i32,
                        semantic_amount: Some(150.0),
                        ..Default::default()
                    }),
                    &["chunking.semantic_amount", "0..=100"],
                ),
                (
                    with_chunking(proto::ChunkingOptions {
                        strategy: proto::ChunkStrategy::Recursive as i32,
                        separators: vec!["\n\n".into(), String::new()],
                        ..Default::default()
                    }),
                    &["chunking.separators[1]", "must not be empty"],
                ),
                (
                    with_chunking(proto::ChunkingOptions {
                        max_tokens: Some(8193),
                        ..Default::default()
                    }),
                    &["chunking.max_tokens", "1..=8192"],
                ),
            ];
            for (request, needles) in cases {
                expect_code(
                    client.retrieve(request).await,
                    Code::InvalidArgument,
                    needles,
                );
            }

            // An upload is a stream of batches: the first one is applied whole, the one naming
            // another collection is rejected and nothing of it lands in either collection.
            let messages = vec![
                proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: vec![document(
                        "first",
                        "Collets hold router bits.",
                        Format::Plain,
                    )],
                    wait: true,
                    write_id: String::new(),
                },
                proto::UpsertDocumentsRequest {
                    collection: "other".into(),
                    documents: vec![document("second", "Should not land.", Format::Plain)],
                    wait: true,
                    write_id: String::new(),
                },
            ];
            expect_code(
                client.upload_documents(tokio_stream::iter(messages)).await,
                Code::InvalidArgument,
                &["collection", "`c` then `other`"],
            );
            // A later wait write commits what the upload queued without waiting.
            upsert(
                &mut client,
                "c",
                vec![document("after", "Plunge routers.", Format::Plain)],
            )
            .await;
            assert_eq!(collection_stats(&mut client, "c").await.documents, 3);
            assert_eq!(collection_stats(&mut client, "other").await.documents, 0);
            still_serving(&mut client, "c", "router", "d").await;
        })
        .await;
}

/// `lathe ingest` on a .jsonl file with a lone surrogate escape: the real binary exits non-zero
/// naming the file and the line, and nothing reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lathe_ingest_refuses_a_lone_surrogate_naming_the_line_and_ingests_nothing() {
    Fixture::lexical()
    .run(|served| async move {
        let mut client = served.client;
        let bad = served.dir.join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"id\":\"a\",\"text\":\"Veneer saws.\"}\n\n{\"id\":\"b\",\"text\":\"bad \\ud800 half\"}\n{\"id\":\"c\",\"text\":\"never\"}\n",
        )
        .unwrap();
        let good = served.dir.join("good.jsonl");
        std::fs::write(
            &good,
            "{\"id\":\"nul\\u0000id\",\"text\":\"Veneer\\u0000saws and \\ufffd glue.\",\"metadata\":{\"k\\u0000\":\"v\"}}\n",
        )
        .unwrap();
        let ingest = |path| common::binary::lathe_ingest(served.address, "jsonl", &[], path);
        let output = ingest(bad.clone()).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("bad.jsonl")
                && stderr.contains("line 3")
                && stderr.contains(r"lone UTF-16 surrogate escape `\ud800` at column 23"),
            "{stderr}"
        );
        // Nothing was ingested: the collection was not even created.
        let status = client
            .get_collection(proto::GetCollectionRequest { name: "jsonl".into() })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");

        // NUL escapes are valid JSON and valid protobuf strings: ingested.
        let output = ingest(good).await;
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let response = retrieve(&mut client, retrieve_request("jsonl", "veneer glue", 100)).await;
        assert_eq!(response.chunks[0].doc_id, "nul\u{0}id");
        assert_eq!(response.chunks[0].metadata["k\u{0}"], "v");
    })
    .await;
}
