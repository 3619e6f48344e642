#!/usr/bin/env bash
# mlamem's checks on a CUDA GPU (the project measures on an NVIDIA H200), by suite.
#
# Usage, in the repo root:  bash scripts/gpu-check.sh [--suite SUITE[,SUITE...]] OUTDIR
#
# Suites (default: all, in this order):
#   tests          the whole test suite, CPU and GPU tests (python3 -m pytest -q -rs tests)
#   profile        the default sweep measured (JSON, with its wall time from process start),
#                  in Markdown and predicted; the other decode scenarios in Markdown; the
#                  profiler's overhead (benchmarks/overhead.py); measured against predicted
#   validate       `mlamem validate` over every shipped scenario (JSON, Markdown); the GLM-5
#                  breakdown at T=32768; a snapshot at T=1024; the profile table
#   repro          the repro tests; `mlamem repro-oom` at the GLM-5 defaults (JSON with its wall
#                  time, Markdown, predicted JSON); the other decode scenarios in Markdown; the
#                  --expect-oom/--expect-fit exit code
#   context-reuse  the context-MLA reuse reproduction three ways (JSON; Markdown with its
#                  expectations) and its GPU test; `mlamem plan` for it and a GLM-5 sweep
#   gate           the gate's tests; a measured baseline (--update), a rerun against it (default
#                  tolerances and --tolerance 0); the predicted gate against the committed and
#                  the measured baselines; run-to-run noise of 5 profile sweeps per decode
#                  scenario (benchmarks/gate_noise.py), which sets mlamem/gate.py's MEASURED
#   triton         the Triton decode's GPU tests; `profile --kernel triton` over its three
#                  paths, measured and predicted, and FlashMLA's alloc column; the acceptance
#                  lines (scripts/triton_acceptance.py); the throughput benchmark against
#                  FlashMLA with lse errors (BENCH_ARGS=--sweep adds the other launch configs,
#                  BENCH_TIMEOUT its time limit, default 150 s)
#   report         `mlamem profile --report` on the GPU, then one `mlamem report` over this
#                  run's results (repro, context-reuse, triton; the committed ones in reports/
#                  for suites not run)
#   non-torch      scripts/non_torch_probe.py step-ops (the figures of mlamem/non_torch.toml);
#                  repro-oom for every shipped scenario at its defaults, measured and
#                  predicted, compared field by field by scripts/compare_repro.py
#   kernels        every kernel and operation (issue 14): scripts/kernel_trace.py (schemas, head
#                  counts, allocator traces, errors against fp32); the operations' GPU tests;
#                  `validate --kernel K --op OP` for every supported pair (and two unsupported,
#                  exit 2); profiles with --bench of flashmla and flashmla-vllm for each
#                  operation (GLM-5 prefill also at 64 heads per rank); `mlamem compare` of the
#                  two builds per operation; `mlamem kernels`
#   flashinfer     FlashInfer's MLA dense decode (needs .whl/flashinfer, installed by gpu-env.sh):
#                  its GPU tests, validate, profile --bench and compare against flashmla
#   kernels-oom    repro-oom and a measured gate (GLM-5) with --kernel flashmla-vllm beside
#                  flashmla; the operations' GPU tests
#   graphs         CUDA-graph pools (issue 15): the graphs' GPU tests; `mlamem graphs` at the
#                  GLM-5 defaults (vLLM's 51 FULL decode graphs) with flashmla and
#                  flashmla-vllm, measured (JSON, Markdown, --report) and predicted;
#                  `validate --graphs` for both; DeepSeek-V3.2 at GRAPH_SIZES; Triton's three
#                  paths; repro-oom with --cuda-graphs on, measured and predicted
#   native         mlamem's own decode at native heads (issue 17): the Gluon kernel against the
#                  Triton one at every head count (scripts/gluon_compile.py --check); the
#                  Triton GPU tests (every design against FlashMLA); `profile --kernel
#                  triton-native` at GLM-5 and DeepSeek-V3.2 TP8, measured and predicted;
#                  `validate --kernel triton-native`; ncu of one call each of triton-native (8
#                  heads), triton (64) and FlashMLA's padded call, T=8192 from the 4 GiB pool,
#                  where ncu exists
#   native-bench   its speed targets (issue 17): the benchmark's sweep of designs and launch
#                  configs at T=8192 (--sweep), then both parts at every T in the default and
#                  fallback configs, with lse (benchmarks/triton_vs_flashmla.py)
#   gluon-designs  the Gluon designs not yet measured (gluon-early-indices, gluon-bf16-scale):
#                  every design against the Triton kernel (gluon_compile.py --check) and
#                  against FlashMLA (the GPU tests); the benchmark at T=8192 and 32768, both
#                  pools and both ranks, every Gluon design beside the default; ncu of
#                  gluon-bf16-scale at 8 heads (stalls, and the source page's per-instruction
#                  counters, which name the bank-conflicted shared stores)
#   api            the Python API, pytest plugin, plug-in kernels and shards (issue 16): their
#                  tests (profile_call against `mlamem profile` on FlashMLA, the marks on the
#                  Triton decode, the README's examples on CUDA); the README's plugin example
#                  file run verbosely; a measured sweep in two shards, merged, against the
#                  unsharded sweep (scripts/compare_sweeps.py), and a measured gate shard
#
# Setup: scripts/gpu-env.sh installs .whl/*.whl (FlashMLA) and this checkout into /tmp/site,
# .whl/flashinfer/*.whl (FlashInfer) beside it, and points MLAMEM_VLLM_FLASHMLA at .whl/vllm/
# (vLLM's FlashMLA libraries, taken out of the wheel as the README says) when they are there.
# Results: every suite writes into results/SUITE/ of a scratch folder (printed at the start);
# after every step the whole results/ folder is packed into OUTDIR/results.tar.gz, since a
# remote GPU machine may hand back only a few files. OUTDIR/console.log is the console output.
# Each step's exit code is in results/SUITE/exit-codes.txt; the script exits 1 if any step
# exited non-zero (every step here is expected to exit 0), 2 on bad usage.
set -uo pipefail
SUITES_ALL=(tests profile validate repro context-reuse gate triton report non-torch kernels
            flashinfer kernels-oom graphs api native native-bench gluon-designs)

usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
fail_usage() { echo "gpu-check.sh: $1" >&2; echo "usage: bash scripts/gpu-check.sh [--suite SUITE[,SUITE...]] OUTDIR" >&2; exit 2; }

suites=all OUTDIR=
while [ $# -gt 0 ]; do
    case $1 in
        --suite) [ $# -ge 2 ] || fail_usage "--suite needs a value"; suites=$2; shift 2 ;;
        --suite=*) suites=${1#--suite=}; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) fail_usage "unknown option $1" ;;
        *) [ -z "$OUTDIR" ] || fail_usage "one OUTDIR only, got $OUTDIR and $1"; OUTDIR=$1; shift ;;
    esac
done
[ -n "$OUTDIR" ] || fail_usage "give OUTDIR, the folder for results.tar.gz"
if [ "$suites" = all ]; then
    SUITES=("${SUITES_ALL[@]}")
else
    IFS=, read -r -a SUITES <<< "$suites"
    [ ${#SUITES[@]} -gt 0 ] || fail_usage "--suite needs a value"
    for s in "${SUITES[@]}"; do
        [[ " ${SUITES_ALL[*]} " == *" $s "* ]] \
            || fail_usage "unknown suite '$s'; expected all or one of: ${SUITES_ALL[*]}"
    done
fi
[ -f pyproject.toml ] && [ -d kernels ] || fail_usage "run it in the repo root"
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mlamem-gpu-check.XXXXXX")
exec > >(tee -a "$OUTDIR/console.log") 2>&1
echo "suites: ${SUITES[*]}; results in $WORK/results, packed into $OUTDIR/results.tar.gz"

# shellcheck source=scripts/gpu-env.sh
source "$(dirname "$0")/gpu-env.sh" || { echo "gpu-check.sh: setup failed"; exit 1; }
mkdir -p "$WORK/results"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__)"
    git log -1 --format='commit %h %s' 2>/dev/null || true
} | tee "$WORK/results/gpu.txt"

FAILED=()
pack() {
    tar -czf "$OUTDIR/results.tar.gz.part" -C "$WORK" results \
        && mv "$OUTDIR/results.tar.gz.part" "$OUTDIR/results.tar.gz"
}
# step NAME CMD...: runs CMD with its output shown and saved as $R/NAME.log, records its exit
# code, and packs the results.
step() {
    local name=$1
    shift
    "$@" 2>&1 | tee "$R/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "$name: exit $rc" >> "$R/exit-codes.txt"
    [ "$rc" -eq 0 ] || { FAILED+=("$SUITE/$name (exit $rc)"); echo "^ $SUITE/$name: exit $rc"; }
    pack
    return "$rc"
}
# timed NAME CMD...: step, with the wall time from process start in $R/NAME-time.txt.
timed() {
    local name=$1 start end
    shift
    start=$(date +%s%N)
    step "$name" "$@"
    end=$(date +%s%N)
    echo "$* : $(((end - start) / 1000000)) ms from process start" | tee "$R/$name-time.txt"
}

MLAMEM=(python3 -m mlamem)
TOKENS=1024,8192,16384,32768
DECODE_SCENARIOS=(deepseek-v32-fp8-tp8 glm5-fp8-tp8 kimi-k2-fp8-tp4-dp)

suite_tests() {
    step pytest python3 -m pytest -q -rs tests
}

suite_profile() {
    timed profile-json "${MLAMEM[@]}" profile --format json --output "$R/glm5-fp8-tp8.json"
    step profile-md "${MLAMEM[@]}" profile --format markdown --output "$R/glm5-fp8-tp8.md"
    step profile-predicted "${MLAMEM[@]}" profile --predict --format json \
        --output "$R/glm5-fp8-tp8.predicted.json"
    for s in deepseek-v32-fp8-tp8 kimi-k2-fp8-tp4-dp; do
        step "profile-$s" "${MLAMEM[@]}" profile --scenario "$s" --format markdown --output "$R/$s.md"
    done
    step overhead python3 benchmarks/overhead.py
    step measured-vs-predicted python3 - "$R" <<'PY'
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
}

suite_validate() {
    local tokens=1024,4096,8192,16384,32768
    step validate-json "${MLAMEM[@]}" validate --tokens "$tokens" --format json --output "$R/validate-h200.json"
    step validate-md "${MLAMEM[@]}" validate --tokens "$tokens" --format markdown --output "$R/validate-h200.md"
    step breakdown "${MLAMEM[@]}" profile --tokens 32768 --breakdown --format markdown \
        --output "$R/glm5-breakdown-32768.md"
    step snapshot "${MLAMEM[@]}" profile --tokens 1024 --snapshot "$R/glm5-t1024-h200.snapshot.pickle" \
        --format json --output "$R/glm5-t1024.json"
    step profile-table "${MLAMEM[@]}" profile --tokens "$TOKENS"
}

suite_repro() {
    step pytest python3 -m pytest -q tests/test_repro.py tests/test_repro_gpu.py
    timed repro-json "${MLAMEM[@]}" repro-oom --format json --output "$R/glm5-fp8-tp8.json"
    step repro-md "${MLAMEM[@]}" repro-oom --format markdown --output "$R/glm5-fp8-tp8.md"
    step repro-predicted "${MLAMEM[@]}" repro-oom --predict --format json \
        --output "$R/glm5-fp8-tp8.predicted.json"
    for s in deepseek-v32-fp8-tp8 kimi-k2-fp8-tp4-dp; do
        step "repro-$s" "${MLAMEM[@]}" repro-oom --scenario "$s" --format markdown --output "$R/$s.md"
    done
    step expectations "${MLAMEM[@]}" repro-oom --expect-oom alloc --expect-fit workspace
}

suite_context-reuse() {
    local ctx=(--scenario kimi-k2-context-reuse)
    step pytest python3 -m pytest -q tests/test_repro_gpu.py -k context_reuse
    step repro-json "${MLAMEM[@]}" repro-oom "${ctx[@]}" --format json --output "$R/kimi-k2-context-reuse.json"
    step repro-md "${MLAMEM[@]}" repro-oom "${ctx[@]}" --format markdown \
        --output "$R/kimi-k2-context-reuse.md" --expect-oom none --expect-oom fp8 --expect-fit full
    step plan "${MLAMEM[@]}" plan "${ctx[@]}" --format markdown --output "$R/plan-kimi-k2-context-reuse.md"
    step plan-glm5-sweep "${MLAMEM[@]}" plan --sweep max-seq-len=131072,786432 --format markdown \
        --output "$R/plan-glm5-sweep.md"
}

suite_gate() {
    local baseline=$R/measured-baseline.json
    step pytest python3 -m pytest -q tests/test_gate.py tests/test_gate_gpu.py
    step gate-update "${MLAMEM[@]}" gate --baseline "$baseline" --update
    step gate-rerun "${MLAMEM[@]}" gate --baseline "$baseline"
    step gate-rerun-exact "${MLAMEM[@]}" gate --baseline "$baseline" --tolerance 0
    # the committed predicted baselines were made on a CPU without flash_mla: another environment
    step gate-predicted "${MLAMEM[@]}" gate --baseline reports/baselines/predicted.json --predict \
        --allow-env-change
    step gate-predicted-vs-measured "${MLAMEM[@]}" gate --baseline "$baseline" --predict \
        --allow-env-change --tolerance 0
    mkdir -p "$R/noise"
    local run s
    for run in 1 2 3 4 5; do
        for s in "${DECODE_SCENARIOS[@]}"; do
            step "noise-run$run-$s" "${MLAMEM[@]}" profile --scenario "$s" --require-gpu \
                --format json --output "$R/noise/run$run-$s.json"
        done
    done
    step gate-noise python3 benchmarks/gate_noise.py "$R"/noise/run*.json
}

suite_triton() {
    local profile=("${MLAMEM[@]}" profile --kernel triton --tokens "$TOKENS"
                   --paths alloc,workspace,workspace-full)
    step pytest timeout 150 python3 -m pytest -q -rs tests/test_triton_decode_gpu.py
    step triton-md timeout 60 "${profile[@]}" --format markdown --output "$R/triton-profile.md"
    step triton-json timeout 60 "${profile[@]}" --format json --output "$R/triton-profile.json"
    step triton-predicted-md timeout 60 "${profile[@]}" --predict --format markdown \
        --output "$R/triton-profile-predicted.md"
    step triton-predicted-json timeout 60 "${profile[@]}" --predict --format json \
        --output "$R/triton-profile-predicted.json"
    step flashmla-alloc timeout 60 "${MLAMEM[@]}" profile --kernel flashmla --tokens "$TOKENS" \
        --paths alloc --format json --output "$R/flashmla-alloc.json"
    step triton-breakdown timeout 60 "${MLAMEM[@]}" profile --kernel triton --tokens 32768 --breakdown \
        --format markdown --output "$R/triton-breakdown-32768.md"
    step acceptance python3 scripts/triton_acceptance.py "$R"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
    step triton-vs-flashmla timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/triton_vs_flashmla.py \
        --lse ${BENCH_ARGS:-} --json "$R/triton-vs-flashmla.json"
}

# this run's result of another suite, or the committed one
result_of() { if [ -f "$WORK/results/$1" ]; then echo "$WORK/results/$1"; else echo "$2"; fi; }

suite_report() {
    step profile-report timeout 60 "${MLAMEM[@]}" profile --report "$R/profile-report"
    mkdir -p "$R/report"
    step report timeout 60 "${MLAMEM[@]}" report "$R/profile-report/"*.json \
        "$(result_of repro/glm5-fp8-tp8.json reports/repro-oom-h200/glm5-fp8-tp8.json)" \
        "$(result_of context-reuse/kimi-k2-context-reuse.json reports/context-reuse-h200/kimi-k2-context-reuse.json)" \
        "$(result_of triton/triton-profile.json reports/triton-h200/triton-profile.json)" \
        --output "$R/report/report.md"
}

suite_non-torch() {
    # the figures of mlamem/non_torch.toml, then every shipped scenario's repro-oom at its
    # defaults, measured and predicted, compared field by field (reports/non-torch-h200)
    for s in glm5-fp8-tp8 kimi-k2-fp8-tp4-dp; do
        step "probe-$s" python3 scripts/non_torch_probe.py step-ops "$s"
    done
    for s in glm5-fp8-tp8 deepseek-v32-fp8-tp8 kimi-k2-fp8-tp4-dp kimi-k2-context-reuse; do
        step "repro-$s" "${MLAMEM[@]}" repro-oom -s "$s" --format json --output "$R/$s.json"
        step "predicted-$s" "${MLAMEM[@]}" repro-oom -s "$s" --predict --format json \
            --output "$R/$s.predicted.json"
        step "compare-$s" python3 scripts/compare_repro.py "$R/$s.json" "$R/$s.predicted.json"
    done
}

# glm5_64_heads FILE: GLM-5 at tensor_parallel 1 (64 heads per rank), for the prefill at 64 heads
glm5_64_heads() {
    sed -e 's/^tensor_parallel = 8 .*/tensor_parallel = 1/' \
        -e 's/^name = "glm5-fp8-tp8"/name = "glm5-fp8-tp1-64-heads"/' \
        "$(python3 -c 'import mlamem.scenarios, pathlib; print(pathlib.Path(mlamem.scenarios.__file__).parent)')/glm5-fp8-tp8.toml" \
        > "$1"
}

suite_flashinfer() {
    local s=kimi-k2-dense-tp4-dp
    step pytest timeout 300 python3 -m pytest -q -rs tests/test_flashinfer_mla.py
    step validate timeout 300 "${MLAMEM[@]}" validate --kernel flashinfer --op dense-decode \
        --format json --output "$R/validate-flashinfer-dense-decode.json"
    step profile timeout 120 "${MLAMEM[@]}" profile --kernel flashinfer --op dense-decode -s "$s" \
        --bench --format json --output "$R/profile-flashinfer-$s.json"
    step compare timeout 300 "${MLAMEM[@]}" compare --kernels flashmla,flashinfer --op dense-decode \
        -s "$s" --format json --output "$R/compare-flashmla-flashinfer-$s.json"
}

suite_kernels() {
    step kernels "${MLAMEM[@]}" kernels
    step trace timeout 300 python3 scripts/kernel_trace.py "$R/kernel-trace.json"
    step pytest timeout 400 python3 -m pytest -q -rs tests/test_operations_gpu.py
    local k op s
    for k in flashmla flashmla-vllm; do
        for op in sparse-decode dense-decode sparse-prefill; do
            step "validate-$k-$op" timeout 300 "${MLAMEM[@]}" validate --kernel "$k" --op "$op" \
                --format json --output "$R/validate-$k-$op.json"
        done
    done
    step validate-triton timeout 300 "${MLAMEM[@]}" validate --kernel triton --op sparse-decode \
        -s glm5-fp8-tp8 --format json --output "$R/validate-triton-sparse-decode.json"
    "${MLAMEM[@]}" validate --kernel triton --op dense-decode > "$R/unsupported.log" 2>&1
    echo "validate --kernel triton --op dense-decode: exit $? (expected 2)" | tee -a "$R/unsupported.log"
    "${MLAMEM[@]}" validate --kernel reference >> "$R/unsupported.log" 2>&1
    echo "validate --kernel reference: exit $? (expected 2)" | tee -a "$R/unsupported.log"
    glm5_64_heads "$R/glm5-64-heads.toml"
    step validate-flashmla-vllm-prefill-64-heads timeout 300 "${MLAMEM[@]}" validate \
        --kernel flashmla-vllm --op sparse-prefill -s "$R/glm5-64-heads.toml" --format json \
        --output "$R/validate-flashmla-vllm-prefill-64-heads.json"
    for k in flashmla flashmla-vllm; do
        step "profile-$k-sparse-decode" timeout 120 "${MLAMEM[@]}" profile --kernel "$k" \
            --tokens "$TOKENS" --bench --format json --output "$R/profile-$k-sparse-decode.json"
        for s in kimi-k2-dense-tp4-dp kimi-k2-dense-fp8-tp4-dp; do
            step "profile-$k-$s" timeout 120 "${MLAMEM[@]}" profile --kernel "$k" --op dense-decode \
                -s "$s" --bench --format json --output "$R/profile-$k-$s.json"
        done
        for s in glm5-fp8-tp8 "$R/glm5-64-heads.toml"; do
            step "profile-$k-prefill-$(basename "$s" .toml)" timeout 120 "${MLAMEM[@]}" profile \
                --kernel "$k" --op sparse-prefill -s "$s" --bench --format json \
                --output "$R/profile-$k-prefill-$(basename "$s" .toml).json"
        done
    done
    step acceptance-md "${MLAMEM[@]}" profile --kernel flashmla-vllm --tokens "$TOKENS" \
        --format markdown --output "$R/profile-flashmla-vllm.md"
    step compare-sparse-decode timeout 300 "${MLAMEM[@]}" compare --op sparse-decode \
        --tokens "$TOKENS" --format json --output "$R/compare-sparse-decode.json"
    step compare-sparse-prefill timeout 300 "${MLAMEM[@]}" compare --op sparse-prefill \
        --tokens 1024,8192,16384 --format json --output "$R/compare-sparse-prefill.json"
    for s in kimi-k2-dense-tp4-dp kimi-k2-dense-fp8-tp4-dp; do
        step "compare-$s" timeout 300 "${MLAMEM[@]}" compare --op dense-decode -s "$s" \
            --format json --output "$R/compare-$s.json"
    done
}

suite_kernels-oom() {
    local k
    for k in flashmla flashmla-vllm; do
        step "repro-$k" timeout 300 "${MLAMEM[@]}" repro-oom --kernel "$k" --format json \
            --output "$R/repro-$k.json"
        step "repro-$k-predicted" timeout 300 "${MLAMEM[@]}" repro-oom --kernel "$k" --predict \
            --format json --output "$R/repro-$k.predicted.json"
        step "repro-$k-compare" python3 scripts/compare_repro.py "$R/repro-$k.json" \
            "$R/repro-$k.predicted.json"
    done
    step repro-flashmla-vllm-md "${MLAMEM[@]}" repro-oom --kernel flashmla-vllm --format markdown \
        --output "$R/repro-flashmla-vllm.md" --expect-oom alloc --expect-fit workspace
    step pytest timeout 200 python3 -m pytest -q -rs tests/test_operations_gpu.py
    step gate-update timeout 300 "${MLAMEM[@]}" gate --kernel flashmla-vllm -s glm5-fp8-tp8 \
        --baseline "$R/measured-flashmla-vllm.json" --update
    step gate-rerun timeout 300 "${MLAMEM[@]}" gate --baseline "$R/measured-flashmla-vllm.json"
}

GRAPH_SIZES=256,128,64,32,16,8,4,2,1  # DeepSeek-V3.2: the FULL graphs of max_num_seqs 256
suite_graphs() {
    local k
    step pytest timeout 300 python3 -m pytest -q -rs tests/test_graphs_gpu.py tests/test_graphs.py \
        tests/test_allocator.py
    for k in flashmla flashmla-vllm; do
        timed "graphs-$k" "${MLAMEM[@]}" graphs --kernel "$k" --format json \
            --output "$R/graphs-glm5-$k.json"
        step "graphs-$k-md" "${MLAMEM[@]}" graphs --kernel "$k" --format markdown \
            --output "$R/graphs-glm5-$k.md"
        step "graphs-$k-predicted" "${MLAMEM[@]}" graphs --kernel "$k" --predict --format json \
            --output "$R/graphs-glm5-$k.predicted.json"
        step "validate-graphs-$k" "${MLAMEM[@]}" validate --graphs -s glm5-fp8-tp8 --kernel "$k" \
            --format json --output "$R/validate-graphs-glm5-$k.json"
        step "validate-graphs-deepseek-$k" "${MLAMEM[@]}" validate --graphs \
            -s deepseek-v32-fp8-tp8 --kernel "$k" --capture-sizes "$GRAPH_SIZES" --format json \
            --output "$R/validate-graphs-deepseek-$k.json"
    done
    step graphs-deepseek "${MLAMEM[@]}" graphs -s deepseek-v32-fp8-tp8 \
        --capture-sizes "$GRAPH_SIZES" --format json --output "$R/graphs-deepseek-flashmla.json"
    step graphs-deepseek-md "${MLAMEM[@]}" graphs -s deepseek-v32-fp8-tp8 \
        --capture-sizes "$GRAPH_SIZES" --format markdown --output "$R/graphs-deepseek-flashmla.md"
    step graphs-triton "${MLAMEM[@]}" graphs --kernel triton --format json \
        --output "$R/graphs-glm5-triton.json"
    step graphs-report "${MLAMEM[@]}" graphs --report "$R/report-glm5" --format markdown
    step graphs-table "${MLAMEM[@]}" graphs --capture-sizes 512,256,8,1
    if "${MLAMEM[@]}" repro-oom --help | grep -q -- --cuda-graphs; then
        step repro-graphs timeout 400 "${MLAMEM[@]}" repro-oom --cuda-graphs on --format json \
            --output "$R/repro-graphs-glm5.json"
        step repro-graphs-predicted timeout 300 "${MLAMEM[@]}" repro-oom --cuda-graphs on \
            --predict --format json --output "$R/repro-graphs-glm5.predicted.json"
        step repro-graphs-md "${MLAMEM[@]}" repro-oom --cuda-graphs on --format markdown \
            --output "$R/repro-graphs-glm5.md"
    fi
}

suite_native() {
    local s k
    step gluon-check timeout 300 python3 scripts/gluon_compile.py --check
    step pytest timeout 400 python3 -m pytest -q -rs --junitxml="$R/junit.xml" \
        tests/test_triton_decode_gpu.py tests/test_triton_decode.py
    for s in glm5-fp8-tp8 deepseek-v32-fp8-tp8; do
        step "profile-$s" timeout 120 "${MLAMEM[@]}" profile --kernel triton-native -s "$s" \
            --tokens "$TOKENS" --format json --output "$R/native-profile-$s.json"
        step "profile-$s-predicted" "${MLAMEM[@]}" profile --kernel triton-native -s "$s" \
            --tokens "$TOKENS" --predict --format json --output "$R/native-profile-$s.predicted.json"
    done
    step validate timeout 300 "${MLAMEM[@]}" validate --kernel triton-native \
        -s glm5-fp8-tp8,deepseek-v32-fp8-tp8 --format json --output "$R/native-validate.json"
    if command -v ncu > /dev/null; then
        for k in "triton-native 8" "triton 64" "flashmla 8"; do
            set -- $k
            step "ncu-$1-$2" timeout 120 ncu --nvtx --nvtx-include "decode/" --set full \
                -o "$R/ncu-$1-$2" python3 scripts/decode_call.py --kernel "$1" --heads "$2" \
                --tokens 8192
            step "ncu-$1-$2-details" ncu --import "$R/ncu-$1-$2.ncu-rep" --page details
            step "ncu-$1-$2-stalls" python3 scripts/ncu_stalls.py "$R/ncu-$1-$2.ncu-rep"
        done
    else
        echo "ncu not found: no Nsight Compute breakdown" | tee "$R/ncu-missing.txt"
    fi
}

suite_native-bench() {
    step sweep timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/triton_vs_flashmla.py --sweep \
        --tokens 8192 --rank-tokens 8192 --json "$R/triton-vs-flashmla-sweep.json"
    step bench timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/triton_vs_flashmla.py --lse \
        --json "$R/triton-vs-flashmla.json"
}

suite_gluon-designs() {
    local d
    step gluon-check timeout 400 python3 scripts/gluon_compile.py --check --heads 8,16,64
    step pytest timeout 300 python3 -m pytest -q -rs --junitxml="$R/junit.xml" \
        tests/test_triton_decode_gpu.py -k "every_design and gluon"
    step bench timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/triton_vs_flashmla.py \
        --rank-tokens 8192,32768 --json "$R/triton-vs-flashmla.json"
    if command -v ncu > /dev/null; then
        for d in gluon-bf16-scale gluon; do
            step "ncu-$d-8" timeout 120 ncu --nvtx --nvtx-include "decode/" --set full \
                --import-source yes -o "$R/ncu-$d-8" python3 scripts/decode_call.py \
                --kernel triton-native --design "$d" --heads 8 --tokens 8192
            step "ncu-$d-8-stalls" python3 scripts/ncu_stalls.py "$R/ncu-$d-8.ncu-rep"
            step "ncu-$d-8-details" ncu --import "$R/ncu-$d-8.ncu-rep" --page details
            step "ncu-$d-8-source" ncu --import "$R/ncu-$d-8.ncu-rep" --page source --csv \
                --print-source sass
            rm -f "$R/ncu-$d-8.ncu-rep"  # 6 to 8 MB each: the pages above are what comes back
        done
    else
        echo "ncu not found: no Nsight Compute breakdown" | tee "$R/ncu-missing.txt"
    fi
}

suite_api() {
    local i
    step pytest timeout 500 python3 -m pytest -q -rs --junitxml="$R/junit.xml" \
        tests/test_api_gpu.py tests/test_api.py tests/test_pytest_plugin.py \
        tests/test_api_readme.py tests/test_plugin_kernel.py tests/test_shards.py
    python3 - "$R/test_pad_heads.py" <<'PY'
import re, sys
text = open("README.md").read()
section = text[text.index("## Use it from Python and pytest"):]
open(sys.argv[1], "w").write(re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)[1])
PY
    step plugin-example python3 -m pytest -v -p no:cacheprovider "$R/test_pad_heads.py"
    step profile-unsharded "${MLAMEM[@]}" profile --tokens "$TOKENS" --format json \
        --output "$R/profile-unsharded.json"
    for i in 1 2; do
        step "profile-shard-$i" "${MLAMEM[@]}" profile --tokens "$TOKENS" --shard "$i/2" \
            --format json --output "$R/profile-shard-$i.json"
    done
    step merge "${MLAMEM[@]}" merge "$R/profile-shard-1.json" "$R/profile-shard-2.json" \
        --output "$R/profile-merged.json"
    step compare-sweeps python3 scripts/compare_sweeps.py "$R/profile-merged.json" \
        "$R/profile-unsharded.json"
    step gate-update "${MLAMEM[@]}" gate --baseline "$R/baseline.json" -s glm5-fp8-tp8 --update
    for i in 1 2; do
        step "gate-shard-$i" "${MLAMEM[@]}" gate --baseline "$R/baseline.json" \
            -s glm5-fp8-tp8 --shard "$i/2"
    done
    mkdir -p "$R/report"
    step report "${MLAMEM[@]}" report "$R/profile-shard-1.json" "$R/profile-shard-2.json" \
        --output "$R/report/report.md"
}

for SUITE in "${SUITES[@]}"; do
    R=$WORK/results/$SUITE
    mkdir -p "$R"
    echo "=== $SUITE"
    "suite_$SUITE"
done
pack
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu-check.sh: ${#FAILED[@]} step(s) exited non-zero: ${FAILED[*]}"
    exit 1
fi
echo "gpu-check.sh: every step exited 0"
