#!/usr/bin/env python3
"""Shows that check_manifests.py's replication, NATS and autoscaler checks catch what they claim to.

    test_check_manifests.py DEFAULT_TOML RENDERED_DIR     (run by deploy/validate.sh)

Each case takes a render that passes (the replicated overlay, the chart with an external NATS),
breaks one thing the way a careless edit would, and expects check_manifests to name it.
"""

from __future__ import annotations

import copy
import io
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path
from typing import Callable

import yaml

import check_manifests

DEFAULTS: dict = {}
RENDERED = Path()
_PARSED: dict[str, list[dict]] = {}


def find(documents: list[dict], kind: str, name: str) -> dict:
    return next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)


def lathe_container(documents: list[dict]) -> dict:
    return find(documents, "StatefulSet", "lathe")["spec"]["template"]["spec"]["containers"][0]


def nats_statefulset(documents: list[dict]) -> dict:
    return find(documents, "StatefulSet", "nats")


def set_env(documents: list[dict], name: str, value: str | None) -> None:
    container = lathe_container(documents)
    env = [v for v in container["env"] if v["name"] != name]
    if value is not None:
        env.append({"name": name, "value": value})
    container["env"] = env


def edit_nats_conf(old: str, new: str) -> Callable[[list[dict]], None]:
    def edit(documents: list[dict]) -> None:
        configmap = next(d for d in documents if d["kind"] == "ConfigMap" and "nats.conf" in d.get("data", {}))
        assert old in configmap["data"]["nats.conf"], old
        configmap["data"]["nats.conf"] = configmap["data"]["nats.conf"].replace(old, new)
    return edit


class ReplicationChecks(unittest.TestCase):
    render = "kustomize-overlays-replicated.yaml"

    def failures(self, edit: Callable[[list[dict]], None] | None = None, render: str | None = None) -> list[str]:
        source = RENDERED / (render or self.render)
        if source.name not in _PARSED:
            _PARSED[source.name] = [d for d in yaml.safe_load_all(source.read_text()) if d]
        documents = copy.deepcopy(_PARSED[source.name])
        if edit is not None:
            edit(documents)
        check_manifests.failures.clear()
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / source.name
            path.write_text(yaml.dump_all(documents, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
            check_manifests.check_render(path, DEFAULTS)
        found = list(check_manifests.failures)
        check_manifests.failures.clear()
        return found

    def assert_caught(self, edit: Callable[[list[dict]], None], expected: str, render: str | None = None) -> None:
        found = self.failures(edit, render)
        self.assertTrue(any(expected in f for f in found), f"expected {expected!r} among {found}")

    def test_the_renders_pass_as_they_are(self) -> None:
        for render in (self.render, "helm-all-features.yaml", "helm-external-nats.yaml"):
            self.assertEqual(self.failures(render=render), [], render)

    def test_replicas_without_a_nats_url(self) -> None:
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__NATS_URL", None), "without replication.nats_url")
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__NATS_URL", None),
                           "without replication.nats_url", "helm-external-nats.yaml")

    def test_nats_rendered_but_unused(self) -> None:
        def single_node(documents: list[dict]) -> None:
            set_env(documents, "LATHE_REPLICATION__NATS_URL", None)
            find(documents, "StatefulSet", "lathe")["spec"]["replicas"] = 1
        self.assert_caught(single_node, "no Lathe StatefulSet's replication.nats_url names it")

    def test_stream_replicas_over_the_nats_servers(self) -> None:
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__STREAM_REPLICAS", "5"), "more than the 3 servers")
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__STREAM_REPLICAS", "7"), "not in 1..=5")

    def test_nats_url_naming_what_the_render_lacks(self) -> None:
        url = "LATHE_REPLICATION__NATS_URL"
        beyond = "nats://nats-0.nats-headless:4222,nats://nats-3.nats-headless:4222"
        self.assert_caught(lambda d: set_env(d, url, beyond), "names pod nats-3")
        self.assert_caught(lambda d: set_env(d, url, "nats://nats-0.nats-headless:4223"), "uses port 4223")
        self.assert_caught(lambda d: set_env(d, url, "nats://elsewhere:4222"), "none of the render's NATS servers")
        self.assert_caught(lambda d: set_env(d, url, "http://nats:8222"), "is not nats://HOST[:PORT]")

    def test_message_size_over_max_payload(self) -> None:
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__MAX_MESSAGE_BYTES", str(16 << 20)),
                           "over the max_payload")

    def test_startup_probe_too_short_to_bootstrap(self) -> None:
        def short(documents: list[dict]) -> None:
            lathe_container(documents)["startupProbe"]["failureThreshold"] = 60
        self.assert_caught(short, "startupProbe allows 600 s")

    def test_nats_cluster_shape(self) -> None:
        def replicas(count: int) -> Callable[[list[dict]], None]:
            return lambda d: nats_statefulset(d)["spec"].__setitem__("replicas", count)
        self.assert_caught(replicas(4), "an even count")
        self.assert_caught(replicas(5), "cluster.routes")
        self.assert_caught(lambda d: nats_statefulset(d)["spec"].__setitem__("podManagementPolicy", "OrderedReady"),
                           "podManagementPolicy must be Parallel")
        self.assert_caught(lambda d: find(d, "Service", "nats-headless")["spec"].pop("publishNotReadyAddresses"),
                           "publish not-ready pods")
        self.assert_caught(edit_nats_conf("server_name: $POD_NAME", "server_name: nats"), "server_name must be")
        self.assert_caught(edit_nats_conf("http_port: 8222", "http_port: 8223"), "container port monitor")

    def test_nats_storage_and_limits(self) -> None:
        self.assert_caught(edit_nats_conf("max_file_store: 9GB", "max_file_store: 11GB"), "does not fit the 10Gi")
        self.assert_caught(edit_nats_conf("store_dir: /data", "store_dir: /tmp/js"), "not on a volumeClaimTemplate")
        self.assert_caught(edit_nats_conf("max_payload: 8MB", "max_payload: 65MB"), "over NATS's limit")
        self.assert_caught(edit_nats_conf("jetstream {", "jetstream {\n  bad { "), "not a nats.conf")

    def test_nats_shutdown_and_disruptions(self) -> None:
        def grace(documents: list[dict]) -> None:
            nats_statefulset(documents)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
        self.assert_caught(grace, "does not cover lame-duck mode")
        self.assert_caught(lambda d: d.remove(find(d, "PodDisruptionBudget", "nats")), "has no PodDisruptionBudget")
        self.assert_caught(lambda d: find(d, "PodDisruptionBudget", "nats")["spec"].__setitem__("maxUnavailable", 2),
                           "maxUnavailable to at most 1")

    def test_network_policy_that_shuts_lathe_out(self) -> None:
        # What the labels transformer of deploy/k8s/nats did to the policy's Lathe selector.
        def relabel(documents: list[dict]) -> None:
            rules = find(documents, "NetworkPolicy", "nats")["spec"]["ingress"]
            rules[1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] = "nats"
        self.assert_caught(relabel, "keeps the pods of statefulset/lathe from the client port")

        def routes(documents: list[dict]) -> None:
            find(documents, "NetworkPolicy", "nats")["spec"]["ingress"][0]["ports"] = [{"port": "nats"}]
        self.assert_caught(routes, "blocks the cluster routes")

    def test_autoscaler(self) -> None:
        render = "helm-all-features.yaml"
        self.assert_caught(lambda d: set_env(d, "LATHE_REPLICATION__NATS_URL", None),
                           "a HorizontalPodAutoscaler up to 6 replicas without replication.nats_url", render)
        self.assert_caught(lambda d: find(d, "StatefulSet", "lathe")["spec"].__setitem__("replicas", 3),
                           "each apply would undo the autoscaler's count", render)
        self.assert_caught(lambda d: find(d, "HorizontalPodAutoscaler", "lathe")["spec"]["scaleTargetRef"]
                           .__setitem__("name", "lathe-server"), "which the render lacks", render)

        def no_cpu_request(documents: list[dict]) -> None:
            del lathe_container(documents)["resources"]["requests"]["cpu"]
        self.assert_caught(no_cpu_request, "requests no cpu", render)


def main(arguments: list[str]) -> int:
    global DEFAULTS, RENDERED
    if len(arguments) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    DEFAULTS = tomllib.loads(Path(arguments[0]).read_text())
    RENDERED = Path(arguments[1])
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ReplicationChecks)
    report = io.StringIO()
    result = unittest.TextTestRunner(stream=report, verbosity=1).run(suite)
    if not result.wasSuccessful():
        print(report.getvalue(), file=sys.stderr)
        return 1
    print(f"check_manifests: {result.testsRun} tests of the replication, NATS and autoscaler checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
