//! A real Lathe server on a port-0 loopback listener, and a tonic client for it.
#![allow(dead_code)]

pub mod binary;

use std::path::{Path, PathBuf};

use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::config::Config;
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub struct TestServer {
    pub address: std::net::SocketAddr,
    pub client: LatheClient<Channel>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<lathe::error::Result<()>>>,
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

    pub async fn start_with(config: Config) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        let address = listener.local_addr().unwrap();
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(lathe::api::serve(config, listener, async move {
            let _ = shutdown_rx.await;
        }));
        let channel = loop {
            match Channel::from_shared(format!("http://{address}"))
                .unwrap()
                .connect()
                .await
            {
                Ok(channel) => break channel,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        // The engine opens before the listener is served: wait until the service answers.
        let mut client = LatheClient::new(channel)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        for _ in 0..500 {
            if client
                .list_collections(proto::ListCollectionsRequest {})
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Self {
            address,
            client,
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    pub fn channel_uri(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Graceful stop: drain, commit, close.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
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
