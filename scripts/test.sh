#!/usr/bin/env bash
# Set up (if needed) and run the test suite in two lanes: the gating lane (`-m "not slow"`:
# unit, attack and short end-to-end tests, minutes) and then the full lane (`-m slow`: real
# Flower deployments, full protocol × backend matrices, the wheel). Arguments replace the
# lanes: `bash scripts/test.sh -m "not slow"` is the inner loop, `bash scripts/test.sh
# tests/test_wire.py` one file.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
pytest=(.venv/bin/python -m pytest -q --durations=25)
if [[ $# -gt 0 ]]; then
  exec "${pytest[@]}" "$@"
fi
echo "secagg tests: gating lane (-m 'not slow')" >&2
"${pytest[@]}" -m "not slow"
echo "secagg tests: full lane (-m slow)" >&2
"${pytest[@]}" -m slow
