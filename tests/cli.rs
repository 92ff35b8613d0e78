//! `lathe collections` and `lathe alias` as an operator runs them: the real binary as a process
//! against a real `lathe serve` (lexical mode). What each prints, what the server holds after
//! (read over gRPC), and a refusal exiting non-zero with the gRPC code on stderr.

mod common;

use std::process::{Command, Output};

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

/// Runs `lathe ARGS... --addr ADDRESS` to its end.
fn lathe(address: &str, args: &[&str]) -> Output {
    Command::new(binary::lathe_binary())
        .args(args)
        .args(["--addr", address])
        .output()
        .expect("run lathe")
}

/// The lines a successful `lathe ARGS...` printed on stdout.
fn printed(address: &str, args: &[&str]) -> Vec<String> {
    let output = lathe(address, args);
    assert!(
        output.status.success(),
        "lathe {args:?} exited with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8 output")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The stderr of a `lathe ARGS...` that must fail.
fn refused(address: &str, args: &[&str]) -> String {
    let output = lathe(address, args);
    assert!(
        !output.status.success(),
        "lathe {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn server_aliases(client: &mut LatheClient<Channel>) -> Vec<(String, String)> {
    let listed = client
        .list_aliases(proto::ListAliasesRequest {})
        .await
        .expect("list aliases")
        .into_inner()
        .aliases;
    listed
        .into_iter()
        .map(|a| (a.alias, a.collection))
        .collect()
}

async fn server_collections(client: &mut LatheClient<Channel>) -> Vec<String> {
    let listed = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list collections")
        .into_inner()
        .collections;
    listed.into_iter().map(|c| c.name).collect()
}

fn pair(alias: &str, collection: &str) -> (String, String) {
    (alias.to_string(), collection.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_and_aliases_are_managed_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let process = binary::start(dir.path(), &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let address = process.address.clone();
    let mut client = binary::connect(&address).await;

    let created = printed(
        &address,
        &[
            "collections",
            "create",
            "docs-v1",
            "--section-tokens",
            "128",
        ],
    );
    assert_eq!(
        created,
        ["docs-v1  ready  documents 0  sections 0  aliases -"]
    );
    printed(&address, &["collections", "create", "docs-v2"]);
    let documents = ["kettle", "lighthouse"].map(|id| {
        document(
            id,
            &format!("A short note on the {id}."),
            proto::DocumentFormat::Plain,
        )
    });
    upsert(&mut client, "docs-v1", documents.to_vec()).await;
    assert_eq!(
        printed(&address, &["collections", "list"]),
        [
            "docs-v1  ready  documents 2  sections 2  aliases -",
            "docs-v2  ready  documents 0  sections 0  aliases -",
        ]
    );

    // An alias, created and switched: printed as the server answers, held as printed.
    assert_eq!(
        printed(&address, &["alias", "create", "live", "docs-v1"]),
        ["live -> docs-v1"]
    );
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v1")]);
    assert_eq!(
        printed(&address, &["alias", "switch", "live", "docs-v2"]),
        ["live -> docs-v2"]
    );
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v2")]);
    assert_eq!(printed(&address, &["alias", "list"]), ["live -> docs-v2"]);
    let through_alias = printed(&address, &["collections", "get", "live"]);
    assert_eq!(
        through_alias[0],
        "docs-v2  ready  documents 0  sections 0  aliases live"
    );
    assert!(through_alias.contains(&"  section tokens 256".to_string()));
    let first = printed(&address, &["collections", "get", "docs-v1"]);
    assert!(
        first.contains(&"  section tokens 128".to_string()),
        "{first:?}"
    );

    // Refusals exit non-zero with the code's gRPC name, and change nothing.
    let missing = refused(
        &address,
        &["alias", "create", "stale", "no-such-collection"],
    );
    assert!(missing.contains("NOT_FOUND"), "{missing}");
    assert!(missing.contains("no-such-collection"), "{missing}");
    let named = refused(&address, &["collections", "delete", "docs-v2"]);
    assert!(named.contains("FAILED_PRECONDITION"), "{named}");
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v2")]);

    assert_eq!(
        printed(&address, &["alias", "delete", "live"]),
        ["deleted alias live"]
    );
    assert!(server_aliases(&mut client).await.is_empty());
    assert!(printed(&address, &["alias", "list"]).is_empty());
    assert_eq!(
        printed(&address, &["collections", "delete", "docs-v2"]),
        ["deleted docs-v2"]
    );
    assert_eq!(server_collections(&mut client).await, ["docs-v1"]);
    binary::stop(process);
}

#[test]
fn health_prints_serving_and_exits_non_zero_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let process = binary::start(dir.path(), &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let address = process.address.clone();
    assert_eq!(printed(&address, &["health"]), ["SERVING"]);
    assert_eq!(printed(&address, &["health", "--service", ""]), ["SERVING"]);
    // A service the server does not know is the server's NOT_FOUND, and a failure.
    let unknown = refused(&address, &["health", "--service", "lathe.v9.Nothing"]);
    assert!(unknown.contains("NOT_FOUND"), "{unknown}");
    binary::stop(process);
    // Nobody listening: a failure that says where it tried.
    let gone = refused(&address, &["health", "--timeout-seconds", "5"]);
    assert!(
        gone.contains(&format!("connecting to http://{address}")),
        "{gone}"
    );
}
