#!/usr/bin/env python3
"""Checks the chart's monitoring objects against the metrics the server exports (run by
deploy/validate.sh).

    check_monitoring.py SRC_DIR DASHBOARD.json RENDERED.yaml... [--rules-dir DIR]
                        [--core-dir DIR] [--metrics-dump FILE]

A schema cannot tell that an alert reads a metric nobody exports: such an alert never fires, and
a dashboard panel stays empty. So:
  * the server's metrics are read from its source (SRC_DIR, src/): every metric built in a file
    that uses the prometheus crate, with its kind and labels, prefixed lathe_ as the registry of
    src/telemetry.rs prefixes them, and the process_* series of the crate's process collector.
    With --metrics-dump (a /metrics scrape of a server that has served traffic), every lathe_* and
    process_* family in it must be among them, so the source reading cannot drift from the truth;
  * every PromQL expression (each alert of each rendered PrometheusRule, each panel and variable
    of the dashboard) names only those metrics, or the few from elsewhere listed in EXTERNAL
    (Prometheus's up, kube-state-metrics, the kubelet), and only labels those metrics carry (plus
    the target labels a Kubernetes scrape adds); a code="..." matcher names a gRPC code the server
    uses as a label (src/api/call.rs);
  * each Lathe metric an alert reads is on the dashboard, so whoever is paged can see it;
  * the CRD objects, which kubernetes-validate cannot check (it knows no CRD schema): a
    PrometheusRule has groups of uniquely named rules, each an alert with expr, a valid `for`, a
    severity and a summary and description; a ServiceMonitor selects a Service of the render with
    the port its endpoint names; a dashboard ConfigMap holds the dashboard file, as JSON.
--rules-dir writes each PrometheusRule's groups as a Prometheus rules file (for promtool);
--core-dir writes each render without its CRD objects (for kubernetes-validate --strict).
Exit status 1 on any failure.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# Objects of CRDs: kubernetes-validate has no schema for them; the checks below stand in.
CRD_KINDS = {("monitoring.coreos.com/v1", "PrometheusRule"), ("monitoring.coreos.com/v1", "ServiceMonitor")}
# What a Kubernetes scrape (a ServiceMonitor's, or the usual pod-annotation job) adds to a series.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
# Series from outside the server that the alerts and the dashboard read, with their labels.
EXTERNAL = {
    "up": set(),  # Prometheus, per target
    "kube_pod_status_ready": {"condition", "uid"},  # kube-state-metrics
    "kubelet_volume_stats_available_bytes": {"persistentvolumeclaim"},  # the kubelet
    "kubelet_volume_stats_capacity_bytes": {"persistentvolumeclaim"},
}
# The prometheus crate's process collector (src/telemetry.rs registers it, unprefixed).
PROCESS_METRICS = ["process_cpu_seconds_total", "process_open_fds", "process_max_fds",
                   "process_virtual_memory_bytes", "process_resident_memory_bytes",
                   "process_start_time_seconds", "process_threads"]
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                   "unless", "offset", "atan2", "inf", "nan",
                   # aggregations, which may be followed by `by (...)` before their parenthesis
                   "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                   "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
SEVERITIES = {"critical", "warning", "info"}

failures: list[str] = []


def fail(where: str, message: str) -> None:
    failures.append(f"{where}: {message}")


@dataclass
class Metric:
    kind: str  # counter, gauge or histogram
    labels: set[str] = field(default_factory=set)


# --- The server's metrics, from its source ---------------------------------------------------

# A call whose arguments start (after an optional registry) with a snake_case name and a help
# string: how every metric of src/ is built (Opts::new, IntGauge::new, telemetry.rs's helpers).
METRIC_CALL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\(\s*(?:&?registry\s*,\s*)?"([a-z][a-z0-9_]*)"\s*,\s*"')
LABEL_SLICE = re.compile(r'&\[\s*((?:"[a-z_]+"\s*,?\s*)+)\]')


def skip_string(text: str, i: int) -> int:
    """The index after the Rust string literal that starts at text[i] (a double quote)."""
    i += 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def call_end(text: str, open_paren: int) -> int:
    """The index after the parenthesis that closes the one at open_paren, strings skipped."""
    depth, i = 0, open_paren
    while i < len(text):
        char = text[i]
        if char == '"':
            i = skip_string(text, i)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced parentheses")


def labels_of(slice_text: str) -> set[str]:
    return set(re.findall(r'"([a-z_]+)"', slice_text))


def server_metrics(src: Path) -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    telemetry = (src / "telemetry.rs").read_text()
    if 'new_custom(Some("lathe"' not in telemetry:
        fail("src/telemetry.rs", 'the registry no longer prefixes "lathe": update check_monitoring.py')
    for path in sorted(src.rglob("*.rs")):
        text = path.read_text()
        if "prometheus::" not in text and "use prometheus" not in text:
            continue
        # Closures such as `let per_collection = |name: &str, help: &str| gauge(..., &["collection"])`.
        closures = {m.group(1): labels_of(m.group(2)) for m in re.finditer(
            r"let (\w+) = \|name: &str, help: &str\|([^;]*?)(?:;|\n\s*\};)", text, re.S)}
        for match in METRIC_CALL.finditer(text):
            function, name = match.groups()
            if function in {"fail", "format", "println", "assert", "expect"}:
                continue
            end = call_end(text, match.start() + len(function))
            inner = text[match.end():end]
            after = re.match(r"\s*,\s*(&\[[^\]]*\])", text[end:])  # a Vec's labels after its Opts
            labels = (labels_of(slice_match.group(1)) if (slice_match := LABEL_SLICE.search(inner))
                      else labels_of(after.group(1)) if after else closures.get(function, set()))
            histogram = function == "histogram" or text[:match.start()].endswith("HistogramOpts::")
            kind = "histogram" if histogram else "counter" if name.endswith("_total") else "gauge"
            metrics[f"lathe_{name}"] = Metric(kind, labels)
    if "ProcessCollector" in telemetry:
        metrics.update({name: Metric("counter" if name.endswith("_total") else "gauge") for name in PROCESS_METRICS})
    for must in ("lathe_requests_total", "lathe_request_duration_seconds", "lathe_build_info"):
        if must not in metrics:
            fail("src/", f"{must} not found: the source reading of check_monitoring.py is out of date")
    return metrics


def check_dump(path: Path, metrics: dict[str, Metric]) -> None:
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", path.read_text(), re.M):
        name, kind = match.groups()
        if not name.startswith(("lathe_", "process_")):
            continue
        if name not in metrics:
            fail(path.name, f"the server exports {name}, which check_monitoring.py did not find in src/")
        elif metrics[name].kind != kind:
            fail(path.name, f"{name} is a {kind}; check_monitoring.py read it from src/ as a {metrics[name].kind}")


def series_metric(name: str, metrics: dict[str, Metric]) -> tuple[str, Metric | None, set[str]]:
    """The metric a series name belongs to (its name, None if unknown), and the labels that series
    adds: le for a histogram's buckets (a histogram has no series of its own name)."""
    if name in metrics and metrics[name].kind != "histogram":
        return name, metrics[name], set()
    for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
        base = name.removesuffix(suffix)
        if base != name and base in metrics and metrics[base].kind == "histogram":
            return base, metrics[base], extra
    if name in EXTERNAL:
        return name, Metric("external", EXTERNAL[name]), set()
    return name, None, set()


# --- PromQL ----------------------------------------------------------------------------------

MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)\s*,?')


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]]  # label, operator, value


def parse_promql(expr: str) -> tuple[list[Selector], set[str]]:
    """The metric selectors of expr and the labels of its by/without/on/ignoring/group_* lists."""
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            close = expr.index(char, i + 1)
            while char != "`" and expr[close - 1] == "\\":
                close = expr.index(char, close + 1)
            i = close + 1
        elif char == "[":  # a range or subquery: durations, $__rate_interval
            i = expr.index("]", i) + 1
        elif char == "{":  # a selector with no metric name
            raise ValueError(f"a selector without a metric name at {expr[i:i + 30]!r}")
        elif char.isdigit() or (char == "." and expr[i + 1:i + 2].isdigit()):
            i = re.match(r"[0-9.eE+]+[a-z]*", expr[i:]).end() + i
        elif char == "$":  # a Grafana variable outside a string
            i = re.match(r"\$\{?[A-Za-z0-9_]+\}?", expr[i:]).end() + i
        elif char.isalpha() or char in "_:":
            word = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", expr[i:]).group()
            i += len(word)
            rest = expr[i:].lstrip()
            i = len(expr) - len(rest)
            if word.lower() in GROUPING and rest.startswith("("):
                close = expr.index(")", i)
                grouping |= {label.strip() for label in expr[i + 1:close].split(",") if label.strip()}
                i = close + 1
            elif rest.startswith("(") or word.lower() in PROMQL_KEYWORDS:
                continue  # a function or an aggregation
            else:
                matchers = []
                if rest.startswith("{"):
                    close, position = i + 1, i + 1
                    while not expr[position:].lstrip().startswith("}"):
                        match = MATCHER.match(expr, position)
                        if not match:
                            raise ValueError(f"cannot read the matchers of {word} at {expr[position:position + 30]!r}")
                        matchers.append((match.group(1), match.group(2), match.group(3)[1:-1]))
                        position = match.end()
                    close = expr.index("}", position)
                    i = close + 1
                selectors.append(Selector(word, matchers))
        else:
            i += 1
    return selectors, grouping


def check_expr(where: str, expr: str, metrics: dict[str, Metric], codes: set[str]) -> set[str]:
    """Fails what expr names that the server does not export; the Lathe metrics it reads."""
    try:
        selectors, grouping = parse_promql(expr)
    except ValueError as error:
        fail(where, f"cannot read the expression: {error}")
        return set()
    if not selectors:
        fail(where, f"reads no metric: {expr!r}")
    known_labels = set(TARGET_LABELS)
    used = set()
    for selector in selectors:
        base, metric, extra = series_metric(selector.metric, metrics)
        if metric is None:
            fail(where, f"{selector.metric} is not a metric the server exports (src/) nor one of "
                        f"{sorted(EXTERNAL)}")
            continue
        if metric.kind != "external":
            used.add(base)
        labels = metric.labels | extra | TARGET_LABELS
        known_labels |= labels
        for label, operator, value in selector.matchers:
            if label not in labels:
                fail(where, f"{selector.metric} has no label {label} (it has {sorted(metric.labels | extra)})")
            elif label == "code" and operator in ("=", "!=") and value not in codes:
                fail(where, f'code="{value}" is not a code the server counts ({sorted(codes)})')
    for label in sorted(grouping - known_labels):
        fail(where, f"groups by {label}, which none of its metrics has")
    return used


def grpc_codes(src: Path) -> set[str]:
    """The values of lathe_requests_total's code label (code_label in src/api/call.rs)."""
    text = (src / "api" / "call.rs").read_text()
    body = text[text.index("fn code_label"):]
    return set(re.findall(r'=> "([A-Z_]+)"', body[:body.index("\n}\n")]))


# --- The dashboard ---------------------------------------------------------------------------

def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    queries = []

    def panels_of(panels: list[dict]):
        for panel in panels:
            yield panel
            yield from panels_of(panel.get("panels", []))

    for panel in panels_of(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                queries.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable.get("query"), dict) else variable.get("query", "")
        match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)\s*", query)
        queries.append((f"variable ${variable['name']}", match.group(1) if match else query))
    return queries


def check_dashboard(path: Path, metrics: dict[str, Metric], codes: set[str]) -> set[str]:
    try:
        dashboard = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        fail(path.name, f"not JSON: {error}")
        return set()
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dashboard:
            fail(path.name, f"no {key}: not a Grafana dashboard")
    ids = [p["id"] for p in dashboard.get("panels", []) if "id" in p]
    if len(ids) != len(set(ids)):
        fail(path.name, "panel ids repeat")
    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])} | {
        "__rate_interval", "__interval", "__range"}
    used: set[str] = set()
    for where, expr in dashboard_queries(dashboard):
        for variable in re.findall(r"\$\{?([A-Za-z0-9_]+)", expr):
            if variable not in variables:
                fail(f"{path.name} {where}", f"${variable} is not a variable of the dashboard")
        used |= check_expr(f"{path.name} {where}", expr, metrics, codes)
    return used


# --- The rendered CRD objects ----------------------------------------------------------------

def check_prometheus_rule(where: str, rule: dict, metrics: dict[str, Metric], codes: set[str]) -> set[str]:
    used: set[str] = set()
    groups = (rule.get("spec") or {}).get("groups")
    if not isinstance(groups, list) or not groups:
        fail(where, "spec.groups must be a non-empty list")
        return used
    group_names, alert_names = set(), set()
    for group in groups:
        name = group.get("name")
        if not name or name in group_names:
            fail(where, f"group name {name!r} is empty or repeated")
        group_names.add(name)
        unknown = set(group) - {"name", "interval", "rules", "limit", "partial_response_strategy"}
        if unknown:
            fail(where, f"group {name}: unknown keys {sorted(unknown)}")
        for entry in group.get("rules") or []:
            alert = entry.get("alert")
            at = f"{where} alert {alert}"
            if not alert or "record" in entry:
                fail(where, f"group {name}: every rule must be an alert: {entry}")
                continue
            if alert in alert_names:
                fail(at, "repeated")
            alert_names.add(alert)
            unknown = set(entry) - {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if unknown:
                fail(at, f"unknown keys {sorted(unknown)}")
            if "for" in entry and not DURATION.match(str(entry["for"])):
                fail(at, f"for: {entry['for']!r} is not a duration")
            if (entry.get("labels") or {}).get("severity") not in SEVERITIES:
                fail(at, f"labels.severity must be one of {sorted(SEVERITIES)}")
            for annotation in ("summary", "description"):
                if not (entry.get("annotations") or {}).get(annotation):
                    fail(at, f"no {annotation} annotation")
            if not isinstance(entry.get("expr"), str) or not entry["expr"].strip():
                fail(at, "no expr")
                continue
            used |= check_expr(at, entry["expr"], metrics, codes)
    return used


def check_service_monitor(where: str, monitor: dict, services: list[dict], namespace: str | None) -> None:
    spec = monitor.get("spec") or {}
    wanted = (spec.get("selector") or {}).get("matchLabels") or {}
    if not wanted:
        fail(where, "spec.selector.matchLabels is empty: it would select every Service")
    names = (spec.get("namespaceSelector") or {}).get("matchNames")
    if namespace and names is not None and namespace not in names:
        fail(where, f"namespaceSelector does not name the release's namespace {namespace}")
    selected = [s for s in services if wanted.items() <= (s["metadata"].get("labels") or {}).items()]
    endpoints = spec.get("endpoints") or []
    if not endpoints:
        fail(where, "no endpoints")
    for endpoint in endpoints:
        port = endpoint.get("port")
        if not any(p.get("name") == port for s in selected for p in s["spec"].get("ports", [])):
            fail(where, f"no Service it selects has a port named {port!r}: nothing would be scraped")
        for key in ("interval", "scrapeTimeout"):
            if key in endpoint and not DURATION.match(str(endpoint[key])):
                fail(where, f"{key}: {endpoint[key]!r} is not a duration")
        if "interval" in endpoint and "scrapeTimeout" in endpoint and \
                seconds(endpoint["scrapeTimeout"]) > seconds(endpoint["interval"]):
            fail(where, "scrapeTimeout is longer than interval (Prometheus refuses it)")


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration))


def check_render(path: Path, dashboard_file: Path, metrics: dict[str, Metric], codes: set[str],
                 rules_dir: Path | None, core_dir: Path | None) -> tuple[set[str], int]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    services = [d for d in documents if d["kind"] == "Service"]
    used: set[str] = set()
    crds = 0
    for document in documents:
        kind, name = document["kind"], document["metadata"]["name"]
        where = f"{path.name} {kind.lower()}/{name}"
        if (document.get("apiVersion"), kind) in CRD_KINDS:
            crds += 1
        elif document.get("apiVersion", "").startswith("monitoring.coreos.com/"):
            fail(where, f"{document['apiVersion']} {kind} is not a CRD object this check knows")
        if kind == "PrometheusRule":
            used |= check_prometheus_rule(where, document, metrics, codes)
            if rules_dir is not None:
                target = rules_dir / f"{path.stem}-{name}.rules.yaml"
                target.write_text(yaml.safe_dump({"groups": document["spec"]["groups"]}, sort_keys=False))
        elif kind == "ServiceMonitor":
            check_service_monitor(where, document, services, document["metadata"].get("namespace"))
        elif kind == "ConfigMap" and (document["metadata"].get("labels") or {}).get("grafana_dashboard"):
            for key, text in (document.get("data") or {}).items():
                try:
                    shipped = json.loads(text)
                except json.JSONDecodeError as error:
                    fail(where, f"{key} is not JSON: {error}")
                    continue
                if shipped != json.loads(dashboard_file.read_text()):
                    fail(where, f"{key} differs from {dashboard_file.name}")
    if core_dir is not None:
        core = [d for d in documents if (d.get("apiVersion"), d["kind"]) not in CRD_KINDS]
        (core_dir / path.name).write_text(yaml.safe_dump_all(core, sort_keys=False))
    return used, crds


def check(src: Path, dashboard_file: Path, renders: list[Path], rules_dir: Path | None = None,
          core_dir: Path | None = None, metrics_dump: Path | None = None) -> str:
    """Runs every check (failures go to `failures`); a summary of what was checked."""
    for directory in (rules_dir, core_dir):
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob("*.yaml"):
                stale.unlink()
    metrics = server_metrics(src)
    codes = grpc_codes(src)
    if metrics_dump is not None:
        check_dump(metrics_dump, metrics)
    on_dashboard = check_dashboard(dashboard_file, metrics, codes)
    alerted: set[str] = set()
    crds = 0
    for path in renders:
        used, count = check_render(path, dashboard_file, metrics, codes, rules_dir, core_dir)
        alerted |= used
        crds += count
    for name in sorted(alerted - on_dashboard):
        fail(dashboard_file.name, f"alerts read {name}, which no panel shows")
    return (f"{len(metrics)} server metrics; the dashboard reads {len(on_dashboard)}, the alerts "
            f"{len(alerted)} (all on the dashboard); {crds} CRD objects checked")


def main(arguments: list[str]) -> int:
    options: dict[str, Path] = {}
    positional: list[str] = []
    rest = iter(arguments)
    for argument in rest:
        if argument in ("--rules-dir", "--core-dir", "--metrics-dump"):
            options[argument] = Path(next(rest))
        else:
            positional.append(argument)
    if len(positional) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    summary = check(Path(positional[0]), Path(positional[1]), [Path(p) for p in positional[2:]],
                    options.get("--rules-dir"), options.get("--core-dir"), options.get("--metrics-dump"))
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    if failures:
        print(f"monitoring: {len(failures)} problems", file=sys.stderr)
        return 1
    print(f"monitoring: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
