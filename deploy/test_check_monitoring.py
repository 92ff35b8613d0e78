#!/usr/bin/env python3
"""Shows that check_monitoring.py catches what it claims to.

    test_check_monitoring.py SRC_DIR DASHBOARD.json RENDERED_DIR     (run by deploy/validate.sh)

Each case takes the chart's all-features render (every monitoring object on) and its dashboard,
which pass, breaks one thing the way a careless edit would (a renamed metric, a label it lacks, a
code spelt as tonic's Debug spells it, a panel dropped), and expects check_monitoring to name it.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Callable

import yaml

import check_monitoring

SRC = Path()
DASHBOARD = Path()
RENDERED = Path()
RENDER = "helm-all-features.yaml"


def find(documents: list[dict], kind: str) -> dict:
    return next(d for d in documents if d["kind"] == kind)


def alert(documents: list[dict], name: str) -> dict:
    rule = find(documents, "PrometheusRule")
    return next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == name)


def edit_expr(name: str, old: str, new: str) -> Callable[[list[dict], dict], None]:
    def edit(documents: list[dict], _dashboard: dict) -> None:
        rule = alert(documents, name)
        assert old in rule["expr"], (old, rule["expr"])
        rule["expr"] = rule["expr"].replace(old, new)
    return edit


def panels_reading(dashboard: dict, metric: str) -> list[dict]:
    return [p for p in dashboard["panels"] if any(metric in t.get("expr", "") for t in p.get("targets", []))]


class MonitoringChecks(unittest.TestCase):
    def failures(self, edit: Callable[[list[dict], dict], None] | None = None,
                 src: Path | None = None) -> list[str]:
        documents = [d for d in yaml.safe_load_all((RENDERED / RENDER).read_text()) if d]
        dashboard = json.loads(DASHBOARD.read_text())
        if edit is not None:
            edit(documents, dashboard)
        check_monitoring.failures.clear()
        with tempfile.TemporaryDirectory() as directory:
            render = Path(directory) / RENDER
            render.write_text(yaml.safe_dump_all(copy.deepcopy(documents)))
            dashboard_file = Path(directory) / DASHBOARD.name
            dashboard_file.write_text(json.dumps(dashboard))
            check_monitoring.check(src or SRC, dashboard_file, [render])
        found = list(check_monitoring.failures)
        check_monitoring.failures.clear()
        return found

    def assert_caught(self, edit: Callable[[list[dict], dict], None], expected: str) -> None:
        found = self.failures(edit)
        self.assertTrue(any(expected in f for f in found), f"expected {expected!r} among {found}")

    def test_the_render_and_the_dashboard_pass_as_they_are(self) -> None:
        self.assertEqual(self.failures(), [])

    def test_a_metric_the_server_does_not_export(self) -> None:
        self.assert_caught(edit_expr("LatheCollectionDamaged", "lathe_collection_damaged", "lathe_collection_broken"),
                           "lathe_collection_broken is not a metric the server exports")
        # Counters carry _total; a histogram is read through _bucket.
        self.assert_caught(edit_expr("LatheWritesFailed", "lathe_write_operations_total", "lathe_write_operations"),
                           "lathe_write_operations is not a metric")
        self.assert_caught(edit_expr("LatheSlowRequests", "_seconds_bucket", "_seconds_buckets"),
                           "lathe_request_duration_seconds_buckets is not a metric")

    def test_a_label_the_metric_lacks(self) -> None:
        self.assert_caught(edit_expr("LatheWritesFailed", 'outcome="failed"', 'result="failed"'),
                           "lathe_write_operations_total has no label result")
        self.assert_caught(edit_expr("LatheSlowRequests", "without (instance, pod)", "without (instance, pod, method)"),
                           "groups by method, which none of its metrics has")
        # tonic's Debug spelling, not the label's (src/api/call.rs, code_label).
        self.assert_caught(lambda _d, dashboard: panels_reading(dashboard, 'code!="OK"')[0]["targets"][0].update(
            expr='sum(rate(lathe_requests_total{code!="Ok"}[5m]))'), 'code="Ok" is not a code the server counts')

    def test_an_alert_the_dashboard_does_not_show(self) -> None:
        def drop(_documents: list[dict], dashboard: dict) -> None:
            for panel in panels_reading(dashboard, "lathe_write_queue_oldest_seconds"):
                dashboard["panels"].remove(panel)
        self.assert_caught(drop, "alerts read lathe_write_queue_oldest_seconds, which no panel shows")

    def test_dashboard_variables(self) -> None:
        def unknown(_documents: list[dict], dashboard: dict) -> None:
            target = panels_reading(dashboard, "lathe_requests_in_flight")[0]["targets"][0]
            target["expr"] = target["expr"].replace('job=~"$job"', 'cluster=~"$cluster"')
        found = self.failures(unknown)
        self.assertTrue(any("$cluster is not a variable" in f for f in found), found)
        self.assertTrue(any("has no label cluster" in f for f in found), found)

    def test_rule_structure(self) -> None:
        self.assert_caught(lambda d, _: alert(d, "LatheDown")["labels"].pop("severity"), "labels.severity")
        self.assert_caught(lambda d, _: alert(d, "LatheDown").__setitem__("for", "5 minutes"), "is not a duration")
        self.assert_caught(lambda d, _: alert(d, "LatheDown")["annotations"].pop("summary"), "no summary")

        def repeat(documents: list[dict], _dashboard: dict) -> None:
            group = find(documents, "PrometheusRule")["spec"]["groups"][0]
            group["rules"].append(copy.deepcopy(group["rules"][0]))
        self.assert_caught(repeat, "repeated")

    def test_service_monitor(self) -> None:
        def port(documents: list[dict], _dashboard: dict) -> None:
            find(documents, "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "http-metrics"
        self.assert_caught(port, "has a port named 'http-metrics'")

        def timeout(documents: list[dict], _dashboard: dict) -> None:
            find(documents, "ServiceMonitor")["spec"]["endpoints"][0]["scrapeTimeout"] = "1m"
        self.assert_caught(timeout, "scrapeTimeout is longer than interval")

    def test_shipped_dashboard(self) -> None:
        def stale(documents: list[dict], _dashboard: dict) -> None:
            configmap = next(d for d in documents if d["kind"] == "ConfigMap" and "grafana_dashboard" in
                             (d["metadata"].get("labels") or {}))
            configmap["data"]["lathe.json"] = configmap["data"]["lathe.json"].replace('"Lathe"', '"Lathe (old)"', 1)
        self.assert_caught(stale, "differs from")

    def test_source_reading_out_of_date(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            src = Path(directory) / "src"
            shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("*.md"))
            telemetry = src / "telemetry.rs"
            telemetry.write_text(telemetry.read_text().replace('"requests_total"', '"rpc_requests_total"'))
            found = self.failures(src=src)
        self.assertTrue(any("lathe_requests_total not found" in f for f in found), found)
        self.assertTrue(any("lathe_requests_total is not a metric" in f for f in found), found)


def main(arguments: list[str]) -> int:
    global SRC, DASHBOARD, RENDERED
    if len(arguments) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    SRC, DASHBOARD, RENDERED = Path(arguments[0]), Path(arguments[1]), Path(arguments[2])
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(MonitoringChecks)
    report = io.StringIO()
    result = unittest.TextTestRunner(stream=report, verbosity=1).run(suite)
    if not result.wasSuccessful():
        print(report.getvalue(), file=sys.stderr)
        return 1
    print(f"check_monitoring: {result.testsRun} tests of the monitoring checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
