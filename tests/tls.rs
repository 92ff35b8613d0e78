//! TLS (rows 57 to 60 of docs/bad-input.md): a client that trusts another CA, a client
//! certificate from another CA or none under mutual TLS, and plaintext to the TLS port are all
//! refused, and the server keeps serving good clients; a renewed certificate and a changed API
//! keys file are used without a restart; the CLI reaches a TLS server (API key, mutual TLS) through
//! its flags.

mod common;

use std::time::Duration;

use common::tls::TestCa;
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::InProcessServer;
use tonic::transport::Channel;

async fn tls_client(
    address: std::net::SocketAddr,
    trusted_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<proto::ListCollectionsResponse, String> {
    let channel = tls_channel(address, trusted_ca, identity).await?;
    list_with_key(&channel, None).await
}

/// ListCollections on `channel`, with `authorization: Bearer <key>` when a key is given.
async fn list_with_key(
    channel: &Channel,
    key: Option<&str>,
) -> Result<proto::ListCollectionsResponse, String> {
    let mut request = tonic::Request::new(proto::ListCollectionsRequest {});
    if let Some(key) = key {
        let value = format!("Bearer {key}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    LatheClient::new(channel.clone())
        .list_collections(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("call: {status:?}"))
}

async fn tls_channel(
    address: std::net::SocketAddr,
    trusted_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<Channel, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trusted_ca))
        .domain_name("localhost");
    if let Some((certificate, key)) = identity {
        tls = tls.identity(Identity::from_pem(certificate, key));
    }
    Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| format!("connect: {error:?}"))
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

/// `lathe ARGS --addr ADDRESS` with `VARIABLES` (and no other `LATHE_API_KEY`, `LATHE_CA_CERT`,
/// `LATHE_TLS_CERT` or `LATHE_TLS_KEY`),
/// as the chart's backup Job runs it, on a blocking thread: its output, or the error it printed.
async fn cli(address: &str, variables: &[(&str, &str)], args: &[&str]) -> Result<String, String> {
    let mut command = std::process::Command::new(common::binary::lathe_binary());
    command
        .args(args)
        .args(["--addr", address])
        .env_remove("LATHE_API_KEY")
        .env_remove("LATHE_CA_CERT")
        .env_remove("LATHE_TLS_CERT")
        .env_remove("LATHE_TLS_KEY")
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

/// A TLS server with API keys (`rw-secret`, `ro-secret`) whose certificate names only
/// `localhost`, requiring client certificates signed by `client_ca` when given; the files the
/// CLI is pointed at are written into `dir`.
async fn secured_server(
    dir: &std::path::Path,
    server_ca: &TestCa,
    client_ca: Option<&TestCa>,
) -> InProcessServer {
    let (certificate, key) = server_ca.leaf(&["localhost"]);
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let mut config = lexical_config(&dir.join("data"));
    config.tls.cert_file = write("server.pem", &certificate);
    config.tls.key_file = write("server.key", &key);
    if let Some(client_ca) = client_ca {
        config.tls.client_ca_file = write("client-ca.pem", &client_ca.pem);
    }
    config.auth.api_keys_file = write("keys", "read-write rw-secret\nread-only ro-secret\n");
    InProcessServer::spawn(config)
        .await
        .expect("the server starts")
}

/// Writes `text` into `dir/name`; the path, as an argument.
fn file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reaches_a_tls_server_with_an_api_key_through_its_flags() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("lathe test server ca");
        let server = secured_server(dir.path(), &server_ca, None).await;
        // By IP: the certificate names only localhost, which --tls-domain says to expect; the
        // CA alone makes it TLS (no https:// needed).
        let address = format!("127.0.0.1:{}", server.address().port());
        let ca = file(dir.path(), "ca.pem", &server_ca.pem);
        let document = file(
            dir.path(),
            "lathes.md",
            "# Lathes\n\nA lathe turns wood and metal.\n",
        );
        let tls = ["--tls-ca", ca.as_str(), "--tls-domain", "localhost"];
        let with = |args: &[&str], key: &str| -> Vec<String> {
            let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            all.extend(tls.iter().map(|a| a.to_string()));
            if !key.is_empty() {
                all.extend(["--api-key".to_string(), key.to_string()]);
            }
            all
        };
        let run = |args: Vec<String>| {
            let address = address.clone();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                cli(&address, &[], &args).await
            }
        };
        until_ready(|| run(with(&["collections", "list"], "ro-secret"))).await;

        let health = run(with(&["health"], "")).await.expect("health over TLS");
        assert_eq!(health, "SERVING\n");
        let ingest = ["ingest", "-c", "docs", document.as_str()];
        let ingested = run(with(&ingest, "rw-secret")).await.expect("ingest");
        assert!(ingested.starts_with("ingested 1 documents"), "{ingested}");
        let listed = run(with(&["collections", "list"], "ro-secret"))
            .await
            .unwrap();
        assert_eq!(listed, "docs  ready  documents 1  sections 1  aliases -\n");
        let answer = run(with(&["query", "lathe", "-c", "docs"], "ro-secret"))
            .await
            .expect("query");
        assert!(answer.contains("A lathe turns wood and metal."), "{answer}");

        // Refusals print the gRPC code's name and the server's message.
        let error = run(with(&["query", "lathe", "-c", "docs"], ""))
            .await
            .unwrap_err();
        assert!(error.contains("UNAUTHENTICATED"), "{error}");
        let error = run(with(&["collections", "delete", "docs"], "ro-secret"))
            .await
            .unwrap_err();
        assert!(
            error.starts_with("lathe: PERMISSION_DENIED: ")
                && error.contains("DeleteCollection writes: this API key is read-only"),
            "{error}"
        );
        // Without --tls-domain the certificate does not name the address.
        let args = [
            "collections",
            "list",
            "--tls-ca",
            ca.as_str(),
            "--api-key",
            "rw-secret",
        ];
        let error = cli(&address, &[], &args).await.unwrap_err();
        assert!(error.contains("connecting to https://127.0.0.1"), "{error}");
        // A plaintext http:// address with TLS settings is refused before any byte is sent.
        let plaintext = format!("http://{address}");
        let error = cli(
            &plaintext,
            &[],
            &with(&["health"], "")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap_err();
        assert!(error.contains("is plaintext"), "{error}");
        server.stop().await.expect("the server stops cleanly");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_presents_its_certificate_to_a_server_that_requires_one() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("lathe test server ca");
        let client_ca = TestCa::new("lathe test client ca");
        let server = secured_server(dir.path(), &server_ca, Some(&client_ca)).await;
        let address = format!("https://localhost:{}", server.address().port());
        let ca = file(dir.path(), "ca.pem", &server_ca.pem);
        let (certificate, key) = client_ca.leaf(&["client"]);
        let certificate = file(dir.path(), "client.pem", &certificate);
        let key = file(dir.path(), "client.key", &key);
        let document = file(
            dir.path(),
            "lathes.md",
            "# Lathes\n\nA lathe turns wood and metal.\n",
        );
        let identity = [
            "--tls-ca",
            ca.as_str(),
            "--tls-cert",
            certificate.as_str(),
            "--tls-key",
            key.as_str(),
            "--api-key",
            "rw-secret",
        ];
        let with_identity = |args: &[&str]| -> Vec<String> {
            args.iter()
                .chain(identity.iter())
                .map(|a| a.to_string())
                .collect()
        };
        let run = |args: Vec<String>| {
            let address = address.clone();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                cli(&address, &[], &args).await
            }
        };
        until_ready(|| run(with_identity(&["collections", "list"]))).await;

        assert_eq!(run(with_identity(&["health"])).await.unwrap(), "SERVING\n");
        let ingest = ["ingest", "-c", "docs", document.as_str()];
        run(with_identity(&ingest))
            .await
            .expect("ingest with a client certificate");
        let answer = run(with_identity(&["query", "lathe", "-c", "docs"]))
            .await
            .expect("query with a client certificate");
        assert!(answer.contains("A lathe turns wood and metal."), "{answer}");
        // The identity from the environment, as a Job mounts it.
        let variables = [
            ("LATHE_CA_CERT", ca.as_str()),
            ("LATHE_TLS_CERT", certificate.as_str()),
            ("LATHE_TLS_KEY", key.as_str()),
            ("LATHE_API_KEY", "ro-secret"),
        ];
        let listed = cli(&address, &variables, &["collections", "list"])
            .await
            .unwrap();
        assert_eq!(listed, "docs  ready  documents 1  sections 1  aliases -\n");

        // No client certificate: the server refuses the handshake.
        let bare = [
            "collections",
            "list",
            "--tls-ca",
            ca.as_str(),
            "--api-key",
            "rw-secret",
        ];
        let error = cli(&address, &[], &bare).await.unwrap_err();
        assert!(error.starts_with("lathe: "), "{error}");
        // Half an identity is the client's own error.
        let half = [
            "collections",
            "list",
            "--tls-ca",
            ca.as_str(),
            "--tls-cert",
            certificate.as_str(),
        ];
        let error = cli(&address, &[], &half).await.unwrap_err();
        assert!(
            error.contains("needs both --tls-cert and --tls-key"),
            "{error}"
        );
        server.stop().await.expect("the server stops cleanly");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}

/// cert-manager renews a certificate in place and an operator edits the API keys file: new
/// connections get the new certificate and calls the new keys within
/// `server.reload_interval_ms`, connections already open keep working, and a broken file (a
/// renewal half written) keeps the previous one in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_and_changed_api_keys_are_used_without_a_restart() {
    tokio::time::timeout(TEST_LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let old_ca = TestCa::new("lathe test ca, this year");
        let new_ca = TestCa::new("lathe test ca, next year");
        let client_ca = TestCa::new("lathe test client ca");
        let identity = client_ca.leaf(&["client"]);
        // As a Secret volume is updated: the new bytes appear at once under the same name.
        let replace = |name: &str, text: &str| {
            let path = dir.path().join(name);
            let staged = dir.path().join(format!(".{name}.new"));
            std::fs::write(&staged, text).unwrap();
            std::fs::rename(&staged, &path).unwrap();
            path.to_string_lossy().into_owned()
        };
        let (certificate, key) = old_ca.leaf(&["localhost"]);
        let mut config = lexical_config(&dir.path().join("data"));
        config.tls.cert_file = replace("tls.crt", &certificate);
        config.tls.key_file = replace("tls.key", &key);
        config.tls.client_ca_file = replace("client-ca.pem", &client_ca.pem);
        config.auth.api_keys_file = replace("keys", "read-write old-key\n");
        config.server.reload_interval_ms = 100;
        let server = InProcessServer::spawn(config)
            .await
            .expect("the server starts");
        let address = server.address();
        let open = until_ready(|| tls_channel(address, &old_ca.pem, Some(&identity))).await;
        list_with_key(&open, Some("old-key")).await.expect("served");

        let (certificate, key) = new_ca.leaf(&["localhost"]);
        replace("tls.crt", &certificate);
        replace("tls.key", &key);
        replace("keys", "read-write new-key\n");
        let renewed = until_ready(|| async {
            let channel = tls_channel(address, &new_ca.pem, Some(&identity)).await?;
            list_with_key(&channel, Some("new-key"))
                .await
                .map(|_| channel)
        })
        .await;

        let error = tls_channel(address, &old_ca.pem, Some(&identity))
            .await
            .and(Err::<(), _>("connected".to_string()))
            .unwrap_err();
        assert!(
            error.contains("UnknownIssuer"),
            "new connections get the new certificate: {error}"
        );
        let error = list_with_key(&renewed, Some("old-key")).await.unwrap_err();
        assert!(
            error.contains("Unauthenticated"),
            "the old key is gone: {error}"
        );
        list_with_key(&open, Some("new-key"))
            .await
            .expect("a connection opened before the renewal keeps working");

        // A renewal half written: the key does not match the certificate, then the certificate
        // is not PEM. Both are refused and the certificate in use stays.
        replace("tls.key", &new_ca.leaf(&["localhost"]).1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        replace("tls.crt", "not a certificate");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let channel = tls_channel(address, &new_ca.pem, Some(&identity))
            .await
            .expect("the previous certificate is still served");
        list_with_key(&channel, Some("new-key"))
            .await
            .expect("served");
        server.stop().await.expect("the server stops cleanly");
    })
    .await
    .expect("the test ends within TEST_LIMIT");
}
