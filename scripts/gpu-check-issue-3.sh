#!/usr/bin/env bash
# GPU checks of issue 3 in one call: tests, `mlamem validate` over every shipped scenario,
# the GLM-5 breakdown at T=32768, and a small snapshot recorded for the CPU test fixture.
# Usage (repo root, flash_mla wheel in .whl/):  OUT=/some/dir bash scripts/gpu-check-issue-3.sh
set -uo pipefail
OUT=${OUT:-/tmp/mlamem-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

python3 -m pytest -q tests 2>&1 | tail -5
python3 -m mlamem validate --tokens 1024,4096,8192,16384,32768 --format json --output "$OUT/validate-h200.json"
echo "validate exit code: $?"
python3 -m mlamem validate --tokens 1024,4096,8192,16384,32768 --format markdown --output "$OUT/validate-h200.md"
python3 -m mlamem profile --tokens 32768 --breakdown --format markdown --output "$OUT/glm5-breakdown-32768.md"
python3 -m mlamem profile --tokens 1024 --snapshot "$OUT/glm5-t1024-h200.snapshot.pickle" --format json --output "$OUT/glm5-t1024.json"
python3 -m mlamem profile --tokens 1024,8192,16384,32768 | tee "$OUT/profile-table.txt"
cat "$OUT/glm5-breakdown-32768.md"
cat "$OUT/validate-h200.md"
