#!/usr/bin/env bash
# The router and policy tests once more, on CPU kernels other than the ones this machine would pick: a float
# recomputed there (an APGR, an AUC, a calibration figure, a score) moves in its last bits with the kernels, and
# a test comparing it with a figure made on another CPU must hold it within a stated bound, not to the bit.
#
#   scripts/test_kernels.sh [PYTEST ARGS...]
#
# - OPENBLAS_CORETYPE=Haswell: numpy's OpenBLAS (a DYNAMIC_ARCH build) runs its AVX2 kernels whatever the CPU
#   (an AVX-512 machine would run SkylakeX's); OPENBLAS_VERBOSE=0: quiet (2 would print the core it runs).
# - ATEN_CPU_CAPABILITY=avx2: torch's own vectorised kernels are the AVX2 ones (not AVX-512's).
# - MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2: the same for torch's MKL and oneDNN matrix products.
# - one thread everywhere (OMP, OpenBLAS, MKL): a sum split across threads is added in another order.
# onnxruntime picks its kernels by CPU and has no such switch: the tests' bounds cover it.
# Tests marked `engines` are left out (they start vLLM; scripts/test.sh runs them). Two pytest-xdist workers, as
# scripts/test.sh runs (CASCADE_TEST_WORKERS=0: one process); each still computes on one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
unset PYTHONDONTWRITEBYTECODE  # cached bytecode, as scripts/test.sh (pytest's assert rewriting among it)
export OPENBLAS_CORETYPE=Haswell OPENBLAS_VERBOSE=0 ATEN_CPU_CAPABILITY=avx2
export MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
PARALLEL=(-n "${CASCADE_TEST_WORKERS:-2}" --dist loadgroup)
if [ "${CASCADE_TEST_WORKERS:-2}" = 0 ]; then PARALLEL=(); fi
exec .venv/bin/python -m pytest "${PARALLEL[@]}" tests/router_models tests/policies -m "not engines" -q "$@"
