//! The neural stage through the real server: dense retrieval finds a paraphrase that shares no
//! content word with its section, a deleted document never comes back, and vectors survive restart.

mod common;

use common::*;
use lathe::api::proto;
use lathe::api::proto::DocumentFormat as Format;

const DOCUMENTS: [(&str, &str); 5] = [
    (
        "install",
        "To install the program, run the installer and follow the wizard until it finishes.",
    ),
    (
        "weather",
        "The forecast says the afternoon will bring heavy rain and strong wind along the coast.",
    ),
    (
        "cooking",
        "Simmer the tomatoes with garlic and basil for twenty minutes before adding the pasta.",
    ),
    (
        "finance",
        "The quarterly revenue grew twelve percent while the operating costs stayed flat.",
    ),
    (
        "sports",
        "The striker scored twice in the second half and the team won the final.",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_retrieval_finds_paraphrases_forgets_deletes_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut client = server.client.clone();
    create_collection(&mut client, "c").await;
    let documents = DOCUMENTS
        .iter()
        .map(|(id, text)| document(id, text, Format::Plain))
        .collect();
    upsert(&mut client, "c", documents).await;

    // Only "the" is shared with every section: lexical scores cannot tell them apart.
    let question = "how do I set up the software on my computer";
    let response = retrieve(&mut client, retrieve_request("c", question, 40)).await;
    assert_eq!(response.chunks[0].doc_id, "install", "{response:?}");
    let dense = response.chunks[0].score_parts.unwrap().dense;
    assert!(dense > 0.3, "pooled cosine {dense}");
    assert!(response.timings.iter().any(|t| t.stage == "embed"));

    // The semantic strategy cuts on stored sentence vectors, with the breakpoint rule asked for.
    let long = "Volcanoes erupt when magma rises. Lava flows down the slopes. Ash clouds cover the sky. \
                The stock market fell sharply today. Investors sold bank shares. Bond yields rose again.";
    upsert(
        &mut client,
        "c",
        vec![document("mixed", long, Format::Plain)],
    )
    .await;
    let mut request = retrieve_request("c", "magma lava ash volcano", 200);
    request.filter = Some(proto::Filter {
        metadata: vec![],
        doc_ids: vec!["mixed".into()],
    });
    request.chunking = Some(proto::ChunkingOptions {
        strategy: proto::ChunkStrategy::Semantic as i32,
        max_tokens: Some(64),
        semantic_threshold: proto::SemanticThreshold::StdDev as i32,
        semantic_amount: Some(0.5),
        ..Default::default()
    });
    let response = retrieve(&mut client, request).await;
    assert!(!response.chunks.is_empty());
    assert!(
        response
            .chunks
            .iter()
            .all(|c| c.strategy == proto::ChunkStrategy::Semantic as i32),
        "{response:?}"
    );
    assert!(response.chunks[0].text.contains("magma"), "{response:?}");

    client
        .delete_documents(proto::DeleteDocumentsRequest {
            collection: "c".into(),
            ids: vec!["install".into()],
            wait: true,
            write_id: String::new(),
        })
        .await
        .unwrap();
    let response = retrieve(&mut client, retrieve_request("c", question, 400)).await;
    assert!(
        response.chunks.iter().all(|c| c.doc_id != "install"),
        "a deleted document came back: {response:?}"
    );
    // The delete left a tombstone in the dense index, not a vector a query could still reach.
    let stats = collection_stats(&mut client, "c").await;
    let dense = stats.dense.expect("dense stats");
    assert!(stats.sections > 0);
    assert_eq!(
        (dense.vectors, dense.sections_with_vector),
        (stats.sections, stats.sections),
        "{stats:?}"
    );
    server.stop().await;

    // After a restart the dense index is rebuilt from the vectors stored with the sections.
    let server = TestServer::start(dir.path()).await;
    let mut client = server.client.clone();
    let response = retrieve(
        &mut client,
        retrieve_request("c", "will it be stormy by the sea later today", 40),
    )
    .await;
    assert_eq!(response.chunks[0].doc_id, "weather", "{response:?}");
    assert!(response.chunks[0].score_parts.unwrap().dense > 0.3);
    let response = retrieve(&mut client, retrieve_request("c", question, 400)).await;
    assert!(response.chunks.iter().all(|c| c.doc_id != "install"));
    server.stop().await;
}
