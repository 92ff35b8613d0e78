//! The scrub finds files changed on disk under a running server (the real `lathe serve` binary,
//! static vectors, small dense segments, a scrub every second; docs/faults.md rows 41 and 42):
//! - a byte flipped in a tantivy file of a collection that already verified it at open: within
//!   seconds one ERROR names the file, the collection is DAMAGED (what verifies is still served)
//!   and `lathe_scrub_findings_total` counts it;
//! - a byte flipped in a dense segment's data file: the segment is dropped and its vectors
//!   inserted again from the stored sections, the collection stays READY and answers as before.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test faults_scrub` runs them against another
//! build (see tests/common/binary.rs).

mod common;

use std::path::Path;
use std::time::Duration;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

type Client = LatheClient<Channel>;

async fn start(data_dir: &Path) -> (Server, Client) {
    let server = binary::start(
        data_dir,
        &[
            ("LATHE_MODELS__DENSE", "static".to_string()),
            ("LATHE_DENSE__SEAL_VECTORS", "40".to_string()),
            ("LATHE_STORAGE__SCRUB_INTERVAL_S", "1".to_string()),
        ],
    );
    let client = binary::connect(&server.address).await;
    (server, client)
}

async fn fill(client: &mut Client, collection: &str) {
    create_collection(client, collection).await;
    upsert(
        client,
        collection,
        (0..62).map(sectioned_document).collect(),
    )
    .await;
}

fn flip_middle_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    // In place: the server's mapping of the file sees the change, as after a bad disk write.
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(middle as u64)).unwrap();
    file.write_all(&bytes[middle..=middle]).unwrap();
    file.sync_all().unwrap();
}

const QUERIES: &[&str] = &[
    "granite lantern",
    "harbor meadow cipher",
    "walnut zephyr beacon",
];

fn scrub_findings(server: &Server) -> f64 {
    binary::scrape_metrics(&server.metrics_address)
        .lines()
        .find_map(|line| {
            line.strip_prefix("lathe_scrub_findings_total ")?
                .parse()
                .ok()
        })
        .expect("lathe_scrub_findings_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tantivy_file_changed_under_a_running_server_is_found_by_the_scrub() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, mut client) = start(&data).await;
    fill(&mut client, "t").await;
    // Every file was verified as it was opened; the change comes after.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let store = largest_with_extension(&data.join("collections/t/index"), "store");
    flip_middle_byte(&store);
    let line = binary::wait_for_line(&server.log, "found by the scrub", Duration::from_secs(20));
    assert!(
        line.contains("ERROR")
            && line.contains(&store.file_name().unwrap().to_string_lossy().to_string()),
        "{line}"
    );
    let info = client
        .get_collection(proto::GetCollectionRequest { name: "t".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), proto::CollectionState::Damaged, "{info:?}");
    assert!(info.reason.contains("found by the scrub"), "{info:?}");
    // Counted once the pass over the collection ends.
    binary::wait_for_line(&server.log, "scrub pass done", Duration::from_secs(20));
    assert!(scrub_findings(&server) >= 1.0);
    binary::stop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dense_segment_changed_under_a_running_server_is_rebuilt_from_the_stored_sections() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, mut client) = start(&data).await;
    fill(&mut client, "d").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = answers(&mut client, "d", QUERIES).await;
    let dense = data.join("collections/d/dense");
    let segment = largest_with_extension(&dense, "flat");
    flip_middle_byte(&segment);
    let line = binary::wait_for_line(
        &server.log,
        "the scrub found a dense segment changed on disk",
        Duration::from_secs(20),
    );
    assert!(line.contains("ERROR"), "{line}");
    // Dropped, its vectors inserted again: the file is gone, the collection serves as before.
    binary::wait_for_line(&server.log, "scrub pass done", Duration::from_secs(20));
    assert!(!segment.exists(), "{segment:?} is still there");
    let info = client
        .get_collection(proto::GetCollectionRequest { name: "d".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), proto::CollectionState::Ready, "{info:?}");
    assert_eq!(answers(&mut client, "d", QUERIES).await, before);
    assert!(scrub_findings(&server) >= 1.0);
    binary::stop(server);
}
