//! TLS (rows 57 to 60 of docs/bad-input.md): a client that trusts another CA, a client
//! certificate from another CA or none under mutual TLS, and plaintext to the TLS port are all
//! refused, and the server keeps serving good clients.

mod common;

use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::InProcessServer;
use tonic::transport::Channel;

struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// (certificate PEM, key PEM) for `names`, signed by this CA.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        (certificate.pem(), key.serialize_pem())
    }
}

async fn tls_client(
    address: std::net::SocketAddr,
    trusted_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<proto::ListCollectionsResponse, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trusted_ca))
        .domain_name("localhost");
    if let Some((certificate, key)) = identity {
        tls = tls.identity(Identity::from_pem(certificate, key));
    }
    let channel = Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| format!("connect: {error:?}"))?;
    LatheClient::new(channel)
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("call: {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_wrong_certificate_is_refused_and_the_server_keeps_serving() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("lathe test server ca");
        let client_ca = TestCa::new("lathe test client ca");
        let stranger_ca = TestCa::new("some other ca");
        let (server_certificate, server_key) = server_ca.leaf(&["localhost", "127.0.0.1"]);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let mut config = lexical_config(&dir.path().join("data"));
        config.tls.cert_file = write("server.pem", &server_certificate);
        config.tls.key_file = write("server.key", &server_key);
        config.tls.client_ca_file = write("client-ca.pem", &client_ca.pem);
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let good_identity = client_ca.leaf(&["client"]);
        let stranger_identity = stranger_ca.leaf(&["client"]);

        until_ready(|| tls_client(server.address(), &server_ca.pem, Some(&good_identity))).await;
        // The client trusts a different CA: the server's certificate is refused.
        let error = tls_client(server.address(), &stranger_ca.pem, Some(&good_identity))
            .await
            .unwrap_err();
        assert!(error.contains("UnknownIssuer"), "{error}");
        // Mutual TLS: a client certificate from another CA, or none, is refused by the server.
        // (TLS 1.3: the client's handshake completes first, so the refusal arrives as the
        // server's alert on the first call.)
        // Which of the alert and the closed connection the client sees first varies.
        let error = tls_client(server.address(), &server_ca.pem, Some(&stranger_identity))
            .await
            .unwrap_err();
        assert!(error.contains("tonic::transport::Error"), "{error}");
        let error = tls_client(server.address(), &server_ca.pem, None)
            .await
            .unwrap_err();
        assert!(error.contains("tonic::transport::Error"), "{error}");
        // Plaintext against the TLS port fails too.
        let plaintext = Channel::from_shared(format!("http://{}", server.address()))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect()
            .await;
        if let Ok(channel) = plaintext {
            // The code is the client's reading of TLS bytes as HTTP/2 (UNKNOWN, INTERNAL, ...).
            LatheClient::new(channel)
                .list_collections(proto::ListCollectionsRequest {})
                .await
                .unwrap_err();
        }
        // Still serving the right client.
        tls_client(server.address(), &server_ca.pem, Some(&good_identity))
            .await
            .expect("the trusted client is still served");
        server.stop().await.expect("the server stops cleanly");
    })
    .await
    .expect("bounded");
}

/// `lathe ARGS --addr ADDRESS` with `VARIABLES` (and no other `LATHE_API_KEY`/`LATHE_CA_CERT`),
/// as the chart's backup Job runs it, on a blocking thread: its output, or the error it printed.
async fn cli(address: &str, variables: &[(&str, &str)], args: &[&str]) -> Result<String, String> {
    let mut command = std::process::Command::new(common::binary::lathe_binary());
    command
        .args(args)
        .args(["--addr", address])
        .env_remove("LATHE_API_KEY")
        .env_remove("LATHE_CA_CERT")
        .envs(variables.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_trusts_the_ca_and_sends_the_api_key_its_environment_names() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("lathe test server ca");
        let (certificate, key) = server_ca.leaf(&["localhost"]);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let mut config = lexical_config(&dir.path().join("data"));
        config.tls.cert_file = write("server.pem", &certificate);
        config.tls.key_file = write("server.key", &key);
        config.auth.api_keys_file = write("keys", "read-write rw-secret\nread-only ro-secret\n");
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let address = format!("https://localhost:{}", server.address().port());
        let ca = write("ca.pem", &server_ca.pem);
        let stranger = write("stranger.pem", &TestCa::new("some other ca").pem);
        let document = write("doc.md", "# Lathes\n\nA lathe turns wood and metal.\n");
        let writer = [
            ("LATHE_CA_CERT", ca.as_str()),
            ("LATHE_API_KEY", "rw-secret"),
        ];
        let reader = [
            ("LATHE_CA_CERT", ca.as_str()),
            ("LATHE_API_KEY", "ro-secret"),
        ];
        let list = ["snapshot", "list"];
        until_ready(|| cli(&address, &writer, &list)).await;

        let error = cli(&address, &[("LATHE_API_KEY", "rw-secret")], &list).await;
        assert!(error.unwrap_err().contains("set LATHE_CA_CERT"));
        let strangers = [
            ("LATHE_CA_CERT", stranger.as_str()),
            ("LATHE_API_KEY", "rw-secret"),
        ];
        let error = cli(&address, &strangers, &list).await.unwrap_err();
        assert!(error.contains("connecting to https://localhost"), "{error}");
        let error = cli(&address, &[("LATHE_CA_CERT", &ca)], &list)
            .await
            .unwrap_err();
        assert!(error.contains("UNAUTHENTICATED"), "{error}");

        let ingest = ["ingest", "--collection", "c", &document];
        let error = cli(&address, &reader, &ingest).await.unwrap_err();
        assert!(error.contains("this API key is read-only"), "{error}");
        cli(&address, &writer, &ingest)
            .await
            .expect("a read-write key ingests");
        let create = ["snapshot", "create", "--all"];
        let error = cli(&address, &reader, &create).await.unwrap_err();
        assert!(error.contains("PERMISSION_DENIED"), "{error}");
        let created = cli(&address, &writer, &create).await.unwrap();
        assert!(created.starts_with("c/c-g"), "{created}");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}
