#!/usr/bin/env bash
# Build secagg's native extension (native/seal_native.cpp, see secagg/ckks/native.py) into
# secagg/ckks/ from PyPI packages only: SEAL 4.1.2's sources come from Pyfhel 3.5.0's sdist
# (pinned by its sha256), pybind11, cmake and ninja from the `native` extra. Needs a C++17
# compiler (gcc here). About a minute on 2 cores; idempotent (rebuilds only when the sources,
# this script or the interpreter change). SECAGG_NATIVE=off skips it: secagg then runs on
# TenSEAL's binding alone, slower (README, performance).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${SECAGG_NATIVE:-auto}" == "off" ]]; then
  echo "secagg native: SECAGG_NATIVE=off, not building the extension" >&2
  exit 0
fi

py=.venv/bin/python
sdist_url=https://files.pythonhosted.org/packages/e8/4f/228e4196c08f48c188b9796bc2d60c57e2b227bed45faa1ccfed7e20b965/pyfhel-3.5.0.tar.gz
sdist_sha256=0375b83b5a83026924f59db25c4efa9f27e1e8a66d004658f4d24195986a04b6
work=.native
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
target=secagg/ckks/_seal_native$suffix
# one build folder per interpreter: CMake caches the Python it found in the first
build="$work/build-$("$py" -c 'import sys; print(sys.implementation.cache_tag)')"
want=$(cat native/seal_native.cpp native/CMakeLists.txt "$0" <("$py" -VV) | sha256sum | cut -d' ' -f1)
if [[ -f "$target" && -f "$work/stamp" && "$(cat "$work/stamp")" == "$want" ]]; then
  exit 0
fi

mkdir -p "$work"
sdist="$work/pyfhel-3.5.0.tar.gz"
if [[ ! -f "$sdist" ]] || ! echo "$sdist_sha256  $sdist" | sha256sum -c --status; then
  echo "secagg native: fetching SEAL 4.1.2's sources (Pyfhel 3.5.0's sdist, PyPI)" >&2
  "$py" - "$sdist_url" "$sdist" <<'EOF'
import os, ssl, sys, urllib.request
url, out = sys.argv[1], sys.argv[2]
cafile = os.environ.get("PIP_CERT") or None
with urllib.request.urlopen(url, context=ssl.create_default_context(cafile=cafile)) as r:
    data = r.read()
with open(out, "wb") as f:
    f.write(data)
EOF
  if ! echo "$sdist_sha256  $sdist" | sha256sum -c --status; then
    rm -f "$sdist"
    echo "secagg native: the sdist's sha256 is not the pinned one; refusing to build" >&2
    exit 1
  fi
fi
if [[ ! -f "$work/SEAL/CMakeLists.txt" ]]; then
  rm -rf "$work/SEAL" "$work"/build*
  mkdir -p "$work/SEAL"
  tar -xzf "$sdist" -C "$work/SEAL" --strip-components=4 pyfhel-3.5.0/Pyfhel/backend/SEAL
fi

echo "secagg native: building SEAL 4.1.2 and the extension (about a minute the first time)" >&2
bin="$PWD/$(dirname "$py")"
# release flags as SEAL's own; no -march=native: GCC 12 vectorises SEAL's BLAKE2b for
# AVX-512 into code more than twice as slow as the portable build (measured here)
"$bin/cmake" -S native -B "$build" -G Ninja -DCMAKE_MAKE_PROGRAM="$bin/ninja" \
  -DCMAKE_BUILD_TYPE=Release -DSEAL_SOURCE_DIR="$PWD/$work/SEAL" \
  -DPython_EXECUTABLE="$PWD/$py" \
  -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  > "$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
"$bin/ninja" -C "$build" _seal_native > "$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; exit 1; }
cp "$build/_seal_native$suffix" "$target"
echo "$want" > "$work/stamp"
