//! API keys (rows 61 to 64 of docs/bad-input.md): a missing, wrong or non-Bearer key is
//! UNAUTHENTICATED, a read-only key cannot write, and a read-write key can do everything.

mod common;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::proto::DocumentFormat as Format;
use lathe::api::InProcessServer;
use tonic::transport::Channel;
use tonic::Code;

fn with_key<T>(message: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_api_keys_are_unauthenticated_and_read_only_keys_cannot_write() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "read-write rw-secret\nread-only ro-secret\n").unwrap();
        let mut config = lexical_config(&dir.path().join("data"));
        config.auth.api_keys_file = keys.to_string_lossy().into_owned();
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let uri = format!("http://{}", server.address());
        let client = until_ready(|| {
            let uri = uri.clone();
            async move { Channel::from_shared(uri).unwrap().connect().await }
        })
        .await;
        until_ready(|| {
            let mut client = LatheClient::new(client.clone());
            async move {
                client
                    .list_collections(with_key(
                        proto::ListCollectionsRequest {},
                        Some("Bearer rw-secret"),
                    ))
                    .await
            }
        })
        .await;
        let mut lathe = LatheClient::new(client.clone());
        lathe
            .create_collection(with_key(
                proto::CreateCollectionRequest {
                    name: "c".into(),
                    settings: None,
                },
                Some("Bearer rw-secret"),
            ))
            .await
            .unwrap();
        let upsert_request = |id: &str| proto::UpsertDocumentsRequest {
            collection: "c".into(),
            documents: vec![document(id, "Scrapers and burnishers.", Format::Plain)],
            wait: true,
            write_id: String::new(),
        };
        lathe
            .upsert_documents(with_key(upsert_request("keep"), Some("Bearer rw-secret")))
            .await
            .unwrap();

        for (authorization, needle) in [
            (None, "missing `authorization: Bearer <key>`"),
            (Some("Bearer wrong-secret"), "invalid API key"),
            (Some("Basic cnctc2VjcmV0"), "must be `Bearer <key>`"),
            (Some("Bearer "), "invalid API key"),
        ] {
            let status = expect_code(
                lathe
                    .retrieve(with_key(
                        retrieve_request("c", "scrapers", 100),
                        authorization,
                    ))
                    .await,
                Code::Unauthenticated,
                &[needle],
            );
            assert!(!status.message().contains("secret"), "{status:?}");
            expect_code(
                lathe
                    .upsert_documents(with_key(upsert_request("denied"), authorization))
                    .await,
                Code::Unauthenticated,
                &[needle],
            );
        }
        let read_only = Some("Bearer ro-secret");
        expect_code(
            lathe
                .upsert_documents(with_key(upsert_request("denied"), read_only))
                .await,
            Code::PermissionDenied,
            &["UpsertDocuments", "read-only"],
        );
        expect_code(
            lathe
                .delete_collection(with_key(
                    proto::DeleteCollectionRequest { name: "c".into() },
                    read_only,
                ))
                .await,
            Code::PermissionDenied,
            &["DeleteCollection", "read-only"],
        );
        expect_code(
            lathe
                .upload_documents(with_key(
                    tokio_stream::iter(vec![upsert_request("denied")]),
                    read_only,
                ))
                .await,
            Code::PermissionDenied,
            &["UploadDocuments", "read-only"],
        );
        // Reads with the read-only key work, and nothing denied was written.
        let response = lathe
            .retrieve(with_key(retrieve_request("c", "scrapers", 100), read_only))
            .await
            .unwrap()
            .into_inner();
        let ids: Vec<&str> = response.chunks.iter().map(|c| c.doc_id.as_str()).collect();
        assert_eq!(ids, ["keep"]);
        // Health stays open for probes.
        use tonic_health::pb::health_client::HealthClient;
        HealthClient::new(client.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: "lathe.v1.Lathe".into(),
            })
            .await
            .unwrap();
        server.stop().await.expect("the server stops cleanly");
    })
    .await
    .expect("bounded");
}
