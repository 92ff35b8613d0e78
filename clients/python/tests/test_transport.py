"""The client's own TLS and API-key plumbing, against an in-process Python gRPC health server
(runs whether or not the Lathe server has TLS or API keys yet)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from conftest import free_port
from lathe_client import Lathe, LatheError
from test_security import make_certificates


class RecordAuthorization(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        metadata = dict(handler_call_details.invocation_metadata or ())
        self.seen.append(metadata.get("authorization"))
        return continuation(handler_call_details)


@pytest.fixture()
def tls_health_server(tmp_path: Path) -> Iterator[tuple[str, Path, RecordAuthorization]]:
    ca_cert, cert, key = make_certificates(tmp_path)
    recorder = RecordAuthorization()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[recorder])
    servicer = health.HealthServicer()
    servicer.set("lathe.v1.Lathe", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    server.add_secure_port(address, credentials)
    server.start()
    yield address, ca_cert, recorder
    server.stop(None)


def test_a_root_certificate_path_or_pem_bytes_enable_tls(
    tls_health_server: tuple[str, Path, RecordAuthorization],
) -> None:
    address, ca_cert, _ = tls_health_server
    with Lathe(address, root_certificates=ca_cert) as by_path:
        assert by_path.health() == "SERVING"
    with Lathe(address, root_certificates=ca_cert.read_bytes()) as by_bytes:
        assert by_bytes.health() == "SERVING"


def test_an_untrusted_server_certificate_is_unavailable(
    tls_health_server: tuple[str, Path, RecordAuthorization],
) -> None:
    address, _, _ = tls_health_server
    with Lathe(address, tls=True, timeout=3.0) as system_roots:
        with pytest.raises(LatheError) as raised:
            system_roots.health()
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE


def test_the_api_key_is_sent_as_bearer_authorization(
    tls_health_server: tuple[str, Path, RecordAuthorization],
) -> None:
    address, ca_cert, recorder = tls_health_server
    with Lathe(address, root_certificates=ca_cert, api_key="k-123") as keyed:
        keyed.health()
    with Lathe(address, root_certificates=ca_cert) as anonymous:
        anonymous.health()
    assert recorder.seen == ["Bearer k-123", None]
