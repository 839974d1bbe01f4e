#!/usr/bin/env bash
# CI: build secagg's wheel through the build backend (setup.py: the native extension inside
# it), install it into a clean venv and run a threshold round there from a folder outside the
# checkout; fails if the installed wheel cannot. About a minute after scripts/setup.sh: the
# wheel takes the in-place extension that scripts/build_native.sh built from the same sources
# (native/seal_build.py's stamp; otherwise the backend builds it, a few minutes).
#
# The clean venv gets secagg only (--no-deps); its dependencies are .venv's, through a .pth
# file naming .venv's site-packages: the same versions the suite ran with, without fetching
# torch again. A path in a .pth is appended to sys.path after the venv's own site-packages
# (so the wheel's secagg comes first) and .pth files inside it are not read (so .venv's
# editable secagg, a .pth hook, is not), which the check below confirms.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [[ "${SECAGG_NATIVE:-auto}" == "off" ]]; then
  echo "secagg wheel check: SECAGG_NATIVE=off, no extension to check" >&2
  exit 0
fi
bash scripts/build_native.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "secagg wheel check: building the wheel" >&2
# setuptools' staging folders: a wheel takes whatever they hold, a stale extension included
rm -rf build/lib.* build/bdist.*
.venv/bin/python -m pip wheel . --no-deps --no-build-isolation -q -w "$work/dist" \
  > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/secagg-*.whl)
.venv/bin/python - "$wheel" <<'EOF'
import re, sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for module in ("_seal_native", "_seal_public"):  # the extension and its public half
    if not any(re.fullmatch(rf"secagg/ckks/{module}\..*\.so", n) for n in names):
        sys.exit(f"secagg wheel check: {sys.argv[1]} carries no {module}")
EOF

.venv/bin/python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > "$site/_secagg_deps.pth"

mkdir "$work/outside"
cd "$work/outside"
"$work/venv/bin/python" - "$work/venv" <<'EOF'
import sys
from pathlib import Path

import secagg
import secagg.ckks._seal_native as extension
import secagg.ckks._seal_public as public_half
from secagg.threshold import ring

venv = Path(sys.argv[1]).resolve()
for name, path in (
    ("secagg", secagg.__file__),
    ("its extension", extension.__file__),
    ("its public half", public_half.__file__),
):
    if not Path(path).resolve().is_relative_to(venv):
        sys.exit(f"secagg wheel check: {name} was imported from {path}, not the installed wheel")
ring._extension()  # the threshold backend's own check: the extension and its ring
print(f"secagg wheel check: {Path(secagg.__file__).parent} with SEAL {extension.SEAL_VERSION}")
EOF
SECAGG_NATIVE=on "$work/venv/bin/secagg" run --backend threshold --rounds 1 --local-steps 1 \
  --seeds 42 --out "$work/outside/run" > "$work/run.log" 2>&1 \
  || { tail -n 40 "$work/run.log" >&2; exit 1; }
tail -n 3 "$work/run.log"
echo "secagg wheel check: the installed wheel ran a threshold round outside $root" >&2
