#!/usr/bin/env python3
"""Checks rendered Lathe manifests against the server's configuration (run by deploy/validate.sh).

    check_manifests.py DEFAULT_TOML RENDERED.yaml... [--toml EXTRA.toml...]

Catches config rot that a schema cannot see:
  * every lathe.toml (each ConfigMap's, and each --toml file) has only keys that deploy/lathe.toml
    (the server's documented defaults) has, with values of the same TOML type;
  * every LATHE_<SECTION>__<KEY> variable names such a key (the server reads each LATHE_* variable
    as a key and refuses to start on an unknown one), and enableServiceLinks is off (Kubernetes
    would inject LATHE_SERVICE_HOST and friends for the Service named lathe);
  * the StatefulSet agrees with the effective config: the gRPC port of server.listen is the
    container port `grpc`; the probes' port is that port, or with TLS on (the kubelet's gRPC
    probe cannot speak TLS) the plaintext port of server.health_listen, which must then be set and
    be the container port `health`; storage.data_dir is the data volume's mount,
    terminationGracePeriodSeconds covers the preStop sleep plus server.drain_timeout_ms, the
    liveness probe asks for "" and readiness for lathe.v1.Lathe;
  * the mounted ConfigMap exists in the render, and every Service and PodDisruptionBudget selects
    the pods of a StatefulSet of the render, every Service targeting a named container port;
  * replicated mode ([replication], deploy/README.md): a Lathe StatefulSet with more than one
    replica has replication.nats_url set (else each pod holds only the writes it took); when the
    URL names NATS servers of the render, they exist, on the client port, stream_replicas (1..=5)
    is at most the NATS replicas and max_message_bytes at most max_payload; the startup probe
    leaves a bootstrap room; a rendered NATS cluster is used by some Lathe StatefulSet;
  * every NATS StatefulSet (container `nats`) agrees with its nats.conf (nats_conf.py reads it):
    an odd number of servers started in Parallel, one cluster route per pod through the headless
    Service (which publishes not-ready pods), server_name from the pod name, container ports
    nats/cluster/monitor as configured, /healthz probes on the monitor port, JetStream's store on a
    volumeClaimTemplate with max_file_store below its request, max_payload at most 64 MB, a grace
    period covering lame-duck mode, and a PodDisruptionBudget that keeps a majority up; a
    NetworkPolicy on NATS pods lets in the Lathe pods that use them and the routes between them;
  * a HorizontalPodAutoscaler scales a StatefulSet of the render that leaves replicas to it, whose
    containers request the resource it targets, and a Lathe one only in replicated mode.
Prints a notice for each planned key (metrics, TLS, API keys) that the server now has, so the
commented-out lines in the manifests get switched on. Exit status 1 on any failure.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

import nats_conf

# Keys the manifests prepare for but cannot set until the server has them.
PLANNED_KEYS = ["auth.api_keys_file"]
HEALTH_SERVICE = "lathe.v1.Lathe"
DATA_MOUNT = "/var/lib/lathe"
CONFIG_MOUNT = "/etc/lathe/lathe.toml"
NATS_URL_VARIABLE = "LATHE_REPLICATION__NATS_URL"
# Room the startup probe must leave a replicated pod to bootstrap from the stream (NOT_SERVING
# until it has caught up): the time to apply a corpus of 100k sections is minutes, not seconds.
MIN_BOOTSTRAP_SECONDS = 1800
NATS_MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024
NATS_DEFAULT_MAX_PAYLOAD = 1024 * 1024
# NATS defaults when nats.conf does not set them.
NATS_DEFAULT_LAME_DUCK_SECONDS = 120.0
NATS_DEFAULT_LAME_DUCK_GRACE_SECONDS = 10.0

failures: list[str] = []


@dataclass
class NatsCluster:
    """A NATS StatefulSet of the render, as Lathe's replication settings see it."""
    name: str
    service: str  # the headless Service: pods are <name>-<i>.<service>
    replicas: int
    client_port: int
    max_payload: int
    cluster_port: int | None = None
    labels: dict = field(default_factory=dict)  # of its pods
    client_services: list[str] = field(default_factory=list)


def fail(where: str, message: str) -> None:
    failures.append(f"{where}: {message}")


def toml_type(value: Any) -> str:
    # bool before int: bool is an int in Python.
    for python_type, name in ((bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"),
                              (list, "array"), (dict, "table")):
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def check_keys(where: str, config: dict, defaults: dict) -> None:
    for section, values in config.items():
        if section not in defaults:
            fail(where, f"unknown section [{section}] (not in deploy/lathe.toml)")
            continue
        if not isinstance(values, dict):
            fail(where, f"[{section}] must be a table")
            continue
        for key, value in values.items():
            if key not in defaults[section]:
                fail(where, f"unknown key {section}.{key} (not in deploy/lathe.toml)")
                continue
            want, got = toml_type(defaults[section][key]), toml_type(value)
            # An integer where a float is expected is valid TOML for serde's f32/f64.
            if want != got and not (want == "float" and got == "integer"):
                fail(where, f"{section}.{key} is of type {got}; deploy/lathe.toml has {want}")


def effective(config: dict, defaults: dict, environment: dict[str, str]) -> dict:
    merged = {section: dict(values) for section, values in defaults.items()}
    for section, values in config.items():
        merged.setdefault(section, {}).update(values)
    for name, value in environment.items():
        section, _, key = name.removeprefix("LATHE_").lower().partition("__")
        if section in merged and key in merged[section]:
            merged[section][key] = value
    return merged


def listen_port(listen: str) -> int | None:
    _, _, port = str(listen).rpartition(":")
    return int(port) if port.isdigit() else None


def container_env(container: dict) -> dict[str, str]:
    values = {}
    for variable in container.get("env") or []:
        # valueFrom variables count as set; their value is not known here.
        values[variable["name"]] = str(variable.get("value", ""))
    return values


def check_statefulset(where: str, statefulset: dict, configmaps: dict[str, dict], defaults: dict,
                      clusters: list[NatsCluster], autoscaled: int = 0) -> NatsCluster | None:
    """Checks a Lathe StatefulSet; returns the rendered NATS cluster it replicates through."""
    pod = statefulset["spec"]["template"]
    spec = pod["spec"]
    containers = [c for c in spec["containers"] if c["name"] == "lathe"]
    if not containers:
        fail(where, "no container named lathe")
        return None
    container = containers[0]
    name = statefulset["metadata"]["name"]
    where = f"{where} statefulset/{name}"

    # Kubernetes injects LATHE_SERVICE_HOST, LATHE_PORT, ... for a Service named lathe into every
    # pod of the namespace unless service links are off; the server would read them as config
    # keys and refuse to start.
    if spec.get("enableServiceLinks", True) is not False:
        fail(where, "enableServiceLinks must be false (service variables LATHE_* break the config)")

    environment = container_env(container)
    for variable in environment:
        if variable.startswith("LATHE_"):
            section, _, key = variable.removeprefix("LATHE_").lower().partition("__")
            if section not in defaults or key not in defaults[section]:
                fail(where, f"env {variable} names no config key (the server would refuse to start)")

    mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    config_mount = mounts.get(CONFIG_MOUNT)
    if config_mount is None:
        fail(where, f"nothing mounted at {CONFIG_MOUNT}")
        return None
    if container.get("args", [])[:3] != ["serve", "--config", CONFIG_MOUNT]:
        fail(where, f"args must start with serve --config {CONFIG_MOUNT}")
    configmap_name = (volumes.get(config_mount["name"], {}).get("configMap") or {}).get("name")
    if configmap_name not in configmaps:
        fail(where, f"mounts ConfigMap {configmap_name!r}, which the render lacks")
        return None
    config = configmaps[configmap_name]
    merged = effective(config, defaults, environment)

    ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    grpc_port = listen_port(merged["server"]["listen"])
    if ports.get("grpc") != grpc_port:
        fail(where, f"container port grpc is {ports.get('grpc')}, server.listen says {grpc_port}")
    if not str(merged["server"]["listen"]).startswith("0.0.0.0:"):
        fail(where, f"server.listen {merged['server']['listen']} is not reachable from outside the pod")
    tls_on = bool(merged["tls"]["cert_file"]) or bool(merged["tls"]["key_file"])
    health_listen = str(merged["server"].get("health_listen", ""))
    health_port = listen_port(health_listen) if health_listen else None
    if health_listen and ports.get("health") != health_port:
        fail(where, f"container port health is {ports.get('health')}, server.health_listen says {health_port}")
    if tls_on and health_port is None:
        fail(where, "TLS is on but server.health_listen is empty: the kubelet's gRPC probes cannot speak TLS")
    probe_port = health_port if tls_on else grpc_port
    for probe_name, service in (("startupProbe", HEALTH_SERVICE), ("livenessProbe", ""),
                                ("readinessProbe", HEALTH_SERVICE)):
        probe = (container.get(probe_name) or {}).get("grpc")
        if probe is None:
            fail(where, f"{probe_name} must be a gRPC probe")
            continue
        if probe.get("port") != probe_port:
            what = "the plaintext health port (TLS is on)" if tls_on else "the server listens on"
            fail(where, f"{probe_name} probes port {probe.get('port')}, {what} {probe_port}")
        if probe.get("service", "") != service:
            fail(where, f"{probe_name} asks for service {probe.get('service')!r}, want {service!r}")

    if merged["storage"]["data_dir"] != DATA_MOUNT or DATA_MOUNT not in mounts:
        fail(where, f"storage.data_dir {merged['storage']['data_dir']} must be the data volume at {DATA_MOUNT}")
    elif mounts[DATA_MOUNT]["name"] not in {t["metadata"]["name"] for t in statefulset["spec"].get("volumeClaimTemplates") or []}:
        fail(where, f"{DATA_MOUNT} is not a volumeClaimTemplate")

    pre_stop = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    pre_stop_seconds = int(pre_stop[1]) if len(pre_stop) == 2 and pre_stop[0] == "sleep" else 0
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain_seconds = int(merged["server"]["drain_timeout_ms"]) / 1000
    if grace <= pre_stop_seconds + drain_seconds:
        fail(where, f"terminationGracePeriodSeconds {grace} does not cover preStop {pre_stop_seconds}s "
                    f"+ drain {drain_seconds}s")

    from_refs = {v["name"] for v in container.get("env") or [] if "valueFrom" in v}
    return check_replication(where, statefulset, container, merged, from_refs, clusters, autoscaled)


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels(statefulset: dict) -> dict:
    return statefulset["spec"]["template"]["metadata"].get("labels") or {}


def quantity_bytes(quantity: Any) -> int:
    """A Kubernetes quantity (10Gi, 500M, 1e9, 1024) in bytes."""
    text = str(quantity)
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("Pi", 2**50),
                           ("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12), ("P", 10**15)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * factor)
    return int(float(text))


def probe_seconds(probe: dict) -> int:
    """How long a probe lets a container fail before it acts."""
    return (probe.get("initialDelaySeconds", 0)
            + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def check_replication(where: str, statefulset: dict, container: dict, merged: dict,
                      from_refs: set[str], clusters: list[NatsCluster], autoscaled: int = 0) -> NatsCluster | None:
    """Replicated mode of a Lathe StatefulSet (autoscaled: the maxReplicas of a
    HorizontalPodAutoscaler scaling it): returns the rendered NATS cluster it uses."""
    replication = merged.get("replication") or {}
    url = str(replication.get("nats_url", "")).strip()
    replicas = statefulset["spec"].get("replicas", 1)
    if not url and NATS_URL_VARIABLE not in from_refs:
        if max(replicas, autoscaled) > 1:
            count = (f"replicas {replicas}" if replicas >= autoscaled
                     else f"a HorizontalPodAutoscaler up to {autoscaled} replicas")
            fail(where, f"{count} without replication.nats_url: each pod would hold only "
                        "the writes it took (a single node keeps replicas 1; see deploy/README.md)")
        return None
    startup = container.get("startupProbe") or {}
    if probe_seconds(startup) < MIN_BOOTSTRAP_SECONDS:
        fail(where, f"startupProbe allows {probe_seconds(startup)} s; a new replica is NOT_SERVING until "
                    f"it has applied the whole stream: leave at least {MIN_BOOTSTRAP_SECONDS} s")
    stream_replicas = int(replication.get("stream_replicas", 1))
    if not 1 <= stream_replicas <= 5:
        fail(where, f"replication.stream_replicas {stream_replicas} is not in 1..=5 (JetStream's range)")
    if not url:
        return None  # From a Secret or the like: nothing more to check here.
    used = set()
    for server in (s.strip() for s in url.split(",")):
        cluster = nats_server_of(where, server, clusters)
        if cluster is not None:
            used.add(cluster.name)
    if len(used) > 1:
        fail(where, f"replication.nats_url names servers of several NATS clusters: {sorted(used)}")
    cluster = next((c for c in clusters if c.name in used), None)
    if cluster is None:
        return None  # An external NATS: nothing of it in the render to check against.
    if stream_replicas > cluster.replicas:
        fail(where, f"replication.stream_replicas {stream_replicas} is more than the {cluster.replicas} "
                    f"servers of statefulset/{cluster.name}: JetStream cannot place the stream")
    message_bytes = int(replication.get("max_message_bytes", 0))
    if message_bytes > cluster.max_payload:
        fail(where, f"replication.max_message_bytes {message_bytes} is over the max_payload "
                    f"{cluster.max_payload} of statefulset/{cluster.name}: NATS would refuse the messages")
    return cluster


def nats_server_of(where: str, server: str, clusters: list[NatsCluster]) -> NatsCluster | None:
    """The rendered NATS cluster a server of replication.nats_url is part of (None: external)."""
    parts = urlsplit(server)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        fail(where, f"replication.nats_url: {server!r} is not nats://HOST[:PORT]")
        return None
    host, port = parts.hostname, parts.port or 4222
    for cluster in clusters:
        names = [f"{cluster.name}-{i}.{cluster.service}" for i in range(cluster.replicas)]
        names += cluster.client_services
        if any(host == n or host.startswith(n + ".") for n in names):
            if port != cluster.client_port:
                fail(where, f"replication.nats_url: {server} uses port {port}; statefulset/"
                            f"{cluster.name} takes clients on {cluster.client_port}")
            return cluster
        pod = re.fullmatch(rf"{re.escape(cluster.name)}-(\d+)\.{re.escape(cluster.service)}(\..*)?", host)
        if pod:
            fail(where, f"replication.nats_url: {server} names pod {cluster.name}-{pod.group(1)}, but "
                        f"statefulset/{cluster.name} has {cluster.replicas} replicas")
            return cluster
    if clusters:
        fail(where, f"replication.nats_url: {server} is none of the render's NATS servers "
                    f"({', '.join(c.name for c in clusters)})")
    return None


def nats_conf_of(where: str, container: dict, volumes: dict, nats_confs: dict) -> dict | None:
    """The parsed nats.conf a NATS container runs with (--config PATH, from a mounted ConfigMap)."""
    command = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    path = next((command[i + 1] for i, a in enumerate(command[:-1]) if a in ("--config", "-c")), None)
    if path is None:
        fail(where, "the nats container runs without --config")
        return None
    for mount in container.get("volumeMounts") or []:
        directory = mount["mountPath"].rstrip("/") + "/"
        if path == mount["mountPath"] or path.startswith(directory):
            key = mount.get("subPath") or path.removeprefix(directory)
            name = (volumes.get(mount["name"], {}).get("configMap") or {}).get("name")
            if (name, key) in nats_confs:
                return nats_confs[(name, key)]
            fail(where, f"--config {path} is {key!r} of ConfigMap {name!r}, which the render lacks")
            return None
    fail(where, f"--config {path} is not mounted")
    return None


def check_nats_statefulset(where: str, statefulset: dict, nats_confs: dict,
                           services: list[dict]) -> NatsCluster | None:
    spec = statefulset["spec"]
    pod = spec["template"]["spec"]
    name = statefulset["metadata"]["name"]
    where = f"{where} statefulset/{name}"
    container = next(c for c in pod["containers"] if c["name"] == "nats")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    conf = nats_conf_of(where, container, volumes, nats_confs)
    if conf is None:
        return None
    replicas = spec.get("replicas", 1)
    if replicas % 2 == 0:
        fail(where, f"replicas {replicas}: a JetStream cluster needs a majority, so an even count "
                    "survives no more failures than one server fewer")
    if replicas > 1 and spec.get("podManagementPolicy") != "Parallel":
        fail(where, "podManagementPolicy must be Parallel: a server is ready only once JetStream has a "
                    "leader, which needs a majority running, so OrderedReady never starts the second")
    environment = {v["name"]: v for v in container.get("env") or []}
    pod_name = ((environment.get("POD_NAME") or {}).get("valueFrom") or {}).get("fieldRef") or {}
    if conf.get("server_name") != "$POD_NAME" or pod_name.get("fieldPath") != "metadata.name":
        fail(where, "server_name must be $POD_NAME, with POD_NAME from metadata.name: JetStream names "
                    "its peers by it, so it must be unique and survive restarts")
    service = check_nats_network(where, statefulset, container, conf, services)
    check_nats_storage(where, statefulset, container, conf)
    check_nats_shutdown(where, pod, container, conf)
    client_services = [s["metadata"]["name"] for s in services
                       if selects(s["spec"].get("selector") or {}, pod_labels(statefulset))]
    max_payload = nats_conf.size_bytes(conf.get("max_payload", NATS_DEFAULT_MAX_PAYLOAD))
    if max_payload > NATS_MAX_PAYLOAD_LIMIT:
        fail(where, f"max_payload {conf.get('max_payload')} is over NATS's limit of 64 MB")
    return NatsCluster(name=name, service=service, replicas=replicas,
                       client_port=conf.get("port", 4222), max_payload=max_payload,
                       cluster_port=(conf.get("cluster") or {}).get("port"), labels=pod_labels(statefulset),
                       client_services=client_services)


def check_nats_network(where: str, statefulset: dict, container: dict, conf: dict,
                       services: list[dict]) -> str:
    """Ports, probes, cluster routes and the headless Service of a NATS StatefulSet."""
    name, replicas = statefulset["metadata"]["name"], statefulset["spec"].get("replicas", 1)
    service_name = statefulset["spec"].get("serviceName", "")
    cluster = conf.get("cluster") or {}
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    for port_name, configured in (("nats", conf.get("port", 4222)), ("monitor", conf.get("http_port")),
                                  ("cluster", cluster.get("port"))):
        if configured is not None and ports.get(port_name) != configured:
            fail(where, f"container port {port_name} is {ports.get(port_name)}, nats.conf says {configured}")
    if conf.get("http_port") is None:
        fail(where, "nats.conf sets no http_port: the probes need /healthz")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = (container.get(probe_name) or {}).get("httpGet") or {}
        if probe.get("port") not in ("monitor", conf.get("http_port")) or \
                not str(probe.get("path", "")).startswith("/healthz"):
            fail(where, f"{probe_name} must GET /healthz on the monitor port")
    if replicas > 1:
        routes = sorted(str(r) for r in cluster.get("routes") or [])
        want = sorted(f"nats://{name}-{i}.{service_name}:{cluster.get('port')}" for i in range(replicas))
        if routes != want:
            fail(where, f"cluster.routes {routes} must be one per pod: {want}")
        if not cluster.get("name"):
            fail(where, "nats.conf cluster has no name")
    headless = next((s for s in services if s["metadata"]["name"] == service_name), None)
    if headless is None:
        fail(where, f"serviceName {service_name!r} is not a Service of the render")
    elif headless["spec"].get("clusterIP") != "None" or not headless["spec"].get("publishNotReadyAddresses"):
        fail(where, f"service/{service_name} must be headless and publish not-ready pods: the servers "
                    "route to each other before any of them is ready")
    return service_name


def check_nats_storage(where: str, statefulset: dict, container: dict, conf: dict) -> None:
    jetstream = conf.get("jetstream")
    if not isinstance(jetstream, dict):
        fail(where, "nats.conf has no jetstream block: the write log needs JetStream")
        return
    store_dir = str(jetstream.get("store_dir", ""))
    claims = {t["metadata"]["name"]: t for t in statefulset["spec"].get("volumeClaimTemplates") or []}
    mount = next((m for m in container.get("volumeMounts") or []
                  if store_dir == m["mountPath"] or store_dir.startswith(m["mountPath"].rstrip("/") + "/")),
                 None)
    if mount is None or mount["name"] not in claims:
        fail(where, f"jetstream.store_dir {store_dir!r} is not on a volumeClaimTemplate")
        return
    request = claims[mount["name"]]["spec"]["resources"]["requests"]["storage"]
    if "max_file_store" not in jetstream:
        fail(where, f"jetstream.max_file_store is unset: JetStream would size it from the disk, not the "
                    f"{request} claim")
    elif nats_conf.size_bytes(jetstream["max_file_store"]) >= quantity_bytes(request):
        fail(where, f"jetstream.max_file_store {jetstream['max_file_store']} does not fit the {request} claim")


def check_nats_shutdown(where: str, pod: dict, container: dict, conf: dict) -> None:
    """Lame-duck mode on preStop, and a grace period that lets it finish."""
    pid_file = str(conf.get("pid_file", ""))
    pre_stop = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    if not pid_file or not any(str(a).endswith(f"ldm={pid_file}") for a in pre_stop):
        fail(where, "preStop must signal lame-duck mode (nats-server --signal ldm=<pid_file>)")
    elif not any(pid_file.startswith(m["mountPath"].rstrip("/") + "/") for m in container.get("volumeMounts") or []):
        fail(where, f"pid_file {pid_file} is not on a mounted volume (the root file system is read-only)")
    lame_duck = nats_conf.duration_seconds(conf.get("lame_duck_duration", NATS_DEFAULT_LAME_DUCK_SECONDS))
    grace_period = nats_conf.duration_seconds(conf.get("lame_duck_grace_period",
                                                       NATS_DEFAULT_LAME_DUCK_GRACE_SECONDS))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= lame_duck + grace_period:
        fail(where, f"terminationGracePeriodSeconds {grace} does not cover lame-duck mode "
                    f"({grace_period:g} s + {lame_duck:g} s)")


def admits(policy: dict, labels: dict, ports: set) -> bool:
    """Whether a NetworkPolicy's ingress rules let pods with these labels (same namespace) reach
    one of these ports (names or numbers)."""
    for rule in policy["spec"].get("ingress") or []:
        peers = rule.get("from")
        peer_ok = not peers or any(
            "podSelector" in peer and "namespaceSelector" not in peer and "ipBlock" not in peer
            and all(labels.get(k) == v for k, v in (peer["podSelector"].get("matchLabels") or {}).items())
            for peer in peers)
        rule_ports = rule.get("ports")
        if peer_ok and (not rule_ports or any(p.get("port") in ports for p in rule_ports)):
            return True
    return False


def check_network_policies(where: str, policies: list[dict], users: list[tuple[dict, NatsCluster]]) -> None:
    """NetworkPolicies on NATS pods must let the Lathe pods that use them, and the servers' routes, in."""
    for lathe, cluster in users:
        for policy in policies:
            selector = (policy["spec"].get("podSelector") or {}).get("matchLabels") or {}
            types = policy["spec"].get("policyTypes") or ["Ingress"]
            if "Ingress" not in types or not all(cluster.labels.get(k) == v for k, v in selector.items()):
                continue
            name = policy["metadata"]["name"]
            if not admits(policy, pod_labels(lathe), {"nats", cluster.client_port}):
                fail(where, f"networkpolicy/{name} keeps the pods of statefulset/{lathe['metadata']['name']} "
                            f"from the client port of statefulset/{cluster.name}")
            if cluster.replicas > 1 and not admits(policy, cluster.labels, {"cluster", cluster.cluster_port}):
                fail(where, f"networkpolicy/{name} blocks the cluster routes between the servers of "
                            f"statefulset/{cluster.name}")


def check_services(where: str, services: list[dict], statefulsets: list[dict]) -> None:
    for service in services:
        name = service["metadata"]["name"]
        selector = service["spec"].get("selector") or {}
        selected = [s for s in statefulsets if selects(selector, pod_labels(s))]
        if not selected:
            fail(where, f"service/{name} selector {selector} selects the pods of no StatefulSet")
            continue
        named_ports = {p.get("name") for s in selected for c in s["spec"]["template"]["spec"]["containers"]
                       for p in c.get("ports") or []}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str) and target not in named_ports:
                fail(where, f"service/{name} targets port {target!r}, which the containers lack")


def check_disruption_budgets(where: str, budgets: list[dict], statefulsets: list[dict],
                             nats_names: set[str]) -> None:
    covered = set()
    for budget in budgets:
        name = budget["metadata"]["name"]
        selector = (budget["spec"].get("selector") or {}).get("matchLabels") or {}
        selected = [s for s in statefulsets if selects(selector, pod_labels(s))]
        if not selected:
            fail(where, f"poddisruptionbudget/{name} selects the pods of no StatefulSet")
        for statefulset in selected:
            sts_name, replicas = statefulset["metadata"]["name"], statefulset["spec"].get("replicas", 1)
            covered.add(sts_name)
            unavailable = budget["spec"].get("maxUnavailable")
            majority_spare = (replicas - 1) // 2
            if sts_name in nats_names and replicas > 1 and \
                    (not isinstance(unavailable, int) or unavailable > majority_spare):
                fail(where, f"poddisruptionbudget/{name} must set maxUnavailable to at most {majority_spare} "
                            f"for the {replicas} NATS servers of statefulset/{sts_name} (a majority stays up)")
    for missing in sorted(nats_names - covered):
        fail(where, f"statefulset/{missing} (NATS) has no PodDisruptionBudget: a drain could take down "
                    "the majority JetStream needs")


def check_autoscalers(where: str, autoscalers: list[dict], statefulsets: list[dict]) -> dict[str, int]:
    """Each HorizontalPodAutoscaler scales a StatefulSet of the render, which leaves its replicas
    to it; returns the maxReplicas of each StatefulSet scaled."""
    by_name = {s["metadata"]["name"]: s for s in statefulsets}
    scaled: dict[str, int] = {}
    for autoscaler in autoscalers:
        name, spec = autoscaler["metadata"]["name"], autoscaler["spec"]
        at = f"{where} horizontalpodautoscaler/{name}"
        target = spec["scaleTargetRef"]
        statefulset = by_name.get(target["name"]) if target.get("kind") == "StatefulSet" else None
        if statefulset is None:
            fail(at, f"scales {target.get('kind')}/{target['name']}, which the render lacks")
            continue
        scaled[target["name"]] = spec["maxReplicas"]
        if spec.get("minReplicas", 1) > spec["maxReplicas"]:
            fail(at, f"minReplicas {spec['minReplicas']} is above maxReplicas {spec['maxReplicas']}")
        if "replicas" in statefulset["spec"]:
            fail(at, f"statefulset/{target['name']} sets replicas: each apply would undo the autoscaler's count")
        resources = {m["resource"]["name"] for m in spec.get("metrics", []) if m.get("type") == "Resource"}
        for container in statefulset["spec"]["template"]["spec"]["containers"]:
            for resource in sorted(resources):
                if resource not in ((container.get("resources") or {}).get("requests") or {}):
                    fail(at, f"targets {resource} utilization, and container {container['name']} requests no {resource}")
    return scaled


def load_configs(path: Path, documents: list[dict], defaults: dict) -> tuple[dict, dict]:
    """The render's lathe.toml files (by ConfigMap name) and nats.conf files (by ConfigMap, key)."""
    configmaps: dict[str, dict] = {}
    nats_confs: dict[tuple[str, str], dict] = {}
    for document in documents:
        if document["kind"] != "ConfigMap":
            continue
        name, data = document["metadata"]["name"], document.get("data") or {}
        where = f"{path.name} configmap/{name}"
        for key, text in data.items():
            if key.endswith(".conf") and "nats" in key:
                try:
                    nats_confs[(name, key)] = nats_conf.parse(text)
                except ValueError as error:
                    fail(where, f"{key} is not a nats.conf this check reads: {error}")
        if "lathe.toml" not in data:
            continue
        try:
            config = tomllib.loads(data["lathe.toml"])
        except tomllib.TOMLDecodeError as error:
            fail(where, f"lathe.toml is not TOML: {error}")
            continue
        check_keys(where, config, defaults)
        configmaps[name] = config
    return configmaps, nats_confs


def check_render(path: Path, defaults: dict) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    configmaps, nats_confs = load_configs(path, documents, defaults)
    services = [d for d in documents if d["kind"] == "Service"]
    statefulsets = [d for d in documents if d["kind"] == "StatefulSet"]
    budgets = [d for d in documents if d["kind"] == "PodDisruptionBudget"]

    def has_container(statefulset: dict, name: str) -> bool:
        return any(c["name"] == name for c in statefulset["spec"]["template"]["spec"]["containers"])

    nats_sets = [s for s in statefulsets if has_container(s, "nats")]
    lathe_sets = [s for s in statefulsets if s not in nats_sets]
    if not lathe_sets:
        fail(path.name, "no Lathe StatefulSet")
    clusters = [c for c in (check_nats_statefulset(path.name, s, nats_confs, services) for s in nats_sets) if c]
    autoscaled = check_autoscalers(path.name, [d for d in documents if d["kind"] == "HorizontalPodAutoscaler"],
                                   statefulsets)
    users = [(s, c) for s in lathe_sets
             if (c := check_statefulset(path.name, s, configmaps, defaults, clusters,
                                        autoscaled.get(s["metadata"]["name"], 0))) is not None]
    used = {c.name for _, c in users}
    for cluster in clusters:
        if cluster.name not in used:
            fail(path.name, f"statefulset/{cluster.name} (NATS) is rendered, but no Lathe StatefulSet's "
                            "replication.nats_url names it")
    check_services(path.name, services, statefulsets)
    check_disruption_budgets(path.name, budgets, statefulsets, {s["metadata"]["name"] for s in nats_sets})
    check_network_policies(path.name, [d for d in documents if d["kind"] == "NetworkPolicy"], users)


def main(arguments: list[str]) -> int:
    if len(arguments) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    defaults_path = Path(arguments[0])
    defaults = tomllib.loads(defaults_path.read_text())
    renders, tomls = [], []
    target = renders
    for argument in arguments[1:]:
        if argument == "--toml":
            target = tomls
            continue
        target.append(Path(argument))
    for path in tomls:
        try:
            check_keys(str(path), tomllib.loads(path.read_text()), defaults)
        except tomllib.TOMLDecodeError as error:
            fail(str(path), f"not TOML: {error}")
    for path in renders:
        check_render(path, defaults)
    for planned in PLANNED_KEYS:
        section, _, key = planned.partition(".")
        if key in defaults.get(section, {}):
            print(f"NOTICE: the server now has {planned}: switch on the commented-out lines in "
                  "deploy/k8s and the chart's values, and update deploy/README.md")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    checked = len(renders) + len(tomls)
    if failures:
        print(f"manifests: {len(failures)} problems in {checked} files", file=sys.stderr)
        return 1
    print(f"manifests: {checked} files agree with {defaults_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
