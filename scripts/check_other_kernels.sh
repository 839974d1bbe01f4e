#!/usr/bin/env bash
# Every benchmark's declared check (tests/test_reproduce.py) again under another CPU's
# kernels on this machine: torch's and OpenBLAS's kernel sets chosen by environment, AVX2 and
# then SSE only (in place of AVX-512 or whatever this CPU has), with MKL held to the same.
# Float32 training, BLAS sums and chaotic trajectories round differently under them, as on
# a machine of another vendor; the checks' tolerances must hold here too. About 10 minutes
# per kernel set on 2 cores. Arguments go to pytest (e.g. -k "admm or dgd").
set -euo pipefail
cd "$(dirname "$0")/.."
extra=("$@")
for kernels in "avx2 Haswell AVX2" "default Prescott SSE4_2"; do
  read -r aten openblas mkl <<<"$kernels"
  echo "secagg checks: ATEN_CPU_CAPABILITY=$aten OPENBLAS_CORETYPE=$openblas" \
    "MKL_ENABLE_INSTRUCTIONS=$mkl" >&2
  ATEN_CPU_CAPABILITY=$aten OPENBLAS_CORETYPE=$openblas MKL_ENABLE_INSTRUCTIONS=$mkl \
    .venv/bin/python -c "import torch; print('torch kernels:', torch.backends.cpu.get_cpu_capability())"
  ATEN_CPU_CAPABILITY=$aten OPENBLAS_CORETYPE=$openblas MKL_ENABLE_INSTRUCTIONS=$mkl \
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_reproduce.py \
    -k each_declared_check "${extra[@]}"
done
