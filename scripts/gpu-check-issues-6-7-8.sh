#!/usr/bin/env bash
# The GPU checks of issues 6, 7 and 8 in one call, trimmed to fit about 5 minutes on an H200
# (the fuller per-issue scripts are gpu-check-issue-7.sh and gpu-check-issue-8.sh):
#   7: the context-MLA reuse reproduction three ways, measured, and its GPU test;
#   6: `mlamem profile --report` on the GPU, and one report over every result of this run;
#   8: the Triton decode's GPU tests, its three paths profiled (measured and predicted) with the
#      acceptance checks, FlashMLA's alloc column, and the throughput benchmark.
# Results are re-packed into $OUT/results.tar.gz after each stage (8 files come back at most).
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issues-6-7-8.sh
source "$(dirname "$0")/gpu-env.sh"
R="$OUT/results"; mkdir -p "$R"
pack() { tar -czf "$OUT/results.tar.gz" -C "$OUT" results; }

# 7
timeout 90 python3 -m pytest -q tests/test_repro_gpu.py -k context_reuse 2>&1 | tee "$R/pytest-context-reuse.log" | tail -2
timeout 60 python3 -m mlamem repro-oom --scenario kimi-k2-context-reuse --format json \
    --output "$R/kimi-k2-context-reuse.json" --expect-oom none --expect-oom fp8 --expect-fit full
echo "context-reuse expectations exit: $?" | tee "$R/context-reuse-exit.txt"
pack

# 6
timeout 60 python3 -m mlamem profile --report "$R/profile-report" 2>&1 | tail -2
pack

# 8
timeout 100 python3 -m pytest -q -rs tests/test_triton_gpu.py 2>&1 | tee "$R/pytest-triton-gpu.log" | tail -4
PROFILE=(python3 -m mlamem profile --kernel triton --tokens 1024,8192,16384,32768
         --paths alloc,workspace,workspace-full --format json)
timeout 60 "${PROFILE[@]}" --output "$R/triton-profile.json"
timeout 30 "${PROFILE[@]}" --predict --output "$R/triton-profile-predicted.json"
timeout 30 python3 -m mlamem profile --kernel flashmla --tokens 1024,8192,16384,32768 --paths alloc \
    --format json --output "$R/flashmla-alloc.json"
python3 scripts/triton_acceptance.py "$R" 2>&1 | tee "$R/acceptance.txt"
pack
timeout 60 python3 benchmarks/triton_vs_flashmla.py --json "$R/triton-vs-flashmla.json" 2>&1 | tee "$R/triton-vs-flashmla.txt"
pack

# 6: one report over this run's results
mkdir -p "$R/report"
timeout 30 python3 -m mlamem report "$R/profile-report/"*.json reports/repro-oom-h200/glm5-fp8-tp8.json "$R/kimi-k2-context-reuse.json" \
    "$R/triton-profile.json" --output "$R/report/report.md" 2>&1 | tail -1
pack
cat "$R/acceptance.txt"
