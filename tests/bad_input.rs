//! The bad-input table (docs/bad-input.md): each row's input gets its status and a message naming
//! the problem, nothing already stored is lost, nothing of a rejected batch is applied, and the
//! server answers a normal query afterwards.

mod common;

use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::proto::DocumentFormat as Format;
use lathe::config::Config;
use tonic::transport::Channel;
use tonic::Code;

/// Every test is bounded: a hang fails the test instead of stalling the suite.
const TEST_LIMIT: Duration = Duration::from_secs(90);

fn expect_code<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    code: Code,
    needles: &[&str],
) -> tonic::Status {
    let status = result.expect_err("the request must fail");
    assert_eq!(status.code(), code, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "`{}` should mention `{needle}`",
            status.message()
        );
    }
    status
}

/// A normal query answers with at least one chunk of `doc_id`.
async fn still_serving(
    client: &mut LatheClient<Channel>,
    collection: &str,
    query: &str,
    doc_id: &str,
) {
    let response = retrieve(client, retrieve_request(collection, query, 200)).await;
    assert!(
        response.chunks.iter().any(|chunk| chunk.doc_id == doc_id),
        "`{query}` should find `{doc_id}`: {:?}",
        response.chunks
    );
}

/// The text of every chunk of `doc_id` that `query` retrieves, joined.
async fn retrieved_text(
    client: &mut LatheClient<Channel>,
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

fn lexical_config(dir: &std::path::Path) -> Config {
    let mut config = test_config(dir);
    // Rows about parsing and limits, not about the neural stage: lexical only keeps them cheap.
    config.models.dense = lathe::config::DenseModel::Off;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_megabyte_query_is_rejected_by_the_query_limit_or_the_message_limit() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document("d", "Lathes turn wood.", Format::Plain)],
        )
        .await;
        let megabyte_query = "lathe ".repeat((1 << 20) / 6 + 1);
        assert!(megabyte_query.len() >= 1 << 20);
        // The default message limit (64 MiB) admits it; the query limit (16 KiB) does not.
        expect_code(
            client
                .retrieve(retrieve_request("c", &megabyte_query, 100))
                .await,
            Code::InvalidArgument,
            &[
                "query",
                &format!("is {} bytes", megabyte_query.trim_end().len()),
                "1..=16384 bytes",
            ],
        );
        still_serving(&mut client, "c", "lathes", "d").await;
        server.stop().await;

        // With a 64 KiB message limit the same query is over the message limit itself.
        let dir = tempfile::tempdir().unwrap();
        let mut config = lexical_config(dir.path());
        config.limits.max_message_bytes = 64 * 1024;
        let server = TestServer::start_with(config).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document("d", "Lathes turn wood.", Format::Plain)],
        )
        .await;
        expect_code(
            client
                .retrieve(retrieve_request("c", &megabyte_query, 100))
                .await,
            Code::ResourceExhausted,
            &["message length too large", "65536"],
        );
        still_serving(&mut client, "c", "lathes", "d").await;
        server.stop().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_of_zero_bytes_and_of_the_limit_are_accepted_one_byte_over_is_not() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = lexical_config(dir.path());
        config.limits.max_document_bytes = 1024;
        config.limits.max_batch_documents = 4;
        let server = TestServer::start_with(config).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;

        // An empty document is accepted and holds no section: nothing to count or retrieve.
        let outcome = upsert(&mut client, "c", vec![document("empty", "", Format::Plain)]).await;
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
                })
                .await,
            Code::InvalidArgument,
            &["documents", "holds 5 documents", "0..=4"],
        );
        assert_eq!(collection_stats(&mut client, "c").await.documents, 1);
        still_serving(&mut client, "c", "lathe", "limit").await;
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// 100,000 sections: over `limits.max_sections_per_document` (50,000) they are rejected naming the
/// count and the limit; under a limit that admits them they are stored and queryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_sections_are_rejected_over_the_limit_or_stored_and_queryable() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document("keep", "Lathes turn wood.", Format::Plain)],
        )
        .await;

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
                })
                .await,
            Code::InvalidArgument,
            &["documents[many].text", "100000 sections", "0..=50000"],
        );

        // 100,000 Markdown headings: one section each, over the limit too.
        let headings: String = (0..100_000)
            .map(|i| format!("# heading{i}\n\nbody{i}\n\n"))
            .collect();
        let headings_request = |collection: &str| proto::UpsertDocumentsRequest {
            collection: collection.into(),
            documents: vec![document("headings", &headings, Format::Markdown)],
            wait: true,
        };
        expect_code(
            client.upsert_documents(headings_request("c")).await,
            Code::InvalidArgument,
            &["documents[headings].text", "100000 sections", "0..=50000"],
        );
        let stats = collection_stats(&mut client, "c").await;
        assert_eq!(stats.documents, 1);
        still_serving(&mut client, "c", "lathes", "keep").await;
        server.stop().await;

        // Under a limit that admits them, they are stored and each is queryable.
        let dir = tempfile::tempdir().unwrap();
        let mut config = lexical_config(dir.path());
        config.limits.max_sections_per_document = 100_000;
        let server = TestServer::start_with(config).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_and_malformed_html_are_accepted_and_queryable() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
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
        upsert(
            &mut client,
            "c",
            vec![
                document("quotes", &quotes, Format::Markdown),
                document("list", &list, Format::Markdown),
                document("headings", &headings, Format::Markdown),
                document("divs", &divs, Format::Html),
                document("malformed", malformed, Format::Html),
            ],
        )
        .await;
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
        let response = retrieve(&mut client, retrieve_request("c", "fineword deepword", 64)).await;
        assert!(
            response
                .chunks
                .iter()
                .all(|c| c.doc_id != "fine" && c.doc_id != "too-deep"),
            "nothing of the rejected batch is applied: {response:?}"
        );
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// Control characters, U+FFFD, NUL, bidi and zero-width marks are legal in a protobuf string:
/// accepted in text, ids, metadata and queries, stored and returned byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_and_nul_are_accepted_and_returned_byte_for_byte() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start(dir.path()).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        let garbage: String = (0u32..0x20)
            .chain([0x7f, 0x85, 0xa0, 0xfffd, 0xfeff, 0x200b, 0x202e, 0x2028, 0x10ffff])
            .filter_map(char::from_u32)
            .collect();
        let text = format!(
            "Garbled{garbage}prefix then gearbox words.\u{0}\u{0}Nul separated spindle.\n\n\u{fffd}\u{fffd} replacement tailstock {garbage}"
        );
        let mut with_nul = document("id\u{0}with\u{1}nul", &text, Format::Plain);
        with_nul
            .metadata
            .insert("key\u{0}nul".into(), "value\u{0}\u{7}".into());
        upsert(&mut client, "c", vec![with_nul]).await;

        for query in ["gearbox", "spindle\u{0}", "\u{0}tailstock\u{fffd}", "\u{1}\u{2} spindle \u{7f}"] {
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
            })
            .await
            .unwrap();
        assert_eq!(collection_stats(&mut client, "c").await.documents, 0);
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// The metadata term is `key U+001F value`: a key holding U+001F would make two different pairs
/// one term (`a\u{1f}b = c` and `a = b\u{1f}c`), so such keys are rejected by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_key_cannot_forge_another_pair() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        let mut honest = document("honest", "Spindle speeds for hardwood.", Format::Plain);
        honest.metadata.insert("team".into(), "blue".into());
        upsert(&mut client, "c", vec![honest]).await;
        let mut forged = document("forged", "Spindle speeds for softwood.", Format::Plain);
        forged.metadata.insert("team\u{1f}red".into(), "x".into());
        let result = client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents: vec![forged],
                wait: true,
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// Every kind of rejected batch leaves the stored version in place and adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_batches_leave_earlier_versions_in_place() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = lexical_config(dir.path());
        config.limits.max_document_bytes = 4096;
        config.limits.max_sections_per_document = 3;
        let server = TestServer::start_with(config).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document(
                "keep",
                "Original lathe manual text.",
                Format::Plain,
            )],
        )
        .await;
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_on_missing_keys_find_nothing_and_empty_filter_keys_are_rejected() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        let mut tagged = document("tagged", "Bandsaw blades and tension.", Format::Plain);
        tagged.metadata.insert("lang".into(), "en".into());
        upsert(&mut client, "c", vec![tagged]).await;
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chunking_options_and_mixed_uploads_name_the_field() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(dir.path())).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        create_collection(&mut client, "other").await;
        upsert(
            &mut client,
            "c",
            vec![document("d", "Router bits and collets.", Format::Plain)],
        )
        .await;
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
            },
            proto::UpsertDocumentsRequest {
                collection: "other".into(),
                documents: vec![document("second", "Should not land.", Format::Plain)],
                wait: true,
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// A client that gives up (drops the call) mid-upload or mid-write: every batch is applied whole
/// or not at all, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_uploads_and_writes_are_applied_whole_or_not_at_all() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start(dir.path()).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document("keep", "Dovetail joints by hand.", Format::Plain)],
        )
        .await;

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
        };
        sender.send(batch("a", 3)).await.unwrap();
        sender.send(batch("b", 5)).await.unwrap();
        let upload = client.upload_documents(tokio_stream::wrappers::ReceiverStream::new(receiver));
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
        });
        let _ = tokio::time::timeout(Duration::from_millis(20), write).await;

        // A wait write commits whatever the cancelled calls queued.
        let mut fresh = server.client.clone();
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// A client deadline shorter than the work: DEADLINE_EXCEEDED naming the deadline, and the server
/// keeps serving. The work is longer than the deadline by construction, not by the speed of the
/// build: the request message is withheld until the answer has come, and no server can finish a
/// Retrieve it has not received (in a release build, 20 short documents are searched within
/// 1 ms, so a deadline that relied on the search being slow was met).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_work_is_deadline_exceeded() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start(dir.path()).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        let documents: Vec<_> = (0..20)
            .map(|i| {
                document(
                    &format!("d{i}"),
                    &format!("Bench plane {i} shavings and a sharp iron."),
                    Format::Plain,
                )
            })
            .collect();
        upsert(&mut client, "c", documents).await;
        // The server's own answer, seen through a raw HTTP/2 client.
        for (i, timeout, shown) in [(0, "1m", "1 ms"), (1, "50m", "50 ms")] {
            let (code, message) = raw_retrieve_with_grpc_timeout(
                server.address,
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
            let (_open, batches) = tokio::sync::mpsc::channel::<proto::UpsertDocumentsRequest>(1);
            let mut request =
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(batches));
            request.set_timeout(Duration::from_millis(1));
            let status = client.upload_documents(request).await.unwrap_err();
            assert!(
                status.code() == Code::DeadlineExceeded
                    || (status.code() == Code::Cancelled && status.message() == "Timeout expired"),
                "{status:?}"
            );
        }
        still_serving(&mut client, "c", "plane iron", "d0").await;
        server.stop().await;
    })
    .await
    .expect("bounded");
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
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = lexical_config(dir.path());
        config.server.max_concurrent_requests = LIMIT;
        let server = TestServer::start_with(config).await;
        let mut client = server.client.clone();
        create_collection(&mut client, "c").await;
        upsert(
            &mut client,
            "c",
            vec![document("d", "Coping saws cut curves.", Format::Plain)],
        )
        .await;
        let mut clients = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let channel = Channel::from_shared(server.channel_uri())
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
                    let request = retrieve_request("c", &format!("coping saws {}", i % 50), 100);
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
            let (sender, receiver) = tokio::sync::mpsc::channel::<proto::UpsertDocumentsRequest>(1);
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
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// A server spawned without the plaintext, key-less readiness loop of `TestServer` (TLS and API
/// key servers refuse it); `ready` is a call that succeeds once the server is serving.
struct SecuredServer {
    address: std::net::SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<lathe::error::Result<()>>,
}

impl SecuredServer {
    async fn spawn(config: Config) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(lathe::api::serve(config, listener, async move {
            let _ = shutdown_rx.await;
        }));
        Self {
            address,
            shutdown: Some(shutdown),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task
            .await
            .expect("server task")
            .expect("server result");
    }
}

struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// (certificate PEM, key PEM) for `names`, signed by this CA.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        (certificate.pem(), key.serialize_pem())
    }
}

async fn tls_client(
    address: std::net::SocketAddr,
    trusted_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<proto::ListCollectionsResponse, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trusted_ca))
        .domain_name("localhost");
    if let Some((certificate, key)) = identity {
        tls = tls.identity(Identity::from_pem(certificate, key));
    }
    let channel = Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| format!("connect: {error:?}"))?;
    LatheClient::new(channel)
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("call: {status:?}"))
}

/// Retries `call` until it succeeds (the engine opens before the listener is served).
async fn until_ready<F, Fut, T, E: std::fmt::Debug>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut last = None;
    for _ in 0..500 {
        match call().await {
            Ok(value) => return value,
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("server never became ready: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_wrong_certificate_is_refused_and_the_server_keeps_serving() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("lathe test server ca");
        let client_ca = TestCa::new("lathe test client ca");
        let stranger_ca = TestCa::new("some other ca");
        let (server_certificate, server_key) = server_ca.leaf(&["localhost", "127.0.0.1"]);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let mut config = lexical_config(&dir.path().join("data"));
        config.tls.cert_file = write("server.pem", &server_certificate);
        config.tls.key_file = write("server.key", &server_key);
        config.tls.client_ca_file = write("client-ca.pem", &client_ca.pem);
        let server = SecuredServer::spawn(config).await;
        let good_identity = client_ca.leaf(&["client"]);
        let stranger_identity = stranger_ca.leaf(&["client"]);

        until_ready(|| tls_client(server.address, &server_ca.pem, Some(&good_identity))).await;
        // The client trusts a different CA: the server's certificate is refused.
        let error = tls_client(server.address, &stranger_ca.pem, Some(&good_identity))
            .await
            .unwrap_err();
        assert!(error.contains("UnknownIssuer"), "{error}");
        // Mutual TLS: a client certificate from another CA, or none, is refused by the server.
        // (TLS 1.3: the client's handshake completes first, so the refusal arrives as the
        // server's alert on the first call.)
        // Which of the alert and the closed connection the client sees first varies.
        let error = tls_client(server.address, &server_ca.pem, Some(&stranger_identity))
            .await
            .unwrap_err();
        assert!(error.contains("tonic::transport::Error"), "{error}");
        let error = tls_client(server.address, &server_ca.pem, None)
            .await
            .unwrap_err();
        assert!(error.contains("tonic::transport::Error"), "{error}");
        // Plaintext against the TLS port fails too.
        let plaintext = Channel::from_shared(format!("http://{}", server.address))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect()
            .await;
        if let Ok(channel) = plaintext {
            // The code is the client's reading of TLS bytes as HTTP/2 (UNKNOWN, INTERNAL, ...).
            LatheClient::new(channel)
                .list_collections(proto::ListCollectionsRequest {})
                .await
                .unwrap_err();
        }
        // Still serving the right client.
        tls_client(server.address, &server_ca.pem, Some(&good_identity))
            .await
            .expect("the trusted client is still served");
        server.stop().await;
    })
    .await
    .expect("bounded");
}

fn with_key<T>(message: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_api_keys_are_unauthenticated_and_read_only_keys_cannot_write() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "read-write rw-secret\nread-only ro-secret\n").unwrap();
        let mut config = lexical_config(&dir.path().join("data"));
        config.auth.api_keys_file = keys.to_string_lossy().into_owned();
        let server = SecuredServer::spawn(config).await;
        let uri = format!("http://{}", server.address);
        let client = until_ready(|| {
            let uri = uri.clone();
            async move { Channel::from_shared(uri).unwrap().connect().await }
        })
        .await;
        until_ready(|| {
            let mut client = LatheClient::new(client.clone());
            async move {
                client
                    .list_collections(with_key(
                        proto::ListCollectionsRequest {},
                        Some("Bearer rw-secret"),
                    ))
                    .await
            }
        })
        .await;
        let mut lathe = LatheClient::new(client.clone());
        lathe
            .create_collection(with_key(
                proto::CreateCollectionRequest {
                    name: "c".into(),
                    settings: None,
                },
                Some("Bearer rw-secret"),
            ))
            .await
            .unwrap();
        let upsert_request = |id: &str| proto::UpsertDocumentsRequest {
            collection: "c".into(),
            documents: vec![document(id, "Scrapers and burnishers.", Format::Plain)],
            wait: true,
        };
        lathe
            .upsert_documents(with_key(upsert_request("keep"), Some("Bearer rw-secret")))
            .await
            .unwrap();

        for (authorization, needle) in [
            (None, "missing `authorization: Bearer <key>`"),
            (Some("Bearer wrong-secret"), "invalid API key"),
            (Some("Basic cnctc2VjcmV0"), "must be `Bearer <key>`"),
            (Some("Bearer "), "invalid API key"),
        ] {
            let status = expect_code(
                lathe
                    .retrieve(with_key(
                        retrieve_request("c", "scrapers", 100),
                        authorization,
                    ))
                    .await,
                Code::Unauthenticated,
                &[needle],
            );
            assert!(!status.message().contains("secret"), "{status:?}");
            expect_code(
                lathe
                    .upsert_documents(with_key(upsert_request("denied"), authorization))
                    .await,
                Code::Unauthenticated,
                &[needle],
            );
        }
        let read_only = Some("Bearer ro-secret");
        expect_code(
            lathe
                .upsert_documents(with_key(upsert_request("denied"), read_only))
                .await,
            Code::PermissionDenied,
            &["UpsertDocuments", "read-only"],
        );
        expect_code(
            lathe
                .delete_collection(with_key(
                    proto::DeleteCollectionRequest { name: "c".into() },
                    read_only,
                ))
                .await,
            Code::PermissionDenied,
            &["DeleteCollection", "read-only"],
        );
        expect_code(
            lathe
                .upload_documents(with_key(
                    tokio_stream::iter(vec![upsert_request("denied")]),
                    read_only,
                ))
                .await,
            Code::PermissionDenied,
            &["UploadDocuments", "read-only"],
        );
        // Reads with the read-only key work, and nothing denied was written.
        let response = lathe
            .retrieve(with_key(retrieve_request("c", "scrapers", 100), read_only))
            .await
            .unwrap()
            .into_inner();
        let ids: Vec<&str> = response.chunks.iter().map(|c| c.doc_id.as_str()).collect();
        assert_eq!(ids, ["keep"]);
        // Health stays open for probes.
        use tonic_health::pb::health_client::HealthClient;
        HealthClient::new(client.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: "lathe.v1.Lathe".into(),
            })
            .await
            .unwrap();
        server.stop().await;
    })
    .await
    .expect("bounded");
}

/// `lathe ingest` on a .jsonl file with a lone surrogate escape: the real binary exits non-zero
/// naming the file and the line, and nothing reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lathe_ingest_refuses_a_lone_surrogate_naming_the_line_and_ingests_nothing() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(lexical_config(&dir.path().join("data"))).await;
        let mut client = server.client.clone();
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"id\":\"a\",\"text\":\"Veneer saws.\"}\n\n{\"id\":\"b\",\"text\":\"bad \\ud800 half\"}\n{\"id\":\"c\",\"text\":\"never\"}\n",
        )
        .unwrap();
        let good = dir.path().join("good.jsonl");
        std::fs::write(
            &good,
            "{\"id\":\"nul\\u0000id\",\"text\":\"Veneer\\u0000saws and \\ufffd glue.\",\"metadata\":{\"k\\u0000\":\"v\"}}\n",
        )
        .unwrap();
        let ingest = |path: std::path::PathBuf, collection: &str| {
            let address = server.address.to_string();
            let collection = collection.to_string();
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_lathe"))
                    .args(["ingest", "--collection", &collection, "--addr", &address])
                    .arg(path)
                    .output()
                    .expect("run lathe ingest")
            })
        };
        let output = ingest(bad.clone(), "jsonl").await.unwrap();
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
        let output = ingest(good, "jsonl").await.unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let response = retrieve(&mut client, retrieve_request("jsonl", "veneer glue", 100)).await;
        assert_eq!(response.chunks[0].doc_id, "nul\u{0}id");
        assert_eq!(response.chunks[0].metadata["k\u{0}"], "v");
        server.stop().await;
    })
    .await
    .expect("bounded");
}
