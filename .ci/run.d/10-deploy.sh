#!/usr/bin/env bash
# Render and validate every manifest (kustomize overlays, Helm chart) offline against the
# Kubernetes schemas, the chart's alert rules with promtool, and run the Docker image's build
# steps as a script so they cannot rot.
set -euo pipefail
./scripts/install-promtool.sh
bash deploy/validate.sh
BUILD_PROFILE=debug SKIP_BUILD=1 bash deploy/docker-build-steps.sh
