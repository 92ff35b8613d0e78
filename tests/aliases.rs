//! Collection aliases (issue 56, item 3), through the real `lathe serve` binary (lexical mode): a
//! Retrieve or a write naming an alias acts on its collection; a switch is atomic for readers
//! (an alias switched 100 times under 4 readers gives no error and never a mixed answer) and
//! survives a restart; the result cache never answers for the other collection after a switch;
//! ListCollections shows the aliases; and what is refused is refused with the code and the names.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic::Code;

const SWITCHES: usize = 100;
const READERS: usize = 4;

async fn start(data_dir: &Path) -> (binary::Server, LatheClient<Channel>) {
    let process = binary::start(data_dir, &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let client = binary::connect(&process.address).await;
    (process, client)
}

/// Collection `name` with five documents `<prefix>-<i>`, whose texts share the query's words.
async fn collection_of(client: &mut LatheClient<Channel>, name: &str, prefix: &str) {
    create_collection(client, name).await;
    let documents = (0..5)
        .map(|i| {
            let text = format!(
                "The lathe turns {prefix} stock number {i}. A lathe spins the work against a cutting tool, and the {prefix} shavings fall away."
            );
            document(&format!("{prefix}-{i}"), &text, proto::DocumentFormat::Plain)
        })
        .collect();
    upsert(client, name, documents).await;
}

async fn create_alias(client: &mut LatheClient<Channel>, alias: &str, collection: &str) {
    let made = client
        .create_alias(proto::CreateAliasRequest {
            alias: alias.into(),
            collection: collection.into(),
        })
        .await
        .expect("create alias")
        .into_inner();
    assert_eq!(
        (made.alias.as_str(), made.collection.as_str()),
        (alias, collection)
    );
}

async fn switch_alias(client: &mut LatheClient<Channel>, alias: &str, collection: &str) {
    let switched = client
        .switch_alias(proto::SwitchAliasRequest {
            alias: alias.into(),
            collection: collection.into(),
        })
        .await
        .expect("switch alias")
        .into_inner();
    assert_eq!(switched.collection, collection);
}

/// The one document-id prefix of every chunk of `answer`, or why there is none.
fn prefix_of(answer: &proto::RetrieveResponse) -> Result<String, String> {
    let prefixes: BTreeSet<&str> = answer
        .chunks
        .iter()
        .map(|chunk| chunk.doc_id.split('-').next().unwrap_or(""))
        .collect();
    match prefixes.len() {
        1 => Ok(prefixes.into_iter().next().unwrap().to_string()),
        0 => Err("an empty answer".into()),
        _ => Err(format!(
            "a mixed answer: {:?}",
            answer.chunks.iter().map(|c| &c.doc_id).collect::<Vec<_>>()
        )),
    }
}

async fn retrieve_prefix(client: &mut LatheClient<Channel>, collection: &str) -> (String, bool) {
    let answer = retrieve(
        client,
        retrieve_request(collection, "lathe turns stock", 200),
    )
    .await;
    (prefix_of(&answer).unwrap(), answer.cache_hit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_alias_switched_100_times_under_4_readers_gives_no_error_and_never_a_mixed_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    tokio::time::timeout(TEST_LIMIT * 2, async {
        collection_of(&mut client, "v1", "a").await;
        collection_of(&mut client, "v2", "b").await;
        create_alias(&mut client, "live", "v1").await;

        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|reader| {
                let (mut client, stop) = (client.clone(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let (mut seen, mut failures, mut answers) = (BTreeSet::new(), Vec::new(), 0);
                    let mut i = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        // Budgets vary, so both cached answers and fresh ones are read.
                        let budget = 150 + (reader as u32 * 7 + i) % 11;
                        let request = retrieve_request("live", "lathe turns stock", budget);
                        match client.retrieve(request).await {
                            Ok(answer) => match prefix_of(&answer.into_inner()) {
                                Ok(prefix) => {
                                    seen.insert(prefix);
                                }
                                Err(why) => failures.push(why),
                            },
                            Err(status) => failures.push(format!("{status:?}")),
                        }
                        answers += 1;
                        i += 1;
                    }
                    (seen, failures, answers)
                })
            })
            .collect();
        for switch in 0..SWITCHES {
            let target = if switch % 2 == 0 { "v2" } else { "v1" };
            switch_alias(&mut client, "live", target).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut seen_by_all = BTreeSet::new();
        for reader in readers {
            let (seen, failures, answers) = reader.await.unwrap();
            assert!(
                failures.is_empty(),
                "{} of {answers}: {:?}",
                failures.len(),
                &failures[..failures.len().min(5)]
            );
            assert!(answers > 0);
            seen_by_all.extend(seen);
        }
        assert_eq!(
            seen_by_all,
            BTreeSet::from(["a".to_string(), "b".to_string()]),
            "the readers saw both collections"
        );
        // An even number of switches: back on v1.
        assert_eq!(retrieve_prefix(&mut client, "live").await.0, "a");
    })
    .await
    .expect("the test ends in time");
    binary::stop(process);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_survives_a_restart_and_is_listed_with_its_collection() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    collection_of(&mut client, "v1", "a").await;
    collection_of(&mut client, "v2", "b").await;
    create_alias(&mut client, "live", "v1").await;
    create_alias(&mut client, "staging", "v1").await;
    switch_alias(&mut client, "staging", "v2").await;
    binary::stop(process);

    let (process, mut client) = start(dir.path()).await;
    let aliases = client
        .list_aliases(proto::ListAliasesRequest {})
        .await
        .unwrap()
        .into_inner()
        .aliases;
    let listed: Vec<(&str, &str)> = aliases
        .iter()
        .map(|a| (a.alias.as_str(), a.collection.as_str()))
        .collect();
    assert_eq!(listed, [("live", "v1"), ("staging", "v2")]);
    assert_eq!(retrieve_prefix(&mut client, "live").await.0, "a");
    assert_eq!(retrieve_prefix(&mut client, "staging").await.0, "b");

    let collections = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .collections;
    let shown: Vec<(&str, Vec<String>)> = collections
        .iter()
        .map(|c| (c.name.as_str(), c.aliases.clone()))
        .collect();
    assert_eq!(
        shown,
        [
            ("v1", vec!["live".to_string()]),
            ("v2", vec!["staging".to_string()])
        ]
    );
    let through_alias = client
        .get_collection(proto::GetCollectionRequest {
            name: "live".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (through_alias.name.as_str(), through_alias.aliases),
        ("v1", vec!["live".to_string()])
    );
    binary::stop(process);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_never_serves_the_other_collections_cached_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    collection_of(&mut client, "v1", "a").await;
    collection_of(&mut client, "v2", "b").await;
    create_alias(&mut client, "live", "v1").await;
    assert_eq!(
        retrieve_prefix(&mut client, "live").await,
        ("a".into(), false)
    );
    assert_eq!(
        retrieve_prefix(&mut client, "live").await,
        ("a".into(), true)
    );

    switch_alias(&mut client, "live", "v2").await;
    assert_eq!(
        retrieve_prefix(&mut client, "live").await,
        ("b".into(), false)
    );
    assert_eq!(
        retrieve_prefix(&mut client, "live").await,
        ("b".into(), true)
    );
    // The cache is keyed by the collection, not by the name the call gave.
    assert_eq!(retrieve_prefix(&mut client, "v2").await, ("b".into(), true));
    switch_alias(&mut client, "live", "v1").await;
    assert_eq!(retrieve_prefix(&mut client, "live").await.0, "a");
    binary::stop(process);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_an_alias_goes_to_the_collection_it_named() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    collection_of(&mut client, "v1", "a").await;
    collection_of(&mut client, "v2", "b").await;
    create_alias(&mut client, "live", "v1").await;
    let written = upsert(
        &mut client,
        "live",
        vec![document(
            "a-new",
            "A lathe turns a new part.",
            proto::DocumentFormat::Plain,
        )],
    )
    .await;
    let operation = written.operation.expect("the write's operation");
    assert_eq!(operation.collection, "v1");
    assert_eq!(collection_stats(&mut client, "v1").await.documents, 6);
    assert_eq!(collection_stats(&mut client, "v2").await.documents, 5);
    let listed = client
        .list_operations(proto::ListOperationsRequest {
            collection: "live".into(),
            limit: 10,
        })
        .await
        .unwrap()
        .into_inner()
        .operations;
    assert!(listed.iter().any(|o| o.id == operation.id), "{listed:?}");
    client
        .delete_documents(proto::DeleteDocumentsRequest {
            collection: "live".into(),
            ids: vec!["a-new".into()],
            wait: true,
            write_id: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(collection_stats(&mut client, "v1").await.documents, 5);
    binary::stop(process);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_aliases_refuse_is_refused_with_the_code_and_the_names() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    collection_of(&mut client, "v1", "a").await;
    create_collection(&mut client, "v2").await;
    let alias_request = |alias: &str, collection: &str| proto::CreateAliasRequest {
        alias: alias.into(),
        collection: collection.into(),
    };
    expect_code(
        client.create_alias(alias_request("live", "missing")).await,
        Code::NotFound,
        &["`missing`"],
    );
    expect_code(
        client.create_alias(alias_request("v2", "v1")).await,
        Code::AlreadyExists,
        &["collection `v2` already exists"],
    );
    expect_code(
        client.create_alias(alias_request("bad name", "v1")).await,
        Code::InvalidArgument,
        &["`alias`"],
    );
    create_alias(&mut client, "live", "v1").await;
    expect_code(
        client.create_alias(alias_request("live", "v2")).await,
        Code::AlreadyExists,
        &["`live` is already an alias (of collection `v1`)"],
    );
    expect_code(
        client
            .create_collection(proto::CreateCollectionRequest {
                name: "live".into(),
                settings: None,
            })
            .await,
        Code::AlreadyExists,
        &["`live` is already an alias"],
    );
    expect_code(
        client.create_alias(alias_request("other", "live")).await,
        Code::InvalidArgument,
        &["`live` is an alias", "never another alias"],
    );
    expect_code(
        client
            .switch_alias(proto::SwitchAliasRequest {
                alias: "nope".into(),
                collection: "v1".into(),
            })
            .await,
        Code::NotFound,
        &["alias `nope` not found"],
    );
    for name in ["v1", "live"] {
        expect_code(
            client
                .delete_collection(proto::DeleteCollectionRequest { name: name.into() })
                .await,
            Code::FailedPrecondition,
            &[
                "collection `v1` is named by alias `live`",
                "switch or delete",
            ],
        );
    }
    assert_eq!(retrieve_prefix(&mut client, "live").await.0, "a");
    client
        .delete_alias(proto::DeleteAliasRequest {
            alias: "live".into(),
        })
        .await
        .expect("delete alias");
    expect_code(
        client
            .delete_alias(proto::DeleteAliasRequest {
                alias: "live".into(),
            })
            .await,
        Code::NotFound,
        &["alias `live` not found"],
    );
    expect_code(
        client
            .retrieve(retrieve_request("live", "lathe", 100))
            .await,
        Code::NotFound,
        &["collection `live` not found"],
    );
    client
        .delete_collection(proto::DeleteCollectionRequest { name: "v1".into() })
        .await
        .expect("delete the collection once no alias names it");
    binary::stop(process);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_whose_collection_is_gone_at_start_is_kept_and_answers_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("aliases.json"),
        r#"{"version": 1, "aliases": {"ghost": "gone"}}"#,
    )
    .unwrap();
    let (process, mut client) = start(dir.path()).await;
    let aliases = client
        .list_aliases(proto::ListAliasesRequest {})
        .await
        .unwrap()
        .into_inner()
        .aliases;
    assert_eq!(aliases.len(), 1);
    assert_eq!(
        (aliases[0].alias.as_str(), aliases[0].collection.as_str()),
        ("ghost", "gone")
    );
    expect_code(
        client
            .retrieve(retrieve_request("ghost", "lathe", 100))
            .await,
        Code::NotFound,
        &["collection `gone`, which alias `ghost` names, not found"],
    );
    // It can be switched to a collection that is there.
    collection_of(&mut client, "v1", "a").await;
    switch_alias(&mut client, "ghost", "v1").await;
    assert_eq!(retrieve_prefix(&mut client, "ghost").await.0, "a");
    binary::stop(process);
}

/// kill -9 at a moment in the middle of a run of switches: after the restart the alias names the
/// collection of the last acknowledged switch or of the one in flight, and serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_an_alias_is_switched_leaves_it_on_the_old_collection_or_the_new() {
    for (round, kill_after_ms) in [15u64, 40, 90].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let (mut process, mut client) = start(dir.path()).await;
        collection_of(&mut client, "v1", "a").await;
        collection_of(&mut client, "v2", "b").await;
        create_alias(&mut client, "live", "v1").await;
        let acknowledged = Arc::new(std::sync::Mutex::new(("v1".to_string(), None)));
        let switching = {
            let (mut client, acknowledged) = (client.clone(), Arc::clone(&acknowledged));
            tokio::spawn(async move {
                for switch in 0.. {
                    let target = if switch % 2 == 0 { "v2" } else { "v1" };
                    acknowledged.lock().unwrap().1 = Some(target.to_string());
                    let request = proto::SwitchAliasRequest {
                        alias: "live".into(),
                        collection: target.into(),
                    };
                    if client.switch_alias(request).await.is_err() {
                        return switch;
                    }
                    *acknowledged.lock().unwrap() = (target.to_string(), None);
                }
                unreachable!()
            })
        };
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        process.child.kill().unwrap();
        process.child.wait().unwrap();
        let switches = switching.await.unwrap();
        let (last, in_flight) = acknowledged.lock().unwrap().clone();

        let (process, mut client) = start(dir.path()).await;
        assert!(!dir.path().join("aliases.json.tmp").exists());
        let aliases = client
            .list_aliases(proto::ListAliasesRequest {})
            .await
            .unwrap()
            .into_inner()
            .aliases;
        let now = aliases[0].collection.clone();
        assert!(
            now == last || Some(&now) == in_flight.as_ref(),
            "round {round}, after {switches} switches: `live` names {now}; the last acknowledged switch named {last}, the one in flight {in_flight:?}"
        );
        let expected = if now == "v1" { "a" } else { "b" };
        assert_eq!(retrieve_prefix(&mut client, "live").await.0, expected);
        binary::stop(process);
    }
}

/// The README's recipe, ten times over under 4 readers: create the next version, fill it, switch
/// the alias, delete the previous version. No reader gets an error, even one that resolved the
/// alias just before the switch and reached the collection just after its delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reindexing_behind_an_alias_and_deleting_the_old_version_gives_readers_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let (process, mut client) = start(dir.path()).await;
    collection_of(&mut client, "v0", "a").await;
    create_alias(&mut client, "live", "v0").await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (mut client, stop) = (client.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let (mut failures, mut answers) = (Vec::new(), 0);
                while !stop.load(Ordering::Relaxed) {
                    let request = retrieve_request("live", "lathe turns stock", 150 + answers % 7);
                    match client.retrieve(request).await {
                        Ok(answer) => {
                            if let Err(why) = prefix_of(&answer.into_inner()) {
                                failures.push(why);
                            }
                        }
                        Err(status) => failures.push(format!("{status:?}")),
                    }
                    answers += 1;
                }
                (failures, answers)
            })
        })
        .collect();
    for version in 1..=10 {
        let (name, previous) = (format!("v{version}"), format!("v{}", version - 1));
        let prefix = if version % 2 == 0 { "a" } else { "b" };
        collection_of(&mut client, &name, prefix).await;
        switch_alias(&mut client, "live", &name).await;
        client
            .delete_collection(proto::DeleteCollectionRequest { name: previous })
            .await
            .expect("delete the previous version");
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let (failures, answers) = reader.await.unwrap();
        assert!(
            failures.is_empty(),
            "{} of {answers}: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }
    assert_eq!(retrieve_prefix(&mut client, "live").await.0, "a");
    binary::stop(process);
}
