//! A collection whose folder the server may not read (docs/faults.md row 45): its data is intact,
//! so it is OFFLINE (FAILED_PRECONDITION naming the path and the fix), never DAMAGED with advice
//! to restore it from a backup; the other collections serve, and once access is given back the
//! collection serves again with every document. Runs the real `lathe serve` binary as an
//! ordinary user (`setpriv` to `nobody` when the tests run as root, who reads through any
//! permission), static vectors.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test faults_permissions` runs it against another
//! build (see tests/common/binary.rs).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = LatheClient<Channel>;

const NOBODY: u32 = 65534;

/// Run as `nobody` when root; as this user otherwise (whom a mode of 000 stops too).
fn as_ordinary_user() -> &'static [&'static str] {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]
    } else {
        &[]
    }
}

/// The binary and the models as the server's user can reach them: where they are, or, when
/// that user may not reach them (a clone under root's home), copies in `dir`.
fn reachable(dir: &Path) -> (PathBuf, PathBuf) {
    let (binary, models) = (binary::lathe_binary(), models_dir());
    let wrapper = as_ordinary_user();
    let Some((program, arguments)) = wrapper.split_first() else {
        return (binary, models);
    };
    let reaches = Command::new(program)
        .args(arguments)
        .arg("test")
        .arg("-x")
        .arg(&binary)
        .arg("-a")
        .arg("-r")
        .arg(models.join("minilm/tokenizer.json"))
        .status()
        .expect("run setpriv")
        .success();
    if reaches {
        return (binary, models);
    }
    let staged = dir.join("staged");
    std::fs::create_dir_all(&staged).unwrap();
    let copy = Command::new("cp")
        .arg("-r")
        .arg(&binary)
        .arg(&models)
        .arg(&staged)
        .status()
        .expect("run cp");
    assert!(copy.success());
    chmod_tree(&staged);
    (
        staged.join(binary.file_name().unwrap()),
        staged.join(models.file_name().unwrap()),
    )
}

/// Folders 0755, files readable by all (executables stay executable).
fn chmod_tree(path: &Path) {
    let mode = std::fs::metadata(path).unwrap().permissions().mode();
    chmod(path, if path.is_dir() { 0o755 } else { mode | 0o444 });
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            chmod_tree(&entry.path());
        }
    }
}

async fn start(installed: &(PathBuf, PathBuf), data: &Path) -> (Server, Client) {
    // A stop seals the dense index's live segment, so that its folder holds files to lock.
    let variables = [
        ("LATHE_MODELS__DENSE", "static".to_string()),
        ("LATHE_DENSE__CLOSE_SEAL_MIN_VECTORS", "1".to_string()),
    ];
    let (binary, models) = installed;
    let server = binary::start_from(binary, models, as_ordinary_user(), data, &variables);
    let client = binary::connect(&server.address).await;
    (server, client)
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `path` and everything under it owned by `nobody` (when root), so that the server may write.
fn give_to_nobody(path: &Path) {
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            give_to_nobody(&entry.path());
        }
    }
}

async fn state(client: &mut Client, name: &str) -> proto::CollectionInfo {
    client
        .get_collection(proto::GetCollectionRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

/// The documents of `locked`'s answer to the test's question.
async fn locked_answer(client: &mut Client) -> Vec<String> {
    let reply = retrieve(client, retrieve_request("locked", "granite lantern", 512)).await;
    reply.chunks.iter().map(|c| c.doc_id.clone()).collect()
}

/// `name` is listed OFFLINE, its reason holding `cause` and the fix.
async fn assert_offline(client: &mut Client, name: &str, cause: &str) {
    let info = state(client, name).await;
    assert_eq!(info.state(), proto::CollectionState::Offline, "{info:?}");
    assert!(
        info.reason.contains(cause) && info.reason.contains("chown or chmod"),
        "{info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_the_server_may_not_read_is_offline_with_the_fix_and_serves_once_it_may() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    give_to_nobody(&data);
    let installed = reachable(dir.path());

    let (server, mut client) = start(&installed, &data).await;
    for name in ["locked", "open"] {
        create_collection(&mut client, name).await;
        upsert(&mut client, name, (0..12).map(sectioned_document).collect()).await;
    }
    let locked_before = locked_answer(&mut client).await;
    assert!(!locked_before.is_empty());
    binary::stop(server);

    // The operator's copy left the index folder unreadable to the server's user.
    let index = data.join("collections/locked/index");
    chmod(&index, 0o000);
    let (server, mut client) = start(&installed, &data).await;
    assert_offline(&mut client, "locked", "ermission denied").await;
    let refused = client
        .retrieve(retrieve_request("locked", "granite lantern", 512))
        .await;
    let status = expect_code(
        refused,
        Code::FailedPrecondition,
        &[
            "locked",
            "offline",
            "collections/locked/index",
            "chown or chmod",
        ],
    );
    assert!(!status.message().contains("backup"), "{status:?}");
    assert_eq!(
        state(&mut client, "open").await.state(),
        proto::CollectionState::Ready
    );
    retrieve(
        &mut client,
        retrieve_request("open", "granite lantern", 512),
    )
    .await;
    binary::stop(server);

    // Access given back: the collection serves as before, nothing was lost.
    chmod(&index, 0o755);
    let (server, mut client) = start(&installed, &data).await;
    assert_eq!(
        state(&mut client, "locked").await.state(),
        proto::CollectionState::Ready
    );
    let locked_after = locked_answer(&mut client).await;
    assert_eq!(locked_after, locked_before);
    binary::stop(server);

    // The same for the dense index's folder alone: its vectors are not dropped and rebuilt, and
    // nothing in it is removed; the collection is offline until the server may read it.
    let dense = data.join("collections/locked/dense");
    let files_before = std::fs::read_dir(&dense).unwrap().count();
    assert!(
        files_before > 0,
        "the stop sealed the dense index into files"
    );
    chmod(&dense, 0o000);
    let (server, mut client) = start(&installed, &data).await;
    assert_offline(&mut client, "locked", "collections/locked/dense").await;
    binary::stop(server);
    chmod(&dense, 0o755);
    assert_eq!(std::fs::read_dir(&dense).unwrap().count(), files_before);
    let (server, mut client) = start(&installed, &data).await;
    let locked_after = locked_answer(&mut client).await;
    assert_eq!(locked_after, locked_before);
    binary::stop(server);
}
