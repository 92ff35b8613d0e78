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
  * the mounted ConfigMap exists in the render, and every Service selects the pods and targets
    a named container port.
Prints a notice for each planned key (metrics, TLS, API keys) that the server now has, so the
commented-out lines in the manifests get switched on. Exit status 1 on any failure.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

# Keys the manifests prepare for but cannot set until the server has them.
PLANNED_KEYS = ["auth.api_keys_file"]
HEALTH_SERVICE = "lathe.v1.Lathe"
DATA_MOUNT = "/var/lib/lathe"
CONFIG_MOUNT = "/etc/lathe/lathe.toml"

failures: list[str] = []


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
                      services: list[dict]) -> None:
    pod = statefulset["spec"]["template"]
    pod_labels = pod["metadata"].get("labels") or {}
    spec = pod["spec"]
    containers = [c for c in spec["containers"] if c["name"] == "lathe"]
    if not containers:
        fail(where, "no container named lathe")
        return
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
        return
    if container.get("args", [])[:3] != ["serve", "--config", CONFIG_MOUNT]:
        fail(where, f"args must start with serve --config {CONFIG_MOUNT}")
    configmap_name = (volumes.get(config_mount["name"], {}).get("configMap") or {}).get("name")
    if configmap_name not in configmaps:
        fail(where, f"mounts ConfigMap {configmap_name!r}, which the render lacks")
        return
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

    named_ports = set(ports)
    for service in services:
        service_name = service["metadata"]["name"]
        selector = service["spec"].get("selector") or {}
        if any(pod_labels.get(k) != v for k, v in selector.items()):
            fail(where, f"service/{service_name} selector {selector} does not select the pods")
        for port in service["spec"]["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str) and target not in named_ports:
                fail(where, f"service/{service_name} targets port {target!r}, which the container lacks")


def check_render(path: Path, defaults: dict) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    configmaps: dict[str, dict] = {}
    for document in documents:
        if document["kind"] != "ConfigMap" or "lathe.toml" not in (document.get("data") or {}):
            continue
        name = document["metadata"]["name"]
        where = f"{path.name} configmap/{name}"
        try:
            config = tomllib.loads(document["data"]["lathe.toml"])
        except tomllib.TOMLDecodeError as error:
            fail(where, f"lathe.toml is not TOML: {error}")
            continue
        check_keys(where, config, defaults)
        configmaps[name] = config
    services = [d for d in documents if d["kind"] == "Service"]
    statefulsets = [d for d in documents if d["kind"] == "StatefulSet"]
    if not statefulsets:
        fail(path.name, "no StatefulSet")
    for statefulset in statefulsets:
        check_statefulset(path.name, statefulset, configmaps, defaults, services)


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
