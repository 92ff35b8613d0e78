//! A memory-mapped index file cut short under a running server (docs/faults.md row 43): the
//! next query that reads past the file's new end raises SIGBUS, which no read can survive. The
//! process must say why in its last log line (the file and its collection) before it dies by
//! SIGBUS, and the restarted server must list that collection DAMAGED, naming the file, while
//! every other collection serves as before. Runs the real `lathe serve` binary, static vectors.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test faults_mapped` runs it against another build
//! (see tests/common/binary.rs): before the SIGBUS handler, the process died without a word.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

type Client = LatheClient<Channel>;

/// No core file from the SIGBUS (the default action dumps one where the limit allows).
const NO_CORE: &[&str] = &["prlimit", "--core=0", "--"];

async fn start(data: &Path) -> (Server, Client) {
    let variables = [("LATHE_MODELS__DENSE", "static".to_string())];
    let server = binary::start_wrapped(NO_CORE, data, &variables);
    let client = binary::connect(&server.address).await;
    (server, client)
}

const QUERIES: &[&str] = &["granite lantern", "harbor meadow cipher"];

fn file_name_of(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

/// Every line the server wrote after what the test already read, up to its exit.
fn remaining_lines(log: &mpsc::Receiver<String>) -> Vec<String> {
    let mut lines = Vec::new();
    while let Ok(line) = log.recv_timeout(Duration::from_secs(10)) {
        lines.push(line);
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_file_cut_under_the_server_is_named_as_it_dies_and_only_its_collection_is_damaged()
{
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut server, mut client) = start(&data).await;
    for name in ["cut", "kept"] {
        create_collection(&mut client, name).await;
        upsert(&mut client, name, (0..40).map(sectioned_document).collect()).await;
    }
    let kept_before = answers(&mut client, "kept", QUERIES).await;

    // The postings file of the collection's segment, cut to nothing as a `cp` over it starts.
    let postings = largest_with_extension(&data.join("collections/cut/index"), "idx");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&postings)
        .unwrap()
        .set_len(0)
        .unwrap();
    let reply = client
        .retrieve(retrieve_request("cut", "walnut zephyr beacon", 512))
        .await;
    assert!(
        reply.is_err(),
        "the query read the cut file and answered: {reply:?}"
    );
    let status = binary::wait_for_exit(&mut server.child, Duration::from_secs(30));
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status}");

    let lines = remaining_lines(&server.log);
    let last = lines.last().map(String::as_str).unwrap_or_default();
    eprintln!("the last log line: {last}");
    let line: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last log line is not JSON ({e}): {last:?}"));
    assert_eq!(line["level"], "ERROR", "{last}");
    assert_eq!(line["fields"]["file"], postings.to_str().unwrap(), "{last}");
    assert_eq!(line["fields"]["collection"], "cut", "{last}");
    assert!(
        line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("SIGBUS") && m.contains("DAMAGED")),
        "{last}"
    );

    // The restart opens every collection: the cut one DAMAGED naming its file, the other as before.
    let (restarted, mut client) = start(&data).await;
    let named = restarted
        .startup_log
        .iter()
        .find(|line| line.contains("\"ERROR\"") && line.contains(file_name_of(&postings)))
        .unwrap_or_else(|| panic!("no ERROR naming the file at the restart"));
    eprintln!("at the restart: {named}");
    let cut = client
        .get_collection(proto::GetCollectionRequest { name: "cut".into() })
        .await
        .unwrap()
        .into_inner();
    eprintln!(
        "after the restart: {} {}",
        cut.state().as_str_name(),
        cut.reason
    );
    assert_eq!(cut.state(), proto::CollectionState::Damaged, "{cut:?}");
    assert!(cut.reason.contains(file_name_of(&postings)), "{cut:?}");
    let kept = client
        .get_collection(proto::GetCollectionRequest {
            name: "kept".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.state(), proto::CollectionState::Ready, "{kept:?}");
    assert_eq!(answers(&mut client, "kept", QUERIES).await, kept_before);
    binary::stop(restarted);
}
