#!/usr/bin/env bash
# Create .venv with Python 3.10 (OpenFHE's wheel needs it here) and install secagg into it.
# Idempotent: reinstalls only when pyproject.toml changed since the last successful install;
# then builds the native extension over SEAL (scripts/build_native.sh; SECAGG_NATIVE=off skips).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${SECAGG_PYTHON:-}" "$HOME/.pyenv/versions/3.10.13/bin/python" \
                   "$(command -v python3.10 || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then echo "$candidate"; return; fi
  done
  if command -v pyenv >/dev/null; then PYENV_VERSION=3.10.13 pyenv which python && return; fi
  echo "secagg setup: no Python 3.10 found; install it (pyenv install 3.10.13) or set SECAGG_PYTHON" >&2
  exit 1
}

if [[ ! -x .venv/bin/python ]]; then
  echo "secagg setup: creating .venv" >&2
  "$(find_python)" -m venv .venv
fi
stamp=.venv/.secagg-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
  echo "secagg setup: installing dependencies (first time: a few minutes, torch is large)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test,flower,native]"
  echo "$want" > "$stamp"
fi
bash scripts/build_native.sh
