#!/usr/bin/env bash
# GPU checks of issue 4 (repro-oom) in one call: the repro tests, the glm5 defaults in every
# output form, and the other shipped scenarios.
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-4.sh
source "$(dirname "$0")/gpu-env.sh"

python3 -m pytest -q tests/test_repro.py tests/test_repro_gpu.py 2>&1 | tee "$OUT/pytest-repro.log" | tail -5

start=$(date +%s%N)
python3 -m mlamem repro-oom --format json --output "$OUT/glm5-fp8-tp8.json"
end=$(date +%s%N)
echo "glm5 defaults, both paths, wall time: $(( (end - start) / 1000000 )) ms" | tee "$OUT/repro-time.txt"
python3 -m mlamem repro-oom --format markdown --output "$OUT/glm5-fp8-tp8.md"
python3 -m mlamem repro-oom --predict --format json --output "$OUT/glm5-fp8-tp8.predicted.json"
for s in deepseek-v32-fp8-tp8 kimi-k2-fp8-tp4-dp; do
    python3 -m mlamem repro-oom --scenario $s --format markdown --output "$OUT/$s.md"
done
python3 -m mlamem repro-oom --expect-oom alloc --expect-fit workspace; echo "expectations exit: $?"
cat "$OUT"/*.md
