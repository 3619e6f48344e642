#!/usr/bin/env bash
# The sharded GitHub Actions example of docs/ci.md ("In GitHub Actions"), run on one machine, predicted on
# a CPU: each matrix job (shard I of 4: the profiles and the gate), then the report job (merge,
# report). Its mlamem lines are the docs', with ${{ matrix.shard }} written $shard;
# tests/test_shards.py checks that, runs this script, and compares the merged profiles with
# unsharded ones. This repository's reports/baselines/predicted.json stands in for the
# ci/mlamem-predicted.json a user commits.
# Usage: bash scripts/sharded-sweep.sh OUTDIR   (OUTDIR gets the shards, merged files and report)
set -euo pipefail
out=${1:?usage: bash scripts/sharded-sweep.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/ci"
cp "$root/reports/baselines/predicted.json" "$out/ci/mlamem-predicted.json"
cd "$out"

for shard in 1 2 3 4; do  # the matrix, one job after another
  for scenario in glm5-fp8-tp8 deepseek-v32-fp8-tp8; do
    mlamem profile --predict --scenario $scenario --tokens 1024,8192,16384,32768 --shard $shard/4 --format json --output profile-$scenario-shard-$shard.json
  done
  mlamem gate --baseline ci/mlamem-predicted.json --predict --shard $shard/4
done

# the report job
for scenario in glm5-fp8-tp8 deepseek-v32-fp8-tp8; do
  mlamem merge profile-$scenario-shard-*.json --output profile-$scenario.json
done
mlamem report profile-*-shard-*.json --output report.md
