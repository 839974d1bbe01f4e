#!/usr/bin/env bash
# Create .venv with CPython 3.13 (SECAGG_PYTHON overrides: any interpreter pyproject.toml's
# requires-python accepts) and install secagg into it. Idempotent: recreates .venv when its
# Python is not that one, reinstalls only when pyproject.toml changed since the last
# successful install; then builds the native extension over SEAL in place
# (scripts/build_native.sh; SECAGG_NATIVE=off skips).
set -euo pipefail
cd "$(dirname "$0")/.."

want_minor=3.13

find_python() {
  if [[ -n "${SECAGG_PYTHON:-}" ]]; then
    if [[ -x "$SECAGG_PYTHON" ]] || command -v "$SECAGG_PYTHON" >/dev/null; then
      echo "$SECAGG_PYTHON"; return
    fi
    echo "secagg setup: SECAGG_PYTHON=$SECAGG_PYTHON is not an executable" >&2
    exit 1
  fi
  # pyenv's newest 3.13.x, then python3.13 on PATH
  local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv} candidate
  candidate=$(ls -d "$pyenv_root/versions/$want_minor".*/bin/python 2>/dev/null | sort -V | tail -n 1)
  for candidate in "$candidate" "$(command -v "python$want_minor" || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then echo "$candidate"; return; fi
  done
  echo "secagg setup: no Python $want_minor found; install it (pyenv install $want_minor)" \
       "or set SECAGG_PYTHON" >&2
  exit 1
}

python=$(find_python)
version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
have=$(version .venv/bin/python) want_version=$(version "$python")
if [[ "$have" != "$want_version" ]]; then
  echo "secagg setup: creating .venv with $("$python" --version)${have:+ (it ran Python $have)}" >&2
  "$python" -m venv --clear .venv
fi
stamp=.venv/.secagg-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
  echo "secagg setup: installing dependencies (first time: a few minutes, torch is large)" >&2
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77"
  # the editable install without the extension (SECAGG_NATIVE=off: setup.py skips it, so the
  # build needs nothing but .venv's setuptools), which scripts/build_native.sh builds in place
  # next, and rebuilds when its sources change
  SECAGG_NATIVE=off .venv/bin/python -m pip install -q --no-build-isolation \
    -e ".[test,flower,native,docs]"
  echo "$want" > "$stamp"
fi
bash scripts/build_native.sh
