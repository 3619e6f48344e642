#!/usr/bin/env bash
# GPU checks of issue 8 in one call (about 2.5 minutes on an H200 with --sweep):
#   1. the Triton decode's GPU tests (numerics against FlashMLA and the reference, poisoned
#      buffers, allocations, the three paths measured as predicted);
#   2. `mlamem profile --kernel triton` over alloc, workspace and workspace-full, measured
#      (markdown + json) and predicted (markdown + json), and FlashMLA's alloc column measured;
#   3. the throughput benchmark against FlashMLA, and both kernels' lse against the fp32
#      reference (default config only; BENCH_ARGS=--sweep adds the other launch configs).
# Everything also lands in $OUT/issue-8.tar.gz (only 8 files come back from the device).
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-8.sh
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" \
    | tee -a "$OUT/gpu.txt"

timeout 150 python3 -m pytest -q -rs tests/test_triton_gpu.py 2>&1 \
    | tee "$OUT/pytest-triton-gpu.log" | tail -15

TOKENS=1024,8192,16384,32768
PROFILE=(python3 -m mlamem profile --kernel triton --tokens "$TOKENS"
         --paths alloc,workspace,workspace-full)
{
    for predict in "" --predict; do
        suffix=${predict:+-predicted}
        timeout 60 "${PROFILE[@]}" $predict --format markdown --output "$OUT/triton-profile$suffix.md"
        timeout 60 "${PROFILE[@]}" $predict --format json --output "$OUT/triton-profile$suffix.json"
    done
    timeout 60 python3 -m mlamem profile --kernel flashmla --tokens "$TOKENS" --paths alloc \
        --format json --output "$OUT/flashmla-alloc.json"
    timeout 60 python3 -m mlamem profile --kernel triton --tokens 32768 --breakdown \
        --format markdown --output "$OUT/triton-breakdown-32768.md"
} 2>&1 | tee "$OUT/profile.log"
cat "$OUT/triton-profile.md"
# The acceptance checks, one line each: alloc = FlashMLA's, workspace = the PR's after column,
# workspace-full <= 1 MiB, outputs bit-identical, measured = predicted.
python3 scripts/triton_acceptance.py "$OUT" 2>&1 | tee "$OUT/acceptance.txt"

timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/triton_vs_flashmla.py --lse ${BENCH_ARGS:-} \
    --json "$OUT/triton-vs-flashmla.json" 2>&1 | tee "$OUT/triton-vs-flashmla.txt"

tar -czf "$OUT/issue-8.tar.gz" -C "$OUT" --exclude issue-8.tar.gz .
ls -la "$OUT"
