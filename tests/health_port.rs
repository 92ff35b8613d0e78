//! The plaintext health port (`server.health_listen`) of a TLS server: the kubelet's gRPC probe
//! cannot speak TLS, so probes go to a port that serves only `grpc.health.v1.Health` in
//! plaintext, with the main server's statuses. The main port itself refuses plaintext.

mod common;

use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const LATHE_SERVICE: &str = "lathe.v1.Lathe";

fn free_local_address() -> std::net::SocketAddr {
    binary::free_local_address()
        .parse()
        .expect("a socket address")
}

/// The status of `service` on the plaintext health port, or None when nothing answers there.
async fn plaintext_health(address: std::net::SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .ok()?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .ok()?;
    Some(response.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_health_port_answers_plaintext_while_the_main_port_requires_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = certified.cert.pem();
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    std::fs::write(&cert_path, &cert_pem).unwrap();
    std::fs::write(&key_path, certified.signing_key.serialize_pem()).unwrap();

    let health_address = free_local_address();
    let mut config = test_config(&dir.path().join("data"));
    config.tls.cert_file = cert_path.display().to_string();
    config.tls.key_file = key_path.display().to_string();
    config.server.health_listen = health_address.to_string();
    let metrics_address = free_local_address();
    config.server.metrics_listen = metrics_address.to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(lathe::api::serve(config, listener, async move {
        let _ = shutdown_rx.await;
    }));

    // Until indexes and models are loaded lathe.v1.Lathe is NOT_SERVING (or the port is not up
    // yet); once SERVING it stays so. "" (the process) is SERVING whenever the port answers.
    let mut seen = Vec::new();
    loop {
        assert!(!server.is_finished(), "the server stopped while starting");
        let status = plaintext_health(health_address, LATHE_SERVICE).await;
        if seen.last() != Some(&status) {
            seen.push(status);
        }
        if status == Some(ServingStatus::Serving) {
            break;
        }
        assert!(
            matches!(status, None | Some(ServingStatus::NotServing)),
            "unexpected status while starting: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("lathe.v1.Lathe on the health port while starting: {seen:?}");
    assert_eq!(
        plaintext_health(health_address, "").await,
        Some(ServingStatus::Serving)
    );

    // The main port refuses plaintext, for health as for the API.
    let plaintext = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let refused = HealthClient::new(plaintext.clone())
        .check(HealthCheckRequest {
            service: LATHE_SERVICE.to_string(),
        })
        .await;
    assert!(
        refused.is_err(),
        "plaintext health on the TLS port: {refused:?}"
    );
    let refused = LatheClient::new(plaintext)
        .list_collections(proto::ListCollectionsRequest {})
        .await;
    assert!(
        refused.is_err(),
        "plaintext API on the TLS port: {refused:?}"
    );

    // Over TLS the main port serves, with the same health.
    let tls = Endpoint::from_shared(format!("https://localhost:{}", address.port()))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&cert_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .expect("TLS connect");
    let status = HealthClient::new(tls.clone())
        .check(HealthCheckRequest {
            service: LATHE_SERVICE.to_string(),
        })
        .await
        .expect("health over TLS")
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);
    let mut client: LatheClient<Channel> = LatheClient::new(tls)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    create_collection(&mut client, "c").await;

    // During the drain the health port stays up and reports NOT_SERVING (probes take the pod out
    // of rotation) while "" stays SERVING (the liveness probe does not restart a draining pod).
    // The request in flight is an upload whose stream stays open until the drain has been seen,
    // so it is in flight by construction, however fast the build (a 40-document upsert used to
    // be, in a debug build, and could finish before it was seen in a release one).
    let documents: Vec<proto::Document> = (0..40)
        .map(|doc| {
            let text = (0..12)
                .map(|sentence| {
                    format!("Sentence {sentence} of document {doc} about rivers, mills and canals.")
                })
                .collect::<Vec<_>>()
                .join(" ");
            document(&format!("d{doc}"), &text, proto::DocumentFormat::Plain)
        })
        .collect();
    let (batches, receiver) = tokio::sync::mpsc::channel(1);
    batches
        .send(proto::UpsertDocumentsRequest {
            collection: "c".to_string(),
            documents,
            wait: true,
            write_id: String::new(),
        })
        .await
        .unwrap();
    let mut writer = client.clone();
    let in_flight = tokio::spawn(async move {
        writer
            .upload_documents(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
    });
    while binary::requests_in_flight(metrics_address) < 1 {
        if in_flight.is_finished() {
            panic!(
                "the upload ended while its stream was open: {:?}",
                in_flight.await
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown_tx.send(()).unwrap();
    let draining = loop {
        match plaintext_health(health_address, LATHE_SERVICE).await {
            Some(ServingStatus::NotServing) => break plaintext_health(health_address, "").await,
            // The signal has not reached the reporter yet.
            Some(ServingStatus::Serving) => {}
            other => panic!("health port during the drain: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Ends the upload: it completes, and the drain with it.
    drop(batches);
    let upserted = in_flight
        .await
        .unwrap()
        .expect("in-flight upload completes");
    assert_eq!(upserted.into_inner().documents, 40);
    assert_eq!(
        draining,
        Some(ServingStatus::Serving),
        "the health port must report lathe.v1.Lathe NOT_SERVING and \"\" SERVING during the drain"
    );
    server.await.unwrap().expect("clean stop");
    assert_eq!(
        plaintext_health(health_address, LATHE_SERVICE).await,
        None,
        "the health port closes with the server"
    );
}
