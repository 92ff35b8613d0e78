//! Embed reuse through the real server: an upsert sends to the model only the sections whose
//! embedding input changed (counted by `lathe_embed_sections_total` over /metrics), and what it
//! stores answers as a fresh ingest of the same text does; a question asked again at another
//! budget takes its vector from the query-vector cache instead of the model.

mod common;

use std::collections::HashMap;

use common::{binary, create_collection, retrieve, retrieve_request, upsert, Fixture, Served};
use lathe::api::proto;
use lathe::config::DenseModel;

const SECTIONS: usize = 100;

/// Paragraph `i` of the test document: two sentences whose words set it apart from the others.
fn paragraph(i: usize) -> String {
    let topics = [
        "harbour cranes",
        "glacier melt",
        "violin strings",
        "copper mining",
        "bread ovens",
        "tidal energy",
        "bee colonies",
        "railway signals",
        "paper mills",
        "desert lizards",
    ];
    let topic = topics[i % topics.len()];
    format!(
        "Paragraph {i} is about {topic} in region {}. Its second sentence adds detail number {} on {topic}.",
        i / topics.len(),
        i * 7 + 3
    )
}

/// One document of `paragraphs`, each its own caller-given section.
fn document_of(paragraphs: &[String]) -> proto::Document {
    let mut text = String::new();
    let mut sections = Vec::with_capacity(paragraphs.len());
    for (i, paragraph) in paragraphs.iter().enumerate() {
        if i > 0 {
            text.push_str("\n\n");
        }
        let start = text.len() as u64;
        text.push_str(paragraph);
        sections.push(proto::SectionBoundary {
            start,
            end: text.len() as u64,
            title: format!("Part {i}"),
        });
    }
    proto::Document {
        id: "long".to_string(),
        title: "A long document".to_string(),
        text,
        format: proto::DocumentFormat::Plain as i32,
        sections,
        ..Default::default()
    }
}

/// `lathe_embed_sections_total{outcome="<outcome>"}` (0 before the first upsert with a model).
fn sections_counted(metrics_address: &str, outcome: &str) -> u64 {
    let body = binary::scrape_metrics(metrics_address);
    let prefix = format!("lathe_embed_sections_total{{outcome=\"{outcome}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().parse().expect("a counter value"))
        .unwrap_or(0)
}

/// (embedded, reused) sections counted since `before`.
fn counted_since(metrics_address: &str, before: (u64, u64)) -> (u64, u64) {
    (
        sections_counted(metrics_address, "embedded") - before.0,
        sections_counted(metrics_address, "reused") - before.1,
    )
}

/// A server with `dense` vectors and its metrics endpoint at `metrics_address`.
fn with_metrics(dense: DenseModel, metrics_address: &str) -> Fixture {
    Fixture::new().config(|config| {
        config.models.dense = dense;
        config.server.metrics_listen = metrics_address.to_string();
    })
}

/// A 100-section document is embedded whole once; a re-upsert of identical content sends
/// nothing to the model; editing one paragraph sends that one section; and the vectors the edited
/// version ends up with (99 reused, 1 new) answer exactly as a fresh ingest of the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upsert_embeds_only_the_sections_whose_text_changed() {
    let metrics_address = binary::free_local_address();
    with_metrics(DenseModel::Static, &metrics_address)
        .collection("edited")
        .run(|Served { mut client, .. }| async move {
            create_collection(&mut client, "fresh").await;

            let mut paragraphs: Vec<String> = (0..SECTIONS).map(paragraph).collect();
            let start = counted_since(&metrics_address, (0, 0));
            let written = upsert(&mut client, "edited", vec![document_of(&paragraphs)]).await;
            assert_eq!(written.sections, SECTIONS as u32);
            assert_eq!(
                counted_since(&metrics_address, start),
                (SECTIONS as u64, 0),
                "the first upsert embeds every section"
            );

            let before = counted_since(&metrics_address, (0, 0));
            upsert(&mut client, "edited", vec![document_of(&paragraphs)]).await;
            assert_eq!(
                counted_since(&metrics_address, before),
                (0, SECTIONS as u64),
                "an identical re-upsert reuses every section"
            );

            // A longer paragraph 37: every later section moves, but only this one's text changed.
            paragraphs[37] =
                "Paragraph 37 was rewritten: it now speaks of lighthouse keepers and their \
                      long winter nights. A third sentence was added too."
                    .to_string();
            let before = counted_since(&metrics_address, (0, 0));
            upsert(&mut client, "edited", vec![document_of(&paragraphs)]).await;
            assert_eq!(
                counted_since(&metrics_address, before),
                (1, SECTIONS as u64 - 1),
                "an edit of one paragraph embeds that section only"
            );

            let before = counted_since(&metrics_address, (0, 0));
            upsert(&mut client, "fresh", vec![document_of(&paragraphs)]).await;
            assert_eq!(
                counted_since(&metrics_address, before),
                (SECTIONS as u64, 0),
                "another collection's sections are not reused"
            );

            // Dense similarity of each chunk both collections return: equal vectors give equal values.
            // (BM25 may differ: the edited collection still counts its replaced sections' terms until
            // tantivy merges them away.)
            let mut compared = 0;
            for query in [
                "lighthouse keepers in winter",
                "glacier melt detail",
                "copper mining region 3",
                "bee colonies and railway signals",
            ] {
                let dense_by_chunk =
                    |response: proto::RetrieveResponse| -> HashMap<(String, u64), f32> {
                        response
                            .chunks
                            .into_iter()
                            .map(|chunk| {
                                let dense = chunk.score_parts.expect("score parts").dense;
                                ((chunk.section_id, chunk.bytes.expect("bytes").start), dense)
                            })
                            .collect()
                    };
                let edited = dense_by_chunk(
                    retrieve(&mut client, retrieve_request("edited", query, 2048)).await,
                );
                let fresh = dense_by_chunk(
                    retrieve(&mut client, retrieve_request("fresh", query, 2048)).await,
                );
                for (chunk, dense) in &edited {
                    if let Some(fresh_dense) = fresh.get(chunk) {
                        assert_eq!(dense, fresh_dense, "dense part of {chunk:?} for {query:?}");
                        assert!(*dense != 0.0, "the dense leg scored {chunk:?}");
                        compared += 1;
                    }
                }
            }
            assert!(compared >= 8, "only {compared} chunks were in both answers");
        })
        .await;
}

/// `lathe_cache_lookups_total{cache="query_vector",result="<result>"}`: each is one query that
/// needed a vector, `miss` the ones the model embedded.
fn query_vector_lookups(metrics_address: &str, result: &str) -> u64 {
    let body = binary::scrape_metrics(metrics_address);
    let prefix =
        format!("lathe_cache_lookups_total{{cache=\"query_vector\",result=\"{result}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().parse().expect("a counter value"))
        .unwrap_or(0)
}

/// The same question at three budgets (and with other whitespace, which the edge normalises)
/// runs the model once; the answers at the second and third budget are computed (no result-cache
/// hit) with the cached vector, and score exactly as with a vector from the model; another
/// question runs the model again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_question_at_another_budget_skips_the_model() {
    let paragraphs: Vec<String> = (0..SECTIONS).map(paragraph).collect();
    let metrics_address = binary::free_local_address();
    with_metrics(DenseModel::Static, &metrics_address)
        .collection("docs")
        .documents(vec![document_of(&paragraphs)])
        .run(|Served { mut client, .. }| async move {
            create_collection(&mut client, "again").await;
            upsert(&mut client, "again", vec![document_of(&paragraphs)]).await;
            let model_passes = || query_vector_lookups(&metrics_address, "miss");
            let cache_hits = || query_vector_lookups(&metrics_address, "hit");
            assert_eq!((model_passes(), cache_hits()), (0, 0));

            let question = "glacier melt in region 3";
            let first = retrieve(&mut client, retrieve_request("docs", question, 256)).await;
            assert!(!first.cache_hit);
            assert_eq!(
                (model_passes(), cache_hits()),
                (1, 0),
                "the first ask runs the model"
            );
            for (budget, asked) in [(1024, question), (4096, "  glacier melt   in region 3 ")] {
                let answer = retrieve(&mut client, retrieve_request("docs", asked, budget)).await;
                assert!(!answer.cache_hit, "budget {budget} is a new answer");
                assert!(!answer.chunks.is_empty());
            }
            assert_eq!(
                (model_passes(), cache_hits()),
                (1, 2),
                "asked again at other budgets, the question is not embedded again"
            );

            // The cached vector is the model's: the same question in an identical collection, whose
            // answer takes the vector from the cache, scores its chunks exactly as the first answer.
            let other = retrieve(&mut client, retrieve_request("again", question, 256)).await;
            let dense_parts = |response: &proto::RetrieveResponse| -> Vec<f32> {
                response
                    .chunks
                    .iter()
                    .map(|chunk| chunk.score_parts.as_ref().expect("score parts").dense)
                    .collect()
            };
            assert_eq!(dense_parts(&other), dense_parts(&first));
            assert!(dense_parts(&first).iter().any(|&dense| dense != 0.0));
            assert_eq!((model_passes(), cache_hits()), (1, 3));

            retrieve(&mut client, retrieve_request("docs", "bee colonies", 256)).await;
            assert_eq!(
                (model_passes(), cache_hits()),
                (2, 3),
                "another question runs the model"
            );
        })
        .await;
}

/// A `wait` upsert whose deadline passes while its sections are being embedded answers
/// DEADLINE_EXCEEDED and leaves the batch absent or whole, never in part; sent again without the
/// short deadline it succeeds, and sent a third time it costs no inference at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_past_its_deadline_is_whole_or_absent_and_a_retry_succeeds() {
    let metrics_address = binary::free_local_address();
    with_metrics(DenseModel::Minilm, &metrics_address)
        .collection("articles")
        .run(|served| async move {
            // The optimised model MiniLM's sessions load is gone from the data dir once they have.
            assert!(!served
                .data_dir
                .join(lathe::service::OPTIMIZED_MODEL_DIR)
                .exists());
            let mut client = served.client;

            // 8 articles of 10 KB: 80 KB of MiniLM inference, which no CPU does in 200 ms (about
            // 0.02 MB/s on this project's 2-core machines, so 4 s): the deadline passes mid-embedding.
            let articles: Vec<proto::Document> = (0..8)
                .map(|a| {
                    let paragraphs: Vec<String> =
                        (0..100).map(|i| paragraph(a * 1000 + i)).collect();
                    proto::Document {
                        id: format!("article-{a}"),
                        ..document_of(&paragraphs)
                    }
                })
                .collect();
            let expected_sections: u64 = articles.iter().map(|a| a.sections.len() as u64).sum();
            let request = |deadline: Option<std::time::Duration>| {
                let mut request = tonic::Request::new(proto::UpsertDocumentsRequest {
                    collection: "articles".to_string(),
                    documents: articles.clone(),
                    wait: true,
                    write_id: String::new(),
                });
                // The deadline as the header only: tonic's client would also run its own timer and
                // answer CANCELLED "Timeout expired" itself, before the server's answer arrives.
                if let Some(deadline) = deadline {
                    let header = format!("{}m", deadline.as_millis());
                    request
                        .metadata_mut()
                        .insert("grpc-timeout", header.parse().expect("an ASCII header"));
                }
                request
            };
            let cut = client
                .upsert_documents(request(Some(std::time::Duration::from_millis(200))))
                .await
                .expect_err("80 KB of inference within 200 ms");
            assert_eq!(cut.code(), tonic::Code::DeadlineExceeded, "{cut:?}");

            // Whatever was queued before this wait write is committed with it: the batch cut short is
            // visible now if it was applied at all.
            upsert(
                &mut client,
                "articles",
                vec![common::document(
                    "marker",
                    "a marker document",
                    proto::DocumentFormat::Plain,
                )],
            )
            .await;
            let stats = common::collection_stats(&mut client, "articles").await;
            let stored = (stats.documents - 1, stats.sections - 1);
            assert!(
                stored == (0, 0) || stored == (8, expected_sections),
                "the batch cut short is partly stored: {stored:?} of (8, {expected_sections})"
            );

            let written = client
                .upsert_documents(request(None))
                .await
                .expect("the retry succeeds")
                .into_inner();
            assert_eq!(
                (written.documents, u64::from(written.sections)),
                (8, expected_sections)
            );
            let stats = common::collection_stats(&mut client, "articles").await;
            assert_eq!(
                (stats.documents, stats.sections),
                (9, expected_sections + 1)
            );

            // A retry of what is stored (the caller cannot know it was): no inference.
            let before = counted_since(&metrics_address, (0, 0));
            let runs_before = inference_runs(&metrics_address);
            assert!(runs_before > 0, "the model ran for the batches embedded");
            client
                .upsert_documents(request(None))
                .await
                .expect("the second retry succeeds");
            assert_eq!(
                counted_since(&metrics_address, before),
                (0, expected_sections)
            );
            assert_eq!(inference_runs(&metrics_address), runs_before);
        })
        .await;
}

/// `lathe_inference_runs_total`: the model runtime's runs since the server started.
fn inference_runs(metrics_address: &str) -> u64 {
    binary::scrape_metrics(metrics_address)
        .lines()
        .find_map(|line| line.strip_prefix("lathe_inference_runs_total "))
        .map(|value| value.trim().parse().expect("a counter value"))
        .unwrap_or(0)
}
