//! The HTTP/JSON API (`server.http_listen`) through real HTTP/1.1 requests: every RPC in the
//! proto3 JSON mapping (a snapshot file's download and restore as its bytes), retrieve equal to gRPC's and to `lathe query --json`, the bad-input
//! table's rows (docs/bad-input.md) as HTTP codes with gRPC's messages naming the field, API keys,
//! health, the OpenAPI document, the README's curl lines, TLS from the gRPC port's certificate,
//! and the port off by default.

mod common;

use std::net::SocketAddr;

use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use lathe::api::proto;
use lathe::api::InProcessServer;
use serde_json::{json, Value};

/// An HTTP answer: its code, headers and body (JSON when it parses).
#[derive(Debug)]
struct Answer {
    code: u16,
    headers: http::HeaderMap,
    json: Value,
    bytes: Bytes,
}

/// One request over a fresh HTTP/1.1 connection (TLS when `tls` is given).
async fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    send_on(stream, method, path, headers, body.into()).await
}

async fn send_on<Io>(
    io: Io,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .expect("HTTP handshake");
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Full::new(body)).unwrap())
        .await
        .expect("an HTTP answer");
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Answer {
        code,
        headers,
        json,
        bytes,
    }
}

async fn post(address: SocketAddr, path: &str, body: Value) -> Answer {
    send(address, "POST", path, &[], body.to_string()).await
}

async fn get(address: SocketAddr, path: &str) -> Answer {
    send(address, "GET", path, &[], Bytes::new()).await
}

fn ok(answer: Answer) -> Value {
    assert_eq!(answer.code, 200, "{answer:?}");
    answer.json
}

/// The answer is `code` with a google.rpc.Status body whose message holds every one of `needles`.
#[track_caller]
fn refused(answer: &Answer, code: u16, grpc_code: i32, needles: &[&str]) {
    assert_eq!(answer.code, code, "{answer:?}");
    assert_eq!(answer.json["code"], grpc_code, "{answer:?}");
    let message = answer.json["message"].as_str().expect("a message");
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in {message:?}");
    }
}

fn http_config(config: &mut lathe::config::Config) {
    config.server.http_listen = "127.0.0.1:0".to_string();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_over_http_and_retrieve_matches_lathe_query_json() {
    Fixture::lexical()
        .config(http_config)
        .run(|served| async move {
            let http = served.http_address.expect("the HTTP port");
            let openapi = ok(get(http, "/v1/openapi.json").await);
            let mut operations: Vec<&str> = openapi["paths"]
                .as_object()
                .unwrap()
                .values()
                .flat_map(|item| item.as_object().unwrap().values())
                .map(|operation| operation["operationId"].as_str().unwrap())
                .collect();
            operations.sort_unstable();
            assert_eq!(operations.len(), 22, "{operations:?}");

            let created = ok(post(http, "/v1/collections", json!({"name": "docs"})).await);
            assert_eq!(created["name"], "docs");
            assert_eq!(created["state"], "COLLECTION_STATE_READY");
            let listed = ok(get(http, "/v1/collections").await);
            assert_eq!(listed["collections"][0]["name"], "docs");
            assert_eq!(ok(get(http, "/v1/collections/docs").await)["name"], "docs");

            let upserted = ok(post(http, "/v1/collections/docs/documents:upsert", json!({
                "documents": [
                    {"id": "lathe", "text": "# Lathes\n\nA lathe turns wood against a fixed chisel.", "format": "DOCUMENT_FORMAT_MARKDOWN", "metadata": {"shop": "wood"}},
                    {"id": "kiln", "text": "A kiln fires clay into pottery.", "format": "DOCUMENT_FORMAT_PLAIN"},
                ],
                "wait": true,
            })).await);
            assert_eq!(upserted["documents"], 2);
            assert!(upserted["consistencyToken"].is_string(), "64-bit integers are strings: {upserted}");
            let lines = [
                json!({"documents": [{"id": "forge", "text": "A forge heats iron until it glows."}]}),
                json!({"documents": [{"id": "loom", "text": "A loom weaves thread into cloth."}], "wait": true}),
            ];
            let ndjson = format!("{}\n\n{}\n", lines[0], lines[1]);
            let uploaded = ok(send(http, "POST", "/v1/collections/docs/documents:upload", &[], ndjson).await);
            assert_eq!(uploaded["documents"], 2);
            assert_eq!(uploaded["operationIds"].as_array().unwrap().len(), 2);

            let listed = ok(get(http, "/v1/collections/docs/operations?limit=2").await);
            let newest = listed["operations"][0]["id"].as_str().unwrap().to_string();
            assert_eq!(listed["operations"].as_array().unwrap().len(), 2);
            let operation = ok(get(http, &format!("/v1/operations/{newest}")).await);
            assert_eq!(operation["state"], "OPERATION_STATE_APPLIED");
            let waited = ok(post(http, &format!("/v1/operations/{newest}:wait"), json!({"timeoutMs": 1000})).await);
            assert_eq!(waited["id"], newest.as_str());

            // The same request as `lathe query --budget 512 --json QUERY` sends.
            let request = json!({"query": "lathe chisel", "tokenBudget": 512, "chunking": {}, "filter": {}});
            let mut answer = ok(post(http, "/v1/collections/docs:retrieve", request).await);
            assert_eq!(answer["chunks"][0]["docId"], "lathe");
            let address = served.address.to_string();
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_lathe"))
                    .args(["query", "-c", "docs", "--addr", &address, "--budget", "512", "--json", "lathe chisel"])
                    .output()
                    .expect("run lathe query")
            })
            .await
            .unwrap();
            assert!(output.status.success(), "{output:?}");
            let mut printed: Value = serde_json::from_slice(&output.stdout).expect("lathe query --json prints JSON");
            for answer in [&mut answer, &mut printed] {
                // Stage timings and whether the cache answered differ from one call to the next.
                let object = answer.as_object_mut().unwrap();
                assert!(object.remove("timings").is_some());
                object.remove("cacheHit");
            }
            assert_eq!(answer, printed);

            let deleted = ok(post(http, "/v1/collections/docs/documents:delete", json!({"ids": ["kiln"], "wait": true})).await);
            assert_eq!(deleted["documents"], 1);

            // Aliases and snapshots.
            ok(post(http, "/v1/collections", json!({"name": "docs-v2"})).await);
            let alias = ok(post(http, "/v1/aliases", json!({"alias": "live", "collection": "docs"})).await);
            assert_eq!(alias, json!({"alias": "live", "collection": "docs"}));
            let through = ok(post(http, "/v1/collections/live:retrieve", json!({"query": "lathe chisel", "tokenBudget": 512})).await);
            assert_eq!(through["chunks"][0]["docId"], "lathe");
            ok(post(http, "/v1/aliases/live:switch", json!({"collection": "docs-v2"})).await);
            assert_eq!(ok(get(http, "/v1/aliases").await)["aliases"][0]["collection"], "docs-v2");
            ok(send(http, "DELETE", "/v1/aliases/live", &[], Bytes::new()).await);
            assert_eq!(ok(get(http, "/v1/aliases").await), json!({}));
            let snapshot = ok(post(http, "/v1/collections/docs/snapshots", json!({})).await);
            assert_eq!(snapshot["collection"], "docs");
            let name = snapshot["name"].as_str().unwrap().to_string();
            let listed = ok(get(http, "/v1/snapshots?collection=docs").await);
            assert_eq!(listed["snapshots"][0]["name"], name.as_str());
            let file = get(http, &format!("/v1/collections/docs/snapshots/{name}:download")).await;
            assert_eq!(file.code, 200, "{file:?}");
            assert_eq!(file.headers["content-type"], "application/octet-stream");
            assert_eq!(snapshot["bytes"].as_str().unwrap(), file.bytes.len().to_string());
            assert_eq!(file.headers["content-length"].to_str().unwrap(), file.bytes.len().to_string());
            let bytes_header = [("content-type", "application/octet-stream")];
            let restored = ok(send(http, "POST", "/v1/collections/copy:restore", &bytes_header, file.bytes.clone()).await);
            assert_eq!((&restored["collection"]["name"], &restored["sourceCollection"]), (&json!("copy"), &json!("docs")));
            let kept = json!({"snapshotCollection": "docs", "snapshotName": name});
            let restored = ok(post(http, "/v1/collections/kept:restore", kept).await);
            assert_eq!(restored["generation"], snapshot["generation"]);
            let question = json!({"query": "lathe chisel", "tokenBudget": 512});
            let mut source = ok(post(http, "/v1/collections/docs:retrieve", question.clone()).await);
            for copy in ["copy", "kept"] {
                let mut answer = ok(post(http, &format!("/v1/collections/{copy}:retrieve"), question.clone()).await);
                for reply in [&mut source, &mut answer] {
                    let object = reply.as_object_mut().unwrap();
                    object.remove("timings");
                    object.remove("cacheHit");
                }
                assert_eq!(answer, source, "{copy} answers as docs did");
            }
            let mut cut = file.bytes.to_vec();
            cut.truncate(cut.len() / 2);
            let damaged = send(http, "POST", "/v1/collections/cut:restore", &bytes_header, cut).await;
            refused(&damaged, 500, 15, &["snapshot"]);
            refused(&get(http, "/v1/collections/cut").await, 404, 5, &["cut"]);
            ok(send(http, "DELETE", &format!("/v1/collections/docs/snapshots/{name}"), &[], Bytes::new()).await);
            refused(&send(http, "DELETE", &format!("/v1/collections/docs/snapshots/{name}"), &[], Bytes::new()).await, 404, 5, &[&name]);

            // A single node has no write log to recover.
            let recover = json!({"recovery": "RECOVERY_START_OVER", "confirmStream": "LATHE"});
            refused(&post(http, "/v1/log:recover", recover).await, 400, 9, &["single node"]);

            ok(send(http, "DELETE", "/v1/collections/docs", &[], Bytes::new()).await);
            refused(&get(http, "/v1/collections/docs").await, 404, 5, &["docs"]);
            refused(&get(http, "/v1/nothing").await, 404, 5, &["/v1/openapi.json"]);
            let wrong = send(http, "PUT", "/v1/collections", &[], Bytes::new()).await;
            refused(&wrong, 405, 12, &["PUT"]);
            assert_eq!(wrong.headers["allow"], "POST, GET");
        })
        .await;
}

/// The same Retrieve over HTTP and over gRPC returns the same chunks (the reply in the proto3
/// JSON mapping is the gRPC reply's, timings and the cache flag aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieve_over_http_returns_the_chunks_grpc_returns() {
    let documents = vec![
        document(
            "lathe",
            "# Lathes\n\nA lathe turns wood against a fixed chisel.",
            proto::DocumentFormat::Markdown,
        ),
        document(
            "kiln",
            "A kiln fires clay into pottery. Clay shrinks in the kiln.",
            proto::DocumentFormat::Plain,
        ),
        document(
            "forge",
            "A forge heats iron until it glows; the smith hammers it.",
            proto::DocumentFormat::Plain,
        ),
    ];
    Fixture::lexical()
        .config(http_config)
        .collection("docs")
        .documents(documents)
        .run(|mut served| async move {
            let http = served.http_address.expect("the HTTP port");
            let mut request = retrieve_request("docs", "kiln clay lathe", 64);
            request.top_k = Some(2);
            let body = serde_json::to_value(&request).unwrap();
            let mut over_http = ok(post(http, "/v1/collections/docs:retrieve", body).await);
            let reply = served
                .client
                .retrieve(request)
                .await
                .expect("gRPC Retrieve")
                .into_inner();
            assert!(!reply.chunks.is_empty(), "{reply:?}");
            // As written (`to_value` would widen each f32 score to f64 digits).
            let mut over_grpc: Value =
                serde_json::from_str(&serde_json::to_string(&reply).unwrap()).unwrap();
            for answer in [&mut over_http, &mut over_grpc] {
                let object = answer.as_object_mut().unwrap();
                object.remove("timings");
                object.remove("cacheHit");
            }
            assert_eq!(over_http, over_grpc);
            let ids: Vec<&str> = over_http["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["docId"].as_str().unwrap())
                .collect();
            assert!(ids.contains(&"kiln"), "{over_http}");
        })
        .await;
}

/// A bad field is HTTP 400 with the very message gRPC's INVALID_ARGUMENT carries, naming the
/// field; an unknown collection is 404 with gRPC's NOT_FOUND message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_field_is_400_with_grpcs_message_and_an_unknown_collection_404() {
    Fixture::lexical()
        .config(http_config)
        .collection("docs")
        .run(|mut served| async move {
            let http = served.http_address.expect("the HTTP port");
            for (collection, budget, http_code, grpc_code) in [
                ("docs", 0, 400, tonic::Code::InvalidArgument),
                ("nope", 10, 404, tonic::Code::NotFound),
            ] {
                let request = retrieve_request(collection, "lathes", budget);
                let body = serde_json::to_value(&request).unwrap();
                let path = format!("/v1/collections/{collection}:retrieve");
                let answer = post(http, &path, body).await;
                let status = served
                    .client
                    .retrieve(request)
                    .await
                    .expect_err("gRPC refuses it");
                assert_eq!(status.code(), grpc_code, "{status:?}");
                refused(&answer, http_code, grpc_code as i32, &[status.message()]);
                assert_eq!(answer.json["message"], status.message(), "{answer:?}");
            }
            let answer = post(
                http,
                "/v1/collections/docs:retrieve",
                json!({"query": "q", "tokenBudget": 0}),
            )
            .await;
            refused(&answer, 400, 3, &["invalid `token_budget`"]);
        })
        .await;
}

/// `server.http_listen` is off by default: no HTTP port is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_is_off_by_default() {
    assert_eq!(lathe::config::Config::default().server.http_listen, "");
    Fixture::lexical()
        .run(|served| async move {
            assert_eq!(served.http_address, None);
        })
        .await;
}

/// The OpenAPI document parses as JSON and lists every route, health included, with the
/// request and reply schemas derived from the proto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_the_paths_and_health_answers() {
    Fixture::lexical()
        .config(http_config)
        .run(|served| async move {
            let http = served.http_address.expect("the HTTP port");
            let answer = get(http, "/v1/openapi.json").await;
            assert_eq!(answer.headers["content-type"], "application/json");
            let document = ok(answer);
            assert_eq!(document["openapi"], "3.0.3");
            let paths = document["paths"].as_object().expect("paths");
            for path in [
                "/v1/collections",
                "/v1/collections/{name}",
                "/v1/collections/{collection}:retrieve",
                "/v1/collections/{collection}/documents:upsert",
                "/v1/collections/{collection}/documents:delete",
                "/v1/health",
            ] {
                assert!(paths.contains_key(path), "{path} not in {:?}", paths.keys());
            }
            let retrieve = &paths["/v1/collections/{collection}:retrieve"]["post"];
            assert_eq!(
                retrieve["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/RetrieveRequest"
            );
            assert_eq!(
                document["components"]["schemas"]["RetrieveRequest"]["properties"]["tokenBudget"]
                    ["type"],
                "integer"
            );
            assert_eq!(
                ok(get(http, "/v1/health").await),
                json!({"status": "SERVING"})
            );
        })
        .await;
}

/// The README's curl lines (section "HTTP/JSON") run against a server and succeed: the last
/// retrieves the document the second wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_curl_examples_work() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## HTTP/JSON")
        .nth(1)
        .expect("README has a section HTTP/JSON");
    let section = section.split("\n## ").next().unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with("curl "))
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    Fixture::lexical()
        .config(http_config)
        .run(|served| async move {
            let http = served.http_address.expect("the HTTP port").to_string();
            let mut last = Value::Null;
            for line in lines {
                let command = format!("{} --fail-with-body", line.replace("localhost:8080", &http));
                let output = tokio::task::spawn_blocking(move || {
                    std::process::Command::new("sh")
                        .args(["-c", &command])
                        .output()
                        .expect("run curl")
                })
                .await
                .unwrap();
                assert!(output.status.success(), "{line}: {output:?}");
                last = serde_json::from_slice(&output.stdout).expect("curl prints JSON");
            }
            assert!(
                !last["chunks"].as_array().expect("chunks").is_empty(),
                "{last}"
            );
        })
        .await;
}

/// docs/bad-input.md's rows that an HTTP request can carry: the HTTP code of the gRPC status and
/// a body naming the field (by its proto name from the server's checks, by its JSON path when the
/// JSON itself cannot be a message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_input_rows_get_their_http_codes_and_name_the_field() {
    Fixture::lexical()
        .config(|config| {
            http_config(config);
            config.limits.max_batch_documents = 4;
            config.limits.max_document_bytes = 1024;
            config.limits.max_message_bytes = 64 << 10;
        })
        .run(|served| async move {
            let http = served.http_address.expect("the HTTP port");
            ok(post(http, "/v1/collections", json!({"name": "c"})).await);
            let retrieve = |extra: Value| {
                let mut request = json!({"query": "lathes", "tokenBudget": 100});
                request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                post(http, "/v1/collections/c:retrieve", request)
            };
            let rows: Vec<(&str, Value, u16, i32, Vec<&str>)> = vec![
                ("1", json!({"query": ""}), 400, 3, vec!["`query`", "non-whitespace"]),
                ("2", json!({"query": " \n\t "}), 400, 3, vec!["`query`"]),
                ("3", json!({"query": "q".repeat(20_000)}), 400, 3, vec!["`query`", "1..=16384"]),
                ("5", json!({"query": "q".repeat(1 << 20)}), 429, 8, vec!["max_message_bytes"]),
                ("6", json!({"tokenBudget": 0}), 400, 3, vec!["`token_budget`", "1..=32768"]),
                ("7", json!({"tokenBudget": 32_769}), 400, 3, vec!["`token_budget`", "1..=32768"]),
                ("8", json!({"tokenBudget": -1}), 400, 3, vec!["`tokenBudget`"]),
                ("9", json!({"topK": 0}), 400, 3, vec!["`top_k`", "1..=100"]),
                ("10", json!({"topK": 1_000_000}), 400, 3, vec!["`top_k`", "1..=100"]),
                ("11", json!({"chunking": {"strategy": 42}}), 400, 3, vec!["`chunking.strategy`"]),
                ("12", json!({"chunking": {"maxTokens": 0}}), 400, 3, vec!["`chunking.max_tokens`", "1..=8192"]),
                ("13", json!({"chunking": {"maxTokens": 8193}}), 400, 3, vec!["`chunking.max_tokens`"]),
                ("14", json!({"chunking": {"strategy": "CHUNK_STRATEGY_FIXED", "maxTokens": 16, "overlapTokens": 16}}), 400, 3, vec!["`chunking.overlap_tokens`", "0..=15"]),
                ("15", json!({"chunking": {"strategy": "CHUNK_STRATEGY_SENTENCE", "maxTokens": 16, "overlapTokens": 40}}), 400, 3, vec!["`chunking.overlap_tokens`", "below"]),
                ("16", json!({"chunking": {"unit": 7}}), 400, 3, vec!["`chunking.unit`"]),
                ("17", json!({"chunking": {"strategy": "CHUNK_STRATEGY_SEMANTIC", "semanticAmount": 150}}), 400, 3, vec!["`chunking.semantic_amount`", "0..=100"]),
                ("18", json!({"chunking": {"strategy": "CHUNK_STRATEGY_RECURSIVE", "separators": ["\n\n", ""]}}), 400, 3, vec!["`chunking.separators[1]`", "must not be empty"]),
                ("19", json!({"order": 9}), 400, 3, vec!["`order`"]),
                ("22", json!({"filter": {"metadata": [{"key": "", "value": "x"}]}}), 400, 3, vec!["`filter.metadata[0].key`", "must not be empty"]),
                ("23", json!({"filter": {"metadata": [{"key": "team\u{1f}red", "value": "x"}]}}), 400, 3, vec!["`filter.metadata[0].key`", "U+001F"]),
                ("65", json!({"minScore": "Infinity"}), 400, 3, vec!["`min_score`", "finite"]),
                ("65", json!({"minScore": "NaN"}), 400, 3, vec!["`min_score`", "finite"]),
                ("66", json!({"maxChunksPerDocument": 0}), 400, 3, vec!["`max_chunks_per_document`", "1..=1000"]),
                ("67", json!({"diversity": -0.5}), 400, 3, vec!["`diversity`", "0..=1"]),
                ("body", json!({"tokenBudget": "many"}), 400, 3, vec!["`tokenBudget`"]),
                ("body", json!({"unknownField": 1}), 400, 3, vec!["unknownField"]),
            ];
            for (row, extra, code, grpc_code, needles) in rows {
                let answer = retrieve(extra).await;
                assert_eq!(answer.code, code, "row {row}: {answer:?}");
                refused(&answer, code, grpc_code, &needles);
            }
            let unknown = post(http, "/v1/collections/nope:retrieve", json!({"query": "q", "tokenBudget": 10})).await;
            refused(&unknown, 404, 5, &["collection `nope` not found"]); // row 20
            let not_json = send(http, "POST", "/v1/collections/c:retrieve", &[], "{\"query\": ").await;
            refused(&not_json, 400, 3, &["`body`", "JSON"]);

            // Writes.
            refused(&post(http, "/v1/collections", json!({"name": "c"})).await, 409, 6, &["already exists"]); // 24
            refused(&post(http, "/v1/collections", json!({"name": "../evil"})).await, 400, 3, &["`name`", "[A-Za-z0-9_-]"]); // 25
            let gpt9 = json!({"name": "g", "settings": {"budgetTokenizer": "gpt9"}});
            refused(&post(http, "/v1/collections", gpt9).await, 400, 3, &["`settings.budget_tokenizer`", "cl100k_base"]); // 26
            let upsert = |collection: &str, documents: Value| {
                let path = format!("/v1/collections/{collection}/documents:upsert");
                async move { post(http, &path, json!({"documents": documents, "wait": true})).await }
            };
            let good = json!({"id": "good", "text": "Lathes turn wood."});
            refused(&upsert("absent", json!([good])).await, 404, 5, &["collection `absent` not found"]); // 27
            let over = json!({"id": "big", "text": "x".repeat(1025)});
            refused(&upsert("c", json!([good, over])).await, 429, 8, &["documents[1].text", "1025", "1024"]); // 30
            let five: Vec<Value> = (0..5).map(|i| json!({"id": format!("d{i}"), "text": "t"})).collect();
            refused(&upsert("c", json!(five)).await, 400, 3, &["`documents`", "0..=4"]); // 31
            let batch = |third: Value| json!([good, {"id": "keep", "text": "kept"}, third]);
            let write_rows: Vec<(&str, Value, Vec<&str>)> = vec![
                ("41", json!({"id": "m", "text": "t", "metadata": {"team\u{1f}red": "x"}}), vec!["`documents[0].metadata`", "U+001F"]),
                ("42", json!({"id": "keep", "text": "again"}), vec!["`documents[2].id`", "more than once"]),
                ("43", json!({"id": "e", "text": "t", "metadata": {"": "x"}}), vec!["`documents[2].metadata`", "must not be empty"]),
                ("44", json!({"id": "f", "text": "t", "format": 9}), vec!["`documents[2].format`"]),
                ("45", json!({"id": "s", "text": "short", "sections": [{"start": 3, "end": 2}]}), vec!["documents[s].sections"]),
                ("47", json!({"id": "", "text": "t"}), vec!["`documents[2].id`", "must not be empty"]),
            ];
            for (row, document, needles) in write_rows {
                let documents = if row == "41" { json!([document]) } else { batch(document) };
                let answer = upsert("c", documents).await;
                assert_eq!(answer.code, 400, "row {row}: {answer:?}");
                refused(&answer, 400, 3, &needles);
            }
            let delete = json!({"ids": ["good", ""]});
            refused(&post(http, "/v1/collections/c/documents:delete", delete).await, 400, 3, &["`ids[1]`", "must not be empty"]); // 48
            let lines = format!("{}\n{}\n", json!({"documents": [good]}), json!({"collection": "other", "documents": [good]}));
            let mixed = send(http, "POST", "/v1/collections/c/documents:upload", &[], lines).await;
            refused(&mixed, 400, 3, &["line 2", "`collection`", "other"]); // 49
            // Nothing of the refused batches was applied; the upload's first line was.
            let answer = ok(post(http, "/v1/collections/c:retrieve", json!({"query": "lathes wood kept", "tokenBudget": 200, "filter": {"docIds": ["good", "keep"]}})).await);
            let ids: Vec<&str> = answer["chunks"].as_array().into_iter().flatten().map(|c| c["docId"].as_str().unwrap()).collect();
            assert!(!ids.contains(&"keep"), "{answer}");

            ok(retrieve(json!({})).await);
        })
        .await;
}

/// Rows 61 to 64 over HTTP: the API keys of the gRPC port, on every route but the OpenAPI
/// document (open, as reflection is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_the_http_port_as_they_guard_grpc() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "read-write rw-secret\nread-only ro-secret\n").unwrap();
        let mut config = lexical_config(&dir.path().join("data"));
        http_config(&mut config);
        config.auth.api_keys_file = keys.to_string_lossy().into_owned();
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let http = server.http_address().expect("the HTTP port");
        let read_write = [("authorization", "Bearer rw-secret")];
        until_ready(|| async {
            let answer = send(http, "GET", "/v1/collections", &read_write, Bytes::new()).await;
            (answer.code == 200).then_some(()).ok_or(answer)
        })
        .await;
        ok(get(http, "/v1/openapi.json").await);
        let create = json!({"name": "c"}).to_string();
        refused(
            &send(http, "POST", "/v1/collections", &[], create.clone()).await,
            401,
            16,
            &["missing `authorization: Bearer <key>`"],
        );
        let answer = send(
            http,
            "POST",
            "/v1/collections",
            &[("authorization", "Bearer nope")],
            create.clone(),
        )
        .await;
        refused(&answer, 401, 16, &["invalid API key"]);
        let basic = send(
            http,
            "GET",
            "/v1/collections",
            &[("authorization", "Basic cnc6c2VjcmV0")],
            Bytes::new(),
        )
        .await;
        refused(&basic, 401, 16, &["must be `Bearer <key>`"]);
        ok(send(http, "POST", "/v1/collections", &read_write, create).await);
        let read_only = [("authorization", "Bearer ro-secret")];
        let upsert = json!({"documents": [{"id": "d", "text": "t"}]}).to_string();
        let answer = send(
            http,
            "POST",
            "/v1/collections/c/documents:upsert",
            &read_only,
            upsert.clone(),
        )
        .await;
        refused(&answer, 403, 7, &["UpsertDocuments writes", "read-only"]);
        let answer = send(
            http,
            "POST",
            "/v1/collections/c/documents:upload",
            &read_only,
            upsert,
        )
        .await;
        refused(&answer, 403, 7, &["UploadDocuments writes"]);
        ok(send(http, "GET", "/v1/collections/c", &read_only, Bytes::new()).await);
        server.stop().await.expect("the server stops");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}

/// With TLS configured, the HTTP port speaks TLS with the same certificate (and client CA), and
/// refuses plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_uses_the_servers_tls() {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let ca = common::tls::TestCa::new("lathe test ca");
        let ca_pem = ca.pem.clone();
        let (server_pem, server_key) = ca.leaf(&["localhost"]);
        let (client_pem, client_key) = ca.leaf(&["client"]);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let mut config = lexical_config(&dir.path().join("data"));
        http_config(&mut config);
        config.tls.cert_file = write("server.pem", &server_pem);
        config.tls.key_file = write("server.key", &server_key);
        config.tls.client_ca_file = write("ca.pem", &ca_pem);
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let http = server.http_address().expect("the HTTP port");

        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let client_config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(client_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(client_key.as_bytes()).unwrap(),
            )
            .unwrap();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_config));
        let answer = until_ready(|| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(http)
                    .await
                    .map_err(|e| e.to_string())?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                let answer = send_on(tls, "GET", "/v1/collections", &[], Bytes::new()).await;
                (answer.code == 200)
                    .then_some(answer)
                    .ok_or_else(|| "not serving yet".to_string())
            }
        })
        .await;
        // No collections yet: the proto3 JSON mapping leaves the empty list out.
        assert_eq!(answer.json, json!({}), "{answer:?}");
        // Plaintext HTTP to the TLS port gets no HTTP answer.
        let mut tcp = tokio::net::TcpStream::connect(http).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /v1/collections HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tcp.read_to_end(&mut buffer),
        )
        .await;
        assert!(
            !buffer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buffer)
        );
        server.stop().await.expect("the server stops");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}
