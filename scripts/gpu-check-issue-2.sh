#!/usr/bin/env bash
# GPU checks of issue 2 in one call: tests, the three scenarios' sweeps (measured and
# predicted), the sweep's wall time from process start, and the profiler's overhead.
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-2.sh
source "$(dirname "$0")/gpu-env.sh"

python3 -m pytest -q tests 2>&1 | tee "$OUT/pytest.log" | tail -5

start=$(date +%s%N)
python3 -m mlamem profile --format json --output "$OUT/glm5-fp8-tp8.json"
end=$(date +%s%N)
echo "default sweep wall time from process start: $(( (end - start) / 1000000 )) ms" | tee "$OUT/sweep-time.txt"
python3 -m mlamem profile --format markdown | tee "$OUT/glm5-fp8-tp8.md"
python3 -m mlamem profile --predict --format json --output "$OUT/glm5-fp8-tp8.predicted.json"
for s in deepseek-v32-fp8-tp8 kimi-k2-fp8-tp4-dp; do
    python3 -m mlamem profile --scenario $s --format markdown | tee "$OUT/$s.md"
done
python3 benchmarks/overhead.py | tee "$OUT/overhead.txt"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/glm5-fp8-tp8.json"))["rows"]
p = json.load(open(f"{out}/glm5-fp8-tp8.predicted.json"))["rows"]
print(f"{'T':>6} {'path':10} {'measured alloc':>15} {'predicted':>15} {'diff':>5} {'res diff':>8} {'nvml-res':>9} eq")
for a, b in zip(m, p):
    print(f"{a['tokens']:>6} {a['path']:10} {a['peak_allocated_bytes']:>15} {b['peak_allocated_bytes']:>15} "
          f"{a['peak_allocated_bytes'] - b['peak_allocated_bytes']:>5} {a['peak_reserved_bytes'] - b['peak_reserved_bytes']:>8} "
          f"{(a['nvml_peak_bytes'] or 0) - a['peak_reserved_bytes']:>9} {a['outputs_equal']}")
PY
