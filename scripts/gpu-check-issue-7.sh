#!/usr/bin/env bash
# GPU checks of issue 7 in one call: the context-MLA reuse reproduction three ways (no reserve,
# the fp8-only reserve, plan's everything-charged reserve), its GPU test, and the plans.
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-7.sh
source "$(dirname "$0")/gpu-env.sh"

python3 -m pytest -q tests/test_repro_gpu.py -k context_reuse 2>&1 | tee "$OUT/pytest-context-reuse.log" | tail -3
python3 -m mlamem repro-oom --scenario kimi-k2-context-reuse --format json --output "$OUT/kimi-k2-context-reuse.json"
python3 -m mlamem repro-oom --scenario kimi-k2-context-reuse --format markdown --output "$OUT/kimi-k2-context-reuse.md" \
    --expect-oom none --expect-oom fp8 --expect-fit full
echo "expectations exit: $?" | tee -a "$OUT/kimi-k2-context-reuse.md"
python3 -m mlamem plan --scenario kimi-k2-context-reuse --format markdown --output "$OUT/plan-kimi-k2-context-reuse.md"
python3 -m mlamem plan --sweep max-seq-len=131072,786432 --format markdown --output "$OUT/plan-glm5-sweep.md"
cat "$OUT"/*.md
