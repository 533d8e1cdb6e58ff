#!/usr/bin/env bash
# GPU check of vectorised cohorts (run.vectorize, docs/vectorized.md), a few minutes on one
# CUDA device: (1) tests/test_vectorized.py on CUDA (batched == sequential to 1e-5, incl.
# the CUDA dropout replay through the fused kernel); (2) bench_vectorized.py with
# run.device=cuda, S up to 1000, printing the ratios side by side.
#
# Needs the project's dependencies (torch with CUDA, pydantic, pytest, ...) in $PYTHON
# (default python3). Results also go to $OUT (the device runner) or docs/results.
#
#   PYTHON=/path/to/venv/bin/python bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src
PY=${PYTHON:-python3}
DEST=${OUT:-docs/results}
mkdir -p "$DEST"

$PY - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device"
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
PY

echo "== equivalence on CUDA"
FEDSHIELD_TEST_DEVICE=cuda FEDSHIELD_TEST_THREADS=4 timeout 240 \
  $PY -m pytest -q -x -p no:cacheprovider tests/test_vectorized.py 2>&1 | tail -n 15 \
  | tee "$DEST/gpu_check_tests.txt"

echo "== bench on CUDA"
timeout 420 $PY bench/bench_vectorized.py --device cuda --sizes 10,100,1000 --steps 1,5 \
  --repeats 2 --chunks 100,1000 --save "$DEST/bench_vectorized_cuda.txt"
