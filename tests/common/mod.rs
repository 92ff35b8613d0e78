//! A real Lathe server on a port-0 loopback listener, a tonic client for it, and the helpers the
//! integration tests share.
#![allow(dead_code)]

pub mod binary;
pub mod nats;
pub mod replica;
pub mod tls;
pub mod tmpfs;

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
    /// The HTTP/JSON API's address, when `server.http_listen` is set (any non-empty value: the
    /// in-process server binds a loopback port of its own).
    pub http_address: Option<std::net::SocketAddr>,
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
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
            .expect("the server's address")
            .connect()
            .await
            .expect("connect to the test server");
        let client = LatheClient::new(channel)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        Self {
            address: server.address(),
            http_address: server.http_address(),
            client,
            server,
        }
    }

    /// Graceful stop: drain, commit, close.
    pub async fn stop(self) {
        self.server.stop().await.expect("the server stops cleanly");
    }
}

/// One test against a fresh server: the scaffold every in-process server test shares.
///
/// ```ignore
/// Fixture::lexical()
///     .config(|config| config.limits.max_document_bytes = 1024)
///     .collection("c")
///     .documents(vec![document("d", "Lathes turn wood.", Format::Plain)])
///     .run(|Served { mut client, .. }| async move {
///         still_serving(&mut client, "c", "lathes", "d").await;
///     })
///     .await;
/// ```
///
/// `run` owns the test's time limit ([`TEST_LIMIT`]), the temporary directory (the data dir is its
/// `data`), the server (started with the test configuration as adjusted, stopped cleanly once the
/// body returns), the collection (created with its settings, if one is named) and the documents
/// (upserted into it with `wait`, if any are given).
pub struct Fixture {
    dir: tempfile::TempDir,
    config: Config,
    collection: Option<(String, Option<proto::CollectionSettings>)>,
    documents: Vec<proto::Document>,
}

/// What a [`Fixture`]'s body works with.
pub struct Served {
    /// A client connected to the server.
    pub client: LatheClient<Channel>,
    pub address: std::net::SocketAddr,
    /// The HTTP/JSON API's address, when the configuration sets `server.http_listen`.
    pub http_address: Option<std::net::SocketAddr>,
    /// The temporary directory, free for the test's own files; the data dir is inside it.
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    /// The answer to the upsert of the fixture's documents; `None` when none were given.
    pub written: Option<proto::WriteResponse>,
}

impl Served {
    pub fn channel_uri(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// The test configuration ([`test_config`]), the neural stage on.
    pub fn new() -> Self {
        Self::with(test_config)
    }

    /// The test configuration with the neural stage off ([`lexical_config`]).
    pub fn lexical() -> Self {
        Self::with(lexical_config)
    }

    fn with(config: fn(&Path) -> Config) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = config(&dir.path().join("data"));
        Self {
            dir,
            config,
            collection: None,
            documents: Vec::new(),
        }
    }

    /// Adjusts the server's configuration.
    pub fn config(mut self, adjust: impl FnOnce(&mut Config)) -> Self {
        adjust(&mut self.config);
        self
    }

    /// A collection of default settings, created before the body runs.
    pub fn collection(mut self, name: &str) -> Self {
        self.collection = Some((name.to_string(), None));
        self
    }

    /// The collection's settings.
    pub fn settings(mut self, settings: proto::CollectionSettings) -> Self {
        let (_, slot) = self
            .collection
            .as_mut()
            .expect("settings of a named collection");
        *slot = Some(settings);
        self
    }

    /// Documents upserted (with `wait`) into the collection before the body runs.
    pub fn documents(mut self, documents: Vec<proto::Document>) -> Self {
        self.documents = documents;
        self
    }

    /// Starts the server, sets up the collection and its documents, runs `body` and stops the
    /// server; a test past its limit fails.
    pub async fn run<F, Fut>(self, body: F)
    where
        F: FnOnce(Served) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let Self {
            dir,
            config,
            collection,
            documents,
        } = self;
        let data_dir = config.storage.data_dir.clone();
        tokio::time::timeout(TEST_LIMIT, async {
            let server = TestServer::start_with(config).await;
            let mut client = server.client.clone();
            let mut written = None;
            if let Some((name, settings)) = collection {
                create_collection_with(&mut client, &name, settings).await;
                if !documents.is_empty() {
                    written = Some(upsert(&mut client, &name, documents).await);
                }
            } else {
                assert!(documents.is_empty(), "documents need a collection");
            }
            body(Served {
                client,
                address: server.address,
                http_address: server.http_address,
                dir: dir.path().to_path_buf(),
                data_dir,
                written,
            })
            .await;
            server.stop().await;
        })
        .await
        .expect("the test ends within TEST_LIMIT");
    }
}

pub async fn create_collection(client: &mut LatheClient<Channel>, name: &str) {
    create_collection_with(client, name, None).await;
}

pub async fn create_collection_with(
    client: &mut LatheClient<Channel>,
    name: &str,
    settings: Option<proto::CollectionSettings>,
) {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.to_string(),
            settings,
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
            write_id: String::new(),
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

/// Waits until every write queued for `collection` so far has been applied (or failed): its
/// newest operation has ended, and the queue applies a collection's writes in order. After a
/// restart, what was queued before it is applied in the background; this settles it.
pub async fn drain_queue(client: &mut LatheClient<Channel>, collection: &str) {
    let newest = client
        .list_operations(proto::ListOperationsRequest {
            collection: collection.to_string(),
            limit: 1,
        })
        .await
        .expect("list operations")
        .into_inner()
        .operations;
    let Some(newest) = newest.first() else {
        return;
    };
    loop {
        let operation = client
            .wait_operation(proto::WaitOperationRequest {
                id: newest.id,
                timeout_ms: Some(10_000),
            })
            .await
            .expect("wait operation")
            .into_inner();
        let state = proto::OperationState::try_from(operation.state).unwrap();
        if matches!(
            state,
            proto::OperationState::Applied | proto::OperationState::Failed
        ) {
            return;
        }
    }
}

/// Words enough that each paragraph of [`sectioned_document`] is a section with a vector of
/// its own.
const SECTION_WORDS: [&str; 16] = [
    "river", "granite", "lantern", "orchard", "voltage", "harbor", "meadow", "cipher", "falcon",
    "quarry", "saddle", "thimble", "walnut", "zephyr", "beacon", "copper",
];

/// Document `doc{i}`: five paragraphs, five sections, each with words of its own.
pub fn sectioned_document(i: usize) -> proto::Document {
    let paragraphs: Vec<String> = (0..5)
        .map(|p| {
            let words: Vec<&str> = (0..12)
                .map(|w| SECTION_WORDS[(i * 7 + p * 5 + w) % 16])
                .collect();
            format!("Paragraph {p} of document {i}: {}.", words.join(" "))
        })
        .collect();
    document(
        &format!("doc{i}"),
        &paragraphs.join("\n\n"),
        proto::DocumentFormat::Plain,
    )
}

/// The largest file of `dir` named `*.extension` (a collection's main segment file of a kind).
pub fn largest_with_extension(dir: &Path, extension: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .max_by_key(|path| std::fs::metadata(path).map_or(0, |m| m.len()))
        .unwrap_or_else(|| panic!("no .{extension} file in {}", dir.display()))
}

/// The chunks (document, byte range) each of `queries` gets from `collection` at budget 512:
/// what "answers as before" compares.
pub async fn answers(
    client: &mut LatheClient<Channel>,
    collection: &str,
    queries: &[&str],
) -> Vec<Vec<(String, Option<proto::Span>)>> {
    let mut all = Vec::new();
    for query in queries {
        let reply = retrieve(client, retrieve_request(collection, query, 512)).await;
        all.push(
            reply
                .chunks
                .iter()
                .map(|chunk| (chunk.doc_id.clone(), chunk.bytes))
                .collect(),
        );
    }
    all
}
