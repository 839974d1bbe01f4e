#!/usr/bin/env bash
# Set up (if needed) and run the main job: the quickstart preset, results in results/quickstart
# (replaced on every call: the quick start is a demonstration, not an experiment to keep).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/secagg run --preset quickstart --out results/quickstart --overwrite "$@"
