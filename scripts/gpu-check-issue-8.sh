#!/usr/bin/env bash
# GPU checks of issue 8's kernel in one call: the Triton decode's GPU tests (numerics against
# FlashMLA, poisoned buffers, allocations), then the throughput benchmark against FlashMLA
# with a small launch-config sweep. Logs and JSON land in $OUT.
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-8.sh
set -uo pipefail
OUT=${OUT:-/tmp/mlamem-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" \
    | tee -a "$OUT/gpu.txt"

timeout 240 python3 -m pytest -q -rs tests/test_triton_gpu.py 2>&1 | tee "$OUT/pytest-triton-gpu.log" | tail -25
timeout 180 python3 benchmarks/triton_vs_flashmla.py --sweep --json "$OUT/triton-vs-flashmla.json" \
    2>&1 | tee "$OUT/triton-vs-flashmla.txt"
