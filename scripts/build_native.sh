#!/usr/bin/env bash
# Build secagg's native extension (native/seal_native.cpp, see secagg/ckks/native.py) in
# place into secagg/ckks/ with .venv's Python, through native/seal_build.py: the builder the
# build backend (setup.py) runs for wheels too. SEAL 4.1.2's sources come from Pyfhel 3.5.0's
# sdist, fetched by pip and pinned by its sha256; pybind11, cmake and ninja from the `native`
# extra. Needs a C++17 compiler (gcc here). About a minute on 2 cores, plus about a minute the
# first time for pip to fetch the sdist; idempotent (rebuilds only when the sources, the
# builder or the interpreter change). SECAGG_NATIVE=off skips it: secagg then runs on
# TenSEAL's binding alone, slower, and without the threshold backend (README, performance).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${SECAGG_NATIVE:-auto}" == "off" ]]; then
  echo "secagg native: SECAGG_NATIVE=off, not building the extension" >&2
  exit 0
fi
exec .venv/bin/python native/seal_build.py
