#!/usr/bin/env python3
"""Runs each rendered NATS cluster on loopback with the local nats-server (run by validate.sh).

    nats_cluster_smoke.py RENDERED.yaml...

For every NATS StatefulSet of the renders, with the nats.conf of its ConfigMap:
  * `nats-server -t` accepts the file as shipped (POD_NAME set as Kubernetes sets it);
  * the same file, with only the addresses moved to free loopback ports and the store and pid file
    to a temporary folder, runs as many servers as the StatefulSet has; they form one JetStream
    cluster (every /healthz ok, as the startup probe asks; the meta group counts them all);
  * the stream Lathe creates (one message per subject, file storage, the Lathe StatefulSet's
    stream_replicas) is created; a message as large as Lathe sends (max_payload less its 4 KiB
    envelope) is stored, and one over max_payload is refused, so Lathe must split larger versions;
  * with 3 servers or more, one is stopped and a write is still stored (a majority is up).
Exit status 1 on any failure. Needs nats-server on PATH (CI: Debian's nats-server 2.9.10).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

import nats_conf

ENVELOPE_BYTES = 4096  # what Lathe keeps back from max_payload for headers (src/replication)
START_SECONDS = 30


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def loopback_conf(text: str, statefulset: str, service: str, node: int, ports: list[dict], folder: Path) -> str:
    """The shipped nats.conf with only addresses, the store and the pid file moved."""
    mine = ports[node]
    text = re.sub(r"^port: \d+$", f"port: {mine['client']}", text, count=1, flags=re.M)
    text = re.sub(r"^http_port: \d+$", f"http_port: {mine['http']}", text, count=1, flags=re.M)
    text = re.sub(r"^(\s+)port: \d+$", rf"\g<1>port: {mine['cluster']}", text, count=1, flags=re.M)
    text = re.sub(r"^pid_file: .*$", f"pid_file: {folder}/nats.pid", text, count=1, flags=re.M)
    text = re.sub(r"^(\s+)store_dir: .*$", rf"\g<1>store_dir: {folder}", text, count=1, flags=re.M)
    for other, other_ports in enumerate(ports):
        text = re.sub(rf"nats://{re.escape(statefulset)}-{other}\.{re.escape(service)}:\d+",
                      f"nats://127.0.0.1:{other_ports['cluster']}", text)
    parsed = nats_conf.parse(text)
    routes = (parsed.get("cluster") or {}).get("routes") or []
    if parsed.get("port") != mine["client"] or parsed.get("http_port") != mine["http"] or \
            any("127.0.0.1" not in str(r) for r in routes):
        raise RuntimeError("nats.conf is laid out in a way this smoke test cannot move to loopback")
    return text


class Client:
    """Just enough of the NATS protocol for JetStream API requests and publishes."""

    def __init__(self, port: int, timeout: float = 10) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = self.socket.makefile("rb")
        self.reader.readline()  # INFO
        self.socket.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.smoke 1\r\nPING\r\n')
        self.expect(b"PONG")

    def expect(self, prefix: bytes) -> bytes:
        while True:
            line = self.reader.readline()
            if not line:
                raise ConnectionError("connection closed")
            if line.startswith(b"PING"):
                self.socket.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise ConnectionError(line.decode().strip())
            elif line.startswith(prefix):
                return line

    def request(self, subject: str, payload: bytes) -> dict:
        self.socket.sendall(b"PUB %s _INBOX.smoke %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
        size = int(self.expect(b"MSG").split()[-1])
        return json.loads(self.reader.read(size + 2)[:-2])

    def close(self) -> None:
        self.socket.close()


def http_json(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}
    except OSError:
        return 0, {}


def run_cluster(name: str, conf_text: str, statefulset: dict, stream_replicas: int) -> list[str]:
    problems: list[str] = []
    sts_name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    replicas = statefulset["spec"].get("replicas", 1)
    conf = nats_conf.parse(conf_text)
    max_payload = nats_conf.size_bytes(conf.get("max_payload", 1 << 20))
    folder = Path(tempfile.mkdtemp(prefix="nats-smoke-"))
    servers: list[subprocess.Popen] = []
    try:
        shipped = folder / "nats.conf"
        shipped.write_text(conf_text)
        test = subprocess.run(["nats-server", "-t", "-c", str(shipped)], capture_output=True, text=True,
                              env={**os.environ, "POD_NAME": f"{sts_name}-0"})
        if test.returncode != 0:
            return [f"{name}: nats-server -t refuses nats.conf: {(test.stderr or test.stdout).strip()}"]
        ports = [dict(zip(("client", "cluster", "http"), free_ports(3))) for _ in range(replicas)]
        for node in range(replicas):
            node_folder = folder / f"{sts_name}-{node}"
            node_folder.mkdir()
            path = node_folder / "nats.conf"
            path.write_text(loopback_conf(conf_text, sts_name, service, node, ports, node_folder))
            servers.append(subprocess.Popen(["nats-server", "-c", str(path)],
                                            env={**os.environ, "POD_NAME": f"{sts_name}-{node}"},
                                            stdout=open(node_folder / "log", "w"), stderr=subprocess.STDOUT))
        problems += check_cluster(name, ports, replicas, max_payload, stream_replicas, servers)
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        problems.append(f"{name}: {error}")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
        if problems:
            for log in sorted(folder.glob("*/log")):
                tail = log.read_text().splitlines()[-5:]
                problems.append(f"{name}: {log.parent.name} log ends:\n    " + "\n    ".join(tail))
        shutil.rmtree(folder, ignore_errors=True)
    return problems


def check_cluster(name: str, ports: list[dict], replicas: int, max_payload: int, stream_replicas: int,
                  servers: list[subprocess.Popen]) -> list[str]:
    started = time.monotonic()
    while time.monotonic() - started < START_SECONDS:
        if all(http_json(p["http"], "/healthz")[0] == 200 for p in ports):
            break
        time.sleep(0.25)
    else:
        return [f"{name}: /healthz not ok on every server after {START_SECONDS} s"]
    seconds = time.monotonic() - started
    meta = http_json(ports[0]["http"], "/jsz")[1].get("meta_cluster") or {}
    if replicas > 1 and meta.get("cluster_size") != replicas:
        return [f"{name}: the JetStream meta group has {meta.get('cluster_size')} peers, want {replicas}"]
    client = Client(ports[-1]["client"])
    stream = {"name": "LATHE", "subjects": ["lathe.log.>", "lathe.part.>"], "max_msgs_per_subject": 1,
              "storage": "file", "num_replicas": stream_replicas, "allow_direct": True}
    created = client.request("$JS.API.STREAM.CREATE.LATHE", json.dumps(stream).encode())
    if "error" in created:
        return [f"{name}: creating Lathe's stream (R{stream_replicas}) failed: {created['error']}"]
    problems = []
    for _ in range(2):
        ack = client.request("lathe.log.smoke", b"v" * (max_payload - ENVELOPE_BYTES))
        if "seq" not in ack:
            problems.append(f"{name}: a message of max_payload less the envelope was not stored: {ack}")
    state = client.request("$JS.API.STREAM.INFO.LATHE", b"").get("state") or {}
    if state.get("messages") != 1:
        problems.append(f"{name}: the stream holds {state.get('messages')} messages of one subject, want 1")
    oversized = Client(ports[0]["client"])
    try:
        oversized.request("lathe.log.too-large", b"v" * (max_payload + 1))
        problems.append(f"{name}: a message over max_payload ({max_payload}) was taken")
    except ConnectionError:
        pass
    client.close()
    after_loss = ""
    if replicas >= 3:
        servers[0].terminate()
        servers[0].wait(timeout=30)
        stored = write_with_retries(ports[-1]["client"])
        if stored is None:
            problems.append(f"{name}: with one of {replicas} servers stopped, no write was stored "
                            f"within {START_SECONDS} s")
        after_loss = f", a write stored {stored:.1f} s after one server stopped" if stored is not None else ""
    if not problems:
        print(f"{name}: {replicas} servers formed a JetStream cluster in {seconds:.1f} s; R{stream_replicas} "
              f"stream, {max_payload - ENVELOPE_BYTES}-byte message stored, {max_payload + 1} refused"
              + after_loss)
    return problems


def write_with_retries(port: int) -> float | None:
    """Seconds until a write is stored, or None. A write during the stream's leader election gets no
    answer (Lathe then answers UNAVAILABLE after publish_timeout_ms); this retries like a client."""
    started = time.monotonic()
    while time.monotonic() - started < START_SECONDS:
        client = None
        try:
            client = Client(port, timeout=2)
            if "seq" in client.request("lathe.log.after-loss", b"still here"):
                return time.monotonic() - started
        except OSError:
            time.sleep(0.25)
        finally:
            if client is not None:
                client.close()
    return None


def stream_replicas_of(documents: list[dict]) -> int:
    for document in documents:
        if document["kind"] != "StatefulSet":
            continue
        for container in document["spec"]["template"]["spec"]["containers"]:
            for variable in container.get("env") or []:
                if variable["name"] == "LATHE_REPLICATION__STREAM_REPLICAS" and "value" in variable:
                    return int(variable["value"])
    return 1


def main(paths: list[str]) -> int:
    if shutil.which("nats-server") is None:
        print("nats-server is not installed", file=sys.stderr)
        return 2
    version = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
    problems, clusters = [], 0
    for path in map(Path, paths):
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        confs = {d["metadata"]["name"]: d["data"]["nats.conf"] for d in documents
                 if d["kind"] == "ConfigMap" and "nats.conf" in (d.get("data") or {})}
        for statefulset in (d for d in documents if d["kind"] == "StatefulSet"):
            pod = statefulset["spec"]["template"]["spec"]
            if not any(c["name"] == "nats" for c in pod["containers"]):
                continue
            configmap = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
            clusters += 1
            problems += run_cluster(f"{path.name} statefulset/{statefulset['metadata']['name']}",
                                    confs[configmap], statefulset, stream_replicas_of(documents))
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    summary = f"nats: {clusters} rendered clusters run with {version}"
    print(summary + (f", {len(problems)} problems" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
