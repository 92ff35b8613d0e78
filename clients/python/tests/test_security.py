"""TLS and API keys, against a real server. They run once deploy/lathe.toml (the documented
defaults, kept equal to the binary's built-in ones) has the section, and are skipped before.

Assumed configuration (see deploy/README.md, "Planned server features"):

    [tls]
    cert_file = ""        # PEM certificate chain; TLS is on when both files are set
    key_file = ""         # PEM private key

    [server]
    metrics_listen = ""   # HTTP address of the Prometheus /metrics endpoint; empty = off

    [auth]
    api_keys_file = ""    # one key a line, "<scope> <key>", scope read-only or read-write;
                          # clients send `authorization: Bearer <key>`; health stays open
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from conftest import documented_config, start_server
from lathe_client import Document, Lathe, LatheError

CONFIG = documented_config()


def require_section(section: str, keys: list[str]) -> None:
    if section not in CONFIG:
        pytest.skip(f"the server has no [{section}] configuration yet (deploy/lathe.toml)")
    missing = [key for key in keys if key not in CONFIG[section]]
    if missing:
        pytest.fail(
            f"deploy/lathe.toml has [{section}] but not {missing}: update these tests and the "
            "deploy manifests to the keys the server chose"
        )


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost."""
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    extensions = directory / "san.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*arguments: str) -> None:
        subprocess.run(["openssl", *arguments], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=lathe-test-ca",
            "-keyout", str(ca_key), "-out", str(ca_cert))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(cert))
    return ca_cert, cert, key


def test_tls_serves_clients_that_trust_the_ca_and_refuses_plaintext(tmp_path: Path) -> None:
    require_section("tls", ["cert_file", "key_file"])
    ca_cert, cert, key = make_certificates(tmp_path)
    server = start_server(
        tmp_path,
        extra_config={"tls": {"cert_file": str(cert), "key_file": str(key)}},
        client_kwargs={"root_certificates": ca_cert},
    )
    try:
        with Lathe(server.address, root_certificates=ca_cert) as secure:
            secure.create_collection("secure")
            secure.upsert("secure", [Document(id="a", text="Herons wade in shallow water.")], wait=True)
            assert secure.retrieve("secure", "herons", budget=20).chunks[0].doc_id == "a"
        # One attempt: the retry policy would retry UNAVAILABLE until the deadline.
        with Lathe(server.address, timeout=3.0, max_attempts=1) as plaintext:
            with pytest.raises(LatheError) as raised:
                plaintext.list_collections()
            assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        assert server.stop() == 0, server.log()


def test_api_keys_authenticate_and_scope_every_call(tmp_path: Path) -> None:
    require_section("auth", ["api_keys_file"])
    keys = tmp_path / "api-keys"
    keys.write_text("# scope key\nread-write rw-secret-key\nread-only ro-secret-key\n")
    server = start_server(tmp_path, extra_config={"auth": {"api_keys_file": str(keys)}})
    try:
        # Health stays open: Kubernetes gRPC probes cannot send credentials.
        with Lathe(server.address) as anonymous:
            assert anonymous.health() == "SERVING"
            with pytest.raises(LatheError) as raised:
                anonymous.list_collections()
            assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED
        with Lathe(server.address, api_key="wrong-key") as wrong:
            with pytest.raises(LatheError) as raised:
                wrong.list_collections()
            assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED
        with Lathe(server.address, api_key="rw-secret-key") as writer:
            writer.create_collection("scoped")
            writer.upsert("scoped", [Document(id="a", text="Owls hunt at night.")], wait=True)
        with Lathe(server.address, api_key="ro-secret-key") as reader:
            assert reader.retrieve("scoped", "owls", budget=20).chunks[0].doc_id == "a"
            assert [c.name for c in reader.list_collections()] == ["scoped"]
            with pytest.raises(LatheError) as raised:
                reader.upsert("scoped", [Document(id="b", text="Not allowed.")], wait=True)
            assert raised.value.code is grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(LatheError) as raised:
                reader.delete_collection("scoped")
            assert raised.value.code is grpc.StatusCode.PERMISSION_DENIED
    finally:
        assert server.stop() == 0, server.log()


def test_metrics_are_served_over_http_on_metrics_listen(tmp_path: Path) -> None:
    """The manifests scrape `[server] metrics_listen` (port 9090 there) at /metrics."""
    if "metrics_listen" not in CONFIG.get("server", {}):
        pytest.skip("the server has no [server] metrics_listen yet (deploy/lathe.toml)")
    import urllib.request

    from conftest import free_port

    metrics_address = f"127.0.0.1:{free_port()}"
    server = start_server(tmp_path, extra_config={"server": {"metrics_listen": metrics_address}})
    try:
        with Lathe(server.address) as client:
            client.list_collections()
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
            assert response.status == 200
            body = response.read().decode()
        assert "lathe" in body, body[:500]
    finally:
        assert server.stop() == 0, server.log()
