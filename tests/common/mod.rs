//! A real Lathe server on a port-0 loopback listener, a tonic client for it, and the helpers the
//! integration tests share.
#![allow(dead_code)]

pub mod binary;
pub mod nats;
pub mod serving_line;

use std::path::{Path, PathBuf};
use std::time::Duration;

use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::InProcessServer;
use lathe::config::Config;
use tonic::transport::Channel;
use tonic::Code;

/// The library's in-process server with a connected client that sends and accepts messages up
/// to 256 MiB (tests probe the server's own limits, not the client's).
pub struct TestServer {
    pub address: std::net::SocketAddr,
    pub client: LatheClient<Channel>,
    server: InProcessServer,
}

pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models")
}

pub fn test_config(data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.storage.data_dir = data_dir.to_path_buf();
    config.models.dir = models_dir();
    config.storage.writer_memory_bytes = 15 << 20;
    config.server.cpu_threads = 2;
    // Embedding whole articles in a debug build on a busy CI machine can take longer than the
    // production deadline; tests of deadlines set their own.
    config.server.request_timeout_ms = 300_000;
    config
}

impl TestServer {
    pub async fn start(data_dir: &Path) -> Self {
        Self::start_with(test_config(data_dir)).await
    }

    /// Starts the server with `config` and waits until it answers a plaintext, key-less call.
    pub async fn start_with(config: Config) -> Self {
        let server = InProcessServer::start(config)
            .await
            .expect("the test server starts and serves");
        let client = lathe_tools::client::connect_with_message_limit(&server.addr(), 256 << 20)
            .await
            .expect("connect to the test server");
        Self {
            address: server.address(),
            client,
            server,
        }
    }

    pub fn channel_uri(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Graceful stop: drain, commit, close.
    pub async fn stop(self) {
        self.server.stop().await.expect("the server stops cleanly");
    }
}

pub async fn create_collection(client: &mut LatheClient<Channel>, name: &str) {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.to_string(),
            settings: None,
        })
        .await
        .expect("create collection");
}

pub async fn collection_stats(
    client: &mut LatheClient<Channel>,
    name: &str,
) -> proto::CollectionStats {
    client
        .get_collection(proto::GetCollectionRequest {
            name: name.to_string(),
        })
        .await
        .expect("get collection")
        .into_inner()
        .stats
        .expect("stats")
}

pub fn document(id: &str, text: &str, format: proto::DocumentFormat) -> proto::Document {
    proto::Document {
        id: id.to_string(),
        title: id.to_string(),
        text: text.to_string(),
        format: format as i32,
        ..Default::default()
    }
}

pub async fn upsert(
    client: &mut LatheClient<Channel>,
    collection: &str,
    documents: Vec<proto::Document>,
) -> proto::WriteResponse {
    client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: collection.to_string(),
            documents,
            wait: true,
        })
        .await
        .expect("upsert")
        .into_inner()
}

pub fn retrieve_request(collection: &str, query: &str, budget: u32) -> proto::RetrieveRequest {
    proto::RetrieveRequest {
        collection: collection.to_string(),
        query: query.to_string(),
        token_budget: budget,
        ..Default::default()
    }
}

pub async fn retrieve(
    client: &mut LatheClient<Channel>,
    request: proto::RetrieveRequest,
) -> proto::RetrieveResponse {
    client
        .retrieve(request)
        .await
        .expect("retrieve")
        .into_inner()
}

/// The document text between code points `start..end`.
pub fn char_slice(text: &str, start: u64, end: u64) -> String {
    text.chars()
        .skip(start as usize)
        .take((end - start) as usize)
        .collect()
}

/// The default budget tokenizer (MiniLM), loaded once, independent of the server.
fn minilm_tokenizer() -> &'static tokenizers::Tokenizer {
    use std::sync::OnceLock;
    static TOKENIZER: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let mut t = tokenizers::Tokenizer::from_file(models_dir().join("minilm/tokenizer.json"))
            .expect("run scripts/fetch-models.sh");
        t.with_padding(None);
        t.with_truncation(None).unwrap();
        t
    })
}

/// Token count in the default budget tokenizer, independent of the server.
pub fn minilm_count(text: &str) -> usize {
    minilm_tokenizer().encode(text, false).unwrap().len()
}

/// Byte spans of the tokens of `text` in the default budget tokenizer.
pub fn minilm_token_spans(text: &str) -> Vec<(usize, usize)> {
    minilm_tokenizer()
        .encode(text, false)
        .unwrap()
        .get_offsets()
        .to_vec()
}

/// Every test is bounded: a hang fails the test instead of stalling the suite.
pub const TEST_LIMIT: Duration = Duration::from_secs(90);

/// The call must fail with `code` and a message holding every one of `needles`; returns the status.
pub fn expect_code<T: std::fmt::Debug>(
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
pub async fn still_serving(
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

/// The test configuration with the neural stage off: for tests about parsing, limits and the
/// edge, not about the neural stage, lexical only keeps them cheap.
pub fn lexical_config(dir: &Path) -> Config {
    let mut config = test_config(dir);
    config.models.dense = lathe::config::DenseModel::Off;
    config
}

/// Retries `call` until it succeeds (the engine opens before the listener is served).
pub async fn until_ready<F, Fut, T, E: std::fmt::Debug>(mut call: F) -> T
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
