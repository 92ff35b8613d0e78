//! Replicas of the write log for the replication tests: a `lathe serve` process on a data dir
//! following a real `nats-server`, its health, its log, and the documents the tests write.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::binary;
use super::nats::Nats;

/// One `lathe serve` replica of the log at `nats`.
pub struct Replica {
    pub server: binary::Server,
    pub client: LatheClient<Channel>,
}

impl Replica {
    /// Starts a replica on `data_dir` and waits until it serves its gRPC port (not until it is
    /// ready: see [`Replica::until_ready`]).
    pub async fn start(data_dir: &Path, nats: &Nats) -> Self {
        let server = binary::start(data_dir, &replica_variables(&nats.url()));
        let client = binary::connect(&server.address).await;
        Self { server, client }
    }

    /// [`Replica::start`] with more `variables` (later ones win).
    pub async fn start_with(
        data_dir: &Path,
        nats: &Nats,
        variables: &[(&'static str, String)],
    ) -> Self {
        let mut all = replica_variables(&nats.url());
        all.extend_from_slice(variables);
        let server = binary::start(data_dir, &all);
        let client = binary::connect(&server.address).await;
        Self { server, client }
    }

    pub async fn start_ready(data_dir: &Path, nats: &Nats) -> Self {
        let replica = Self::start(data_dir, nats).await;
        replica.until_ready(Duration::from_secs(120)).await;
        replica
    }

    pub async fn health(&self) -> ServingStatus {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.server.address))
                .unwrap()
                .connect()
                .await
                .expect("connect for health");
        let status = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "lathe.v1.Lathe".into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        ServingStatus::try_from(status).expect("a serving status")
    }

    /// Waits until the replica reports SERVING (it has caught up with the log).
    pub async fn until_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.health().await != ServingStatus::Serving {
            assert!(
                Instant::now() < deadline,
                "replica not ready within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn kill(&mut self) {
        let _ = self.server.child.kill();
        let _ = self.server.child.wait();
    }

    /// The first line holding `needle` the replica logged, while starting or after (within 30 s).
    pub fn log_line(&self, needle: &str) -> String {
        let logged_at_start = self
            .server
            .startup_log
            .iter()
            .find(|line| line.contains(needle))
            .cloned();
        logged_at_start.unwrap_or_else(|| {
            binary::wait_for_line(&self.server.log, needle, Duration::from_secs(30))
        })
    }

    /// The first log position the replica's apply loop asked the log for.
    pub fn followed_from(&self) -> u64 {
        let line = self.log_line("reading the write log from its position");
        let from = line
            .split("\"from\":")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse().ok());
        from.unwrap_or_else(|| panic!("no position in {line}"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn replica_variables(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LATHE_REPLICATION__NATS_URL", url.to_string()),
        ("LATHE_REPLICATION__PUBLISH_TIMEOUT_MS", "2000".into()),
        ("LATHE_MODELS__DENSE", "static".into()),
        ("LATHE_STORAGE__COMMIT_INTERVAL_MS", "200".into()),
    ]
}

/// A document of `words` pseudo-random words (seeded by `doc`) from a vocabulary of 144, in
/// sentences of 6 to 13 words: no two documents or sections alike, so that no ranking rests on
/// exact ties.
pub fn text_of(doc: usize, words: usize) -> String {
    const ONSETS: [&str; 12] = [
        "lat", "spin", "chu", "tail", "car", "gear", "cool", "bear", "col", "tur", "fe", "thre",
    ];
    const CODAS: [&str; 12] = [
        "he", "dle", "ck", "stock", "riage", "box", "ant", "ing", "let", "ret", "ed", "ad",
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (doc as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut text = format!(
        "Document {doc} is about the {}{}. ",
        ONSETS[doc % 12],
        CODAS[doc / 12 % 12]
    );
    let mut sentence = 0;
    for _ in 0..words {
        let word = next();
        text.push_str(ONSETS[(word % 12) as usize]);
        text.push_str(CODAS[(word / 12 % 12) as usize]);
        sentence += 1;
        if sentence >= 6 + (word / 144 % 8) as usize {
            text.push_str(". ");
            sentence = 0;
        } else {
            text.push(' ');
        }
    }
    text
}

pub fn documents(ids: std::ops::Range<usize>, words: usize) -> Vec<proto::Document> {
    ids.map(|doc| {
        super::document(
            &format!("doc{doc}"),
            &text_of(doc, words),
            proto::DocumentFormat::Plain,
        )
    })
    .collect()
}

pub async fn create(client: &mut LatheClient<Channel>, name: &str) {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.into(),
            settings: None,
        })
        .await
        .expect("create collection");
}

pub async fn write(
    client: &mut LatheClient<Channel>,
    collection: &str,
    documents: Vec<proto::Document>,
) -> u64 {
    let reply = client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: collection.into(),
            documents,
            wait: false,
            write_id: String::new(),
        })
        .await
        .expect("upsert")
        .into_inner();
    assert!(
        reply.consistency_token > 0,
        "a replicated write has a token"
    );
    reply.consistency_token
}

/// Deletes documents `ids` without `wait`; the delete's token (a replica publishes a delete
/// directly: its log position).
pub async fn delete(client: &mut LatheClient<Channel>, collection: &str, ids: &[&str]) -> u64 {
    client
        .delete_documents(proto::DeleteDocumentsRequest {
            collection: collection.into(),
            ids: ids.iter().map(|id| id.to_string()).collect(),
            wait: false,
            write_id: String::new(),
        })
        .await
        .expect("delete")
        .into_inner()
        .consistency_token
}

/// A Retrieve of `query` read at `token`.
pub fn read_at(collection: &str, query: &str, token: u64) -> proto::RetrieveRequest {
    proto::RetrieveRequest {
        consistency_token: token,
        ..super::retrieve_request(collection, query, 512)
    }
}

/// The documents a Retrieve restricted to `ids` returns, read at `token`.
pub async fn present(
    client: &mut LatheClient<Channel>,
    collection: &str,
    ids: &[String],
    token: u64,
) -> BTreeSet<String> {
    let mut request = read_at(collection, "document", token);
    request.token_budget = 32_768;
    request.top_k = Some(100);
    request.filter = Some(proto::Filter {
        metadata: Vec::new(),
        doc_ids: ids.to_vec(),
    });
    let reply = client
        .retrieve(request)
        .await
        .expect("retrieve")
        .into_inner();
    reply.chunks.into_iter().map(|chunk| chunk.doc_id).collect()
}

/// A write to `client` is refused FAILED_PRECONDITION naming `cause` and the way out.
pub async fn assert_write_refused(client: &mut LatheClient<Channel>, cause: &str) {
    let status = client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: "c".into(),
            documents: documents(900..901, 20),
            wait: false,
            write_id: String::new(),
        })
        .await
        .expect_err("a write to a replica whose log is lost");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains(cause) && status.message().contains("nothing was stored"),
        "{status:?}"
    );
}

/// Runs `lathe replicas ARGS --addr ADDRESS`; its exit status and output.
pub async fn replicas_command(address: &str, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_lathe"));
    command
        .arg("replicas")
        .args(args)
        .args(["--addr", address, "--wait-seconds", "120"]);
    let output = tokio::task::spawn_blocking(move || command.output().expect("run lathe replicas"))
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Waits until `replica` says its log is lost (an ERROR, NOT_SERVING).
pub async fn until_lost(replica: &Replica) {
    let line = replica.log_line("is lost");
    assert!(line.contains("ERROR"), "{line}");
    assert_eq!(replica.health().await, ServingStatus::NotServing);
}
