#!/usr/bin/env bash
# GPU checks of issue 5 in one call: the gate's tests, a measured baseline written by
# `mlamem gate --update` and a second measured run that must pass, the predicted gate on this
# machine, and the run-to-run noise of every gated figure over 5 profile sweeps per shipped
# scenario (benchmarks/gate_noise.py), which sets the measured default tolerances in
# mlamem/gate.py (MEASURED).
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-5.sh
source "$(dirname "$0")/gpu-env.sh"
mkdir -p "$OUT/noise"
start=$(date +%s)

python3 -m pytest -q tests/test_gate.py tests/test_gate_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -5

# A measured baseline of every shipped scenario, then the same sweep again against it.
python3 -m mlamem gate --baseline "$OUT/measured-baseline.json" --update 2>&1 | tee "$OUT/gate-update.log"
echo "gate --update exit code: ${PIPESTATUS[0]}" | tee -a "$OUT/gate-update.log"
python3 -m mlamem gate --baseline "$OUT/measured-baseline.json" > "$OUT/gate-rerun.md" 2> "$OUT/gate-rerun.err"
echo "gate rerun (default measured tolerances) exit code: $?" | tee -a "$OUT/gate-rerun.md"
python3 -m mlamem gate --baseline "$OUT/measured-baseline.json" --tolerance 0 > "$OUT/gate-rerun-exact.md" 2>&1
echo "gate rerun (--tolerance 0) exit code: $?" | tee -a "$OUT/gate-rerun-exact.md"
cat "$OUT/gate-rerun.md"

# The prediction on this machine: the committed predicted baselines (made on a CPU without
# flash_mla, hence --allow-env-change), and byte-exact against the measured baseline.
python3 -m mlamem gate --baseline reports/baselines/predicted.json --predict --allow-env-change \
    > "$OUT/gate-predicted.md" 2>&1
echo "predicted gate vs reports/baselines exit code: $?" | tee -a "$OUT/gate-predicted.md"
python3 -m mlamem gate --baseline "$OUT/measured-baseline.json" --predict --allow-env-change \
    --tolerance 0 > "$OUT/gate-predicted-vs-measured.md" 2>&1
echo "predicted vs measured baseline (--tolerance 0) exit code: $?" | tee -a "$OUT/gate-predicted-vs-measured.md"

# Noise: 5 measured sweeps per shipped scenario, each in a fresh process.
for run in 1 2 3 4 5; do
    for s in deepseek-v32-fp8-tp8 glm5-fp8-tp8 kimi-k2-fp8-tp4-dp; do
        python3 -m mlamem profile --scenario "$s" --require-gpu --format json \
            --output "$OUT/noise/run$run-$s.json" 2>> "$OUT/noise/profile.err" \
            || echo "profile run $run $s failed" | tee -a "$OUT/noise/profile.err"
    done
done
python3 benchmarks/gate_noise.py "$OUT"/noise/run*.json | tee "$OUT/gate-noise.md"
echo "noise command: for run in 1..5, each shipped scenario: python3 -m mlamem profile --scenario S --require-gpu --format json --output run\$run-S.json; then python3 benchmarks/gate_noise.py run*.json" | tee -a "$OUT/gate-noise.md"
echo "total wall time: $(( $(date +%s) - start )) s" | tee "$OUT/wall-time.txt"
