"""mlamem's checks on a CUDA GPU (an H200), by suite: the GPU tests' assertions (tests/*_gpu.py),
the benchmarks, and the CLI runs that write reports. In the repo root:

    python3 scripts/gpu_check.py [--suite SUITE[,SUITE...]] [--list] OUTDIR

Sets up with scripts/gpu-env.sh (FlashMLA's wheels from .whl/, this checkout into /tmp/site),
runs each command with PYTHONUNBUFFERED=1, its log results/SUITE/NN-NAME.log beside the JSON it
writes, and after each packs results/ into OUTDIR/results.tar.gz (a GPU machine hands back a
few files; .ncu-rep files stay out, their pages go in). Prints a table last (suite, command,
exit code, seconds; also OUTDIR/summary.txt). Exits 1 if a command failed, 2 on bad usage.
--list names the suites (with --suite, their commands). A missing program (ncu) is skipped.
"""

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

TIMEOUT_S = 570  # per command: a suite is meant to fit in one 10-minute call
SHIPPED_REPRO = "tests/test_repro_shipped_gpu.py"  # alone: a CUDA context in pytest is a neighbour
NEIGHBOUR = "tests/test_noisy_neighbour_gpu.py"  # alone: six fresh mlamem runs, half beside a neighbour
SLOW_GPU_TESTS = (SHIPPED_REPRO, NEIGHBOUR, "tests/test_repro_gpu.py",
                  "tests/test_triton_decode_gpu.py", "tests/test_shards_gpu.py")
GPU_TEST_FILES = "tests/*_gpu.py"  # the files whose tests need CUDA (skipped without it)
# the fast ones, named (pytest's --ignore does not drop a file named on its command line)
FAST_GPU_TESTS = " ".join(sorted(f"tests/{p.name}" for p in (Path(__file__).parent.parent / "tests")
                                 .glob("*_gpu.py") if f"tests/{p.name}" not in SLOW_GPU_TESTS))
T = "--tokens 1024,8192,16384,32768"
DECODE = ("deepseek-v32-fp8-tp8", "glm5-fp8-tp8", "kimi-k2-fp8-tp4-dp")
DENSE = ("kimi-k2-dense-tp4-dp", "kimi-k2-dense-fp8-tp4-dp")
BUILDS = ("flashmla", "flashmla-vllm")
OPS = ("sparse-decode", "dense-decode", "sparse-prefill")
TP1 = "reports/kernels-h200/glm5-64-heads.toml"  # GLM-5 at tensor_parallel 1: 64 heads per rank
NOT_GRAPH_REPRO = "'not measured_equals_predicted'"  # test_graphs_gpu.py's repro-oom runs: apart
PYTEST = "python3 -m pytest -q -rs -p no:cacheprovider --durations=10 --junitxml={out}/junit.xml"
BENCH = "python3 benchmarks/triton_vs_flashmla.py"
SEED_SERVE = ("vllm serve zai-org/GLM-5-FP8 -tp 8 --max-num-seqs 256 --kv-cache-dtype fp8_ds_mla "
              "--max-num-batched-tokens 32768 --gpu-memory-utilization 0.85 --max-model-len 131072")
GRAPH_REPRO_TEST = "tests/test_graphs_gpu.py::test_repro_with_graphs_measured_equals_predicted"
GRAPH_REPRO = [f"{PYTEST} {GRAPH_REPRO_TEST} --basetemp={{out}}/cases"]
HOUSE_VALIDATES = [f"mlamem validate --kernel {k} --op {op} @validate-{k}-{op}"
                   for k, ops in (("flashmla", OPS), ("flashmla-vllm", OPS), ("triton", OPS[:1]),
                                  ("triton-native", OPS[:1])) for op in ops]


H100 = "--gpu 'H100 SXM 80GB'"
RANK_CASES = (
    ("glm5-vllm", "mlamem repro-oom -s glm5-fp8-tp8"),
    ("glm5-sglang", "mlamem repro-oom -s glm5-fp8-tp8 --engine sglang"),
    ("dsv32-vllm", f"mlamem repro-oom -s deepseek-v32-fp8-tp8 {H100} --weights-per-rank 40GiB"),
    ("dsv32-sglang", f"mlamem repro-oom -s deepseek-v32-fp8-tp8 --engine sglang {H100} "
                     "--weights-per-rank 40GiB"),
    ("dsv32-ep-vllm", f"mlamem repro-oom --serve 'vllm serve deepseek-ai/DeepSeek-V3.2 -dp 8 "
                      f"--enable-expert-parallel --kv-cache-dtype fp8 --max-model-len 32768 "
                      f"--enforce-eager' {H100} --weights-per-rank 40GiB"),
    ("dsv32-ep-sglang", "mlamem repro-oom --serve 'python -m sglang.launch_server --model-path "
                        "deepseek-ai/DeepSeek-V3.2 --tp 8 --ep-size 8 --kv-cache-dtype fp8_e4m3 "
                        f"--context-length 32768 --disable-cuda-graph' {H100} --weights-per-rank 40GiB"),
)

# GLM-5.2's IndexCache (an indexer and its key cache on 21 of 78 layers) on vLLM and SGLang, and
# SGLang's EAGLE drafting with GLM-5's MTP layer (the draft pool's share of the cell, 48 running
# requests, decode graphs at 4 tokens per request), on an H100's 80 GB
DRAFT_CASES = (
    ("glm52-vllm", "mlamem repro-oom --serve 'vllm serve zai-org/GLM-5.2-FP8 -tp 8 --kv-cache-dtype "
                   f"fp8 --max-num-seqs 256 --max-model-len 131072 --enforce-eager' {H100} "
                   "--weights-per-rank 40GiB"),
    ("glm52-sglang", "mlamem repro-oom --serve 'python -m sglang.launch_server --model-path "
                     "zai-org/GLM-5.2-FP8 --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 131072 "
                     f"--disable-cuda-graph' {H100} --weights-per-rank 40GiB"),
    ("glm5-sglang-eagle", "mlamem repro-oom --serve 'python -m sglang.launch_server --model-path "
                          "zai-org/GLM-5-FP8 --tp 8 --kv-cache-dtype fp8_e4m3 --context-length 131072 "
                          f"--speculative-algorithm EAGLE' {H100} --weights-per-rank 40GiB"),
)

# Older engine versions' ranks of GLM-5.2: SGLang 0.5.13 sizes its pool with a one-byte latent
# and every layer's indexer keys (55,224 B a token) and stores 61,464, so it holds more than its
# budget (kv_sizing_cell_bytes); vLLM 0.23.0 keeps the indexer's cache on every layer too
OLDER_CASES = (
    ("glm52-sglang-0.5.13", "mlamem repro-oom --serve 'python -m sglang.launch_server --model-path "
                            "zai-org/GLM-5.2-FP8 --tp 8 --kv-cache-dtype fp8_e4m3 --context-length "
                            f"131072 --disable-cuda-graph' {H100} --weights-per-rank 40GiB "
                            "--engine-version 0.5.13"),
    ("glm52-vllm-0.23", "mlamem repro-oom --serve 'vllm serve zai-org/GLM-5.2-FP8 -tp 8 --kv-cache-dtype "
                        f"fp8 --max-num-seqs 256 --max-model-len 131072 --enforce-eager' {H100} "
                        "--weights-per-rank 40GiB --engine-version 0.23.0"),
)


def ncu(name: str, call: str) -> list[str]:
    """One decode call (scripts/decode_call.py, T=8192) under Nsight Compute, then its pages."""
    return [f"ncu --nvtx --nvtx-include decode/ --set full --import-source yes -o {{out}}/{name} python3 "
            f"scripts/decode_call.py --tokens 8192 {call}", f"ncu --import {{out}}/{name}.ncu-rep --page "
            f"details", f"python3 scripts/ncu_stalls.py {{out}}/{name}.ncu-rep"]


def both(command: str) -> list[str]:
    """An mlamem command ending in @NAME, measured and predicted (@NAME.predicted)."""
    return [command, command.replace(" @", " --predict @") + ".predicted"]


def compared(cases: tuple[tuple[str, str], ...]) -> list[str]:
    """Each (name, repro-oom command) measured and predicted as @rank-NAME, then each pair
    compared field by field (scripts/compare_repro.py)."""
    return [*(c for name, command in cases for c in both(f"{command} @rank-{name}")),
            *(f"python3 scripts/compare_repro.py {{out}}/rank-{name}.json "
              f"{{out}}/rank-{name}.predicted.json" for name, _ in cases)]


# Each suite: its commands, in order. `mlamem` is `python3 -m mlamem`; {out} is the suite's
# results folder; a word @NAME is `--format json --output {out}/NAME.json`.
SUITES = {
    # every test, the GPU ones included, in three suites of under 10 minutes each: the GPU
    # files, the rest, the slow GPU tests (on an H100 on 2026-12-06 the first two in one call
    # ran past 560 s)
    "tests": [f"{PYTEST} --deselect {GRAPH_REPRO_TEST} {FAST_GPU_TESTS}"],
    "tests-cpu": [f"{PYTEST} --ignore-glob={GPU_TEST_FILES} tests"],
    # the shipped repro cases in two processes of under 10 minutes: vLLM's and TRT-LLM's, then
    # SGLang's and the seed's pasted serve command; the noisy neighbour alone; the graph-phase
    # repro cases (a fresh process each)
    "tests-slow": [f"{PYTEST} {SHIPPED_REPRO} -k 'not sglang and not seed'",
                   f"{PYTEST} {SHIPPED_REPRO} -k 'sglang or seed'", f"{PYTEST} {NEIGHBOUR}",
                   f"{PYTEST} {' '.join(SLOW_GPU_TESTS[2:])}", *GRAPH_REPRO],
    "profile": [f"{PYTEST} tests/test_flashmla_gpu.py", *(c for s in DECODE for c in both(
        f"mlamem profile -s {s} @{s}")), "python3 benchmarks/overhead.py",
                "python3 benchmarks/staging_cost.py"],
    "validate": ["mlamem validate --tokens 1024,4096,8192,16384,32768 @validate-h200",
                 "mlamem profile --tokens 32768 --breakdown",
                 "mlamem profile --tokens 1024 --snapshot {out}/glm5-t1024.snapshot.pickle"],
    "repro": [f"{PYTEST} tests/test_repro.py tests/test_repro_gpu.py",
              *(f"mlamem repro-oom -s {s} @{s}" for s in DECODE)],
    "context-reuse": ["mlamem repro-oom -s kimi-k2-context-reuse @kimi-k2-context-reuse",
                      "mlamem plan -s kimi-k2-context-reuse",
                      "mlamem plan --sweep max-seq-len=131072,786432"],
    # the figures of mlamem/non_torch.toml, then every shipped scenario's repro-oom: measured = predicted
    "non-torch": [*(f"python3 scripts/non_torch_probe.py step-ops {s}" for s in DECODE[1:]),
                  f"{PYTEST} {SHIPPED_REPRO} -k 'not flashmla-vllm' --basetemp={{out}}/cases"],
    # the memory CUDA-graph captures take outside the allocator (non_torch_probe.py graph-captures:
    # every order, with and without a warm-up, a fresh process each), then repro-oom --cuda-graphs
    # on measured against predicted, the file's repro cases first and alone, before CUDA is touched
    "graph-memory": [*(f"python3 scripts/non_torch_probe.py graph-captures {k}"
                       for k in ("flashmla", "triton")), *GRAPH_REPRO],
    # the graph phase: repro-oom --cuda-graphs on, measured = predicted, each case alone
    "graph-repro": GRAPH_REPRO,
    # the figures the model reads (mlamem/non_torch.toml): a rank's non-torch memory op by op,
    # and what each CUDA-graph capture of a process takes outside the allocator
    "probes": [*(f"python3 scripts/non_torch_probe.py step-ops {s}" for s in DECODE[1:]),
               "python3 scripts/non_torch_probe.py graph-captures flashmla"],
    # explain on a plain PyTorch snapshot and on profile --snapshot at held-out T,
    # profile_call's frames, and diff of alloc against workspace and of the two FlashMLA builds
    "explain": [f"{PYTEST} tests/test_explain_gpu.py tests/test_api_gpu.py",
                "mlamem profile --tokens 2048,6144 --snapshot {out}/glm5-t2048-6144-h200.snapshot.pickle "
                "@profile-snapshot",
                "mlamem explain {out}/glm5-t2048-6144-h200.snapshot.pickle -s glm5-fp8-tp8 @explain-profile",
                "mlamem explain {out}/glm5-t2048-6144-h200.snapshot.pickle --format markdown",
                *(f"mlamem profile --tokens 2048,6144 --paths {p} @profile-{p}"
                  for p in ("alloc", "workspace")),
                "mlamem profile --tokens 2048,6144 --kernel flashmla-vllm @profile-vllm",
                "mlamem diff {out}/profile-alloc.json {out}/profile-workspace.json @diff-paths",
                "mlamem diff {out}/profile-snapshot.json {out}/profile-vllm.json @diff-builds",
                "mlamem diff {out}/profile-alloc.json {out}/profile-workspace.json --format markdown"],
    "gate": [f"{PYTEST} tests/test_gate.py tests/test_gate_gpu.py",
             *(f"mlamem profile -s {s} --require-gpu @{run}-{s}" for run in range(1, 6) for s in DECODE),
             "python3 benchmarks/gate_noise.py {out}/[1-5]-*.json"],  # run-to-run noise
    "triton": [f"{PYTEST} tests/test_triton_decode_gpu.py",  # then the files triton_acceptance.py reads
               *(f"mlamem profile --kernel triton {T} --paths alloc,workspace,workspace-full {m}"
                 for m in ("@triton-profile", "--predict @triton-profile-predicted")),
               f"mlamem profile {T} --paths alloc @flashmla-alloc",
               "python3 scripts/triton_acceptance.py {out}", f"{BENCH} --lse --json {{out}}/bench.json"],
    "report": ["mlamem profile --report {out}/profile", "mlamem repro-oom @repro",
               "mlamem report {out}/profile/*.json {out}/repro.json reports/triton-h200/triton-profile.json "
               "reports/context-reuse-h200/kimi-k2-context-reuse.json --output {out}/report.md"],
    "kernels": ["python3 scripts/kernel_trace.py {out}/kernel-trace.json", "mlamem kernels",
                f"{PYTEST} tests/test_operations_gpu.py",
                *(f"mlamem validate --kernel {k} --op {op} @validate-{k}-{op}" for k in BUILDS
                  for op in ("sparse-decode", "dense-decode", "sparse-prefill")),
                f"mlamem validate --kernel flashmla-vllm --op sparse-prefill -s {TP1} @validate-tp1",
                *(f"mlamem profile --kernel {k} --op {op} -s {s} --bench @{k}-{op}-{Path(s).stem}"
                  for k in BUILDS for op, s in (("sparse-decode", DECODE[1]), ("sparse-prefill", DECODE[1]),
                                                ("sparse-prefill", TP1), ("dense-decode", DENSE[0]),
                                                ("dense-decode", DENSE[1]))),
                f"mlamem compare --op sparse-decode {T} @compare-sparse-decode",
                "mlamem compare --op sparse-prefill --tokens 1024,8192,16384 @compare-sparse-prefill",
                *(f"mlamem compare --op dense-decode -s {s} @compare-{s}" for s in DENSE)],
    "flashinfer": [f"{PYTEST} tests/test_flashinfer_mla.py", "mlamem validate --kernel flashinfer --op "
                   "dense-decode", f"mlamem compare --kernels flashmla,flashinfer --op dense-decode -s "
                   f"{DENSE[0]} @compare-flashinfer"],
    "kernels-oom": [f"{PYTEST} {SHIPPED_REPRO} -k flashmla-vllm --basetemp={{out}}/cases",
                    "mlamem gate --kernel flashmla-vllm -s glm5-fp8-tp8 --baseline {out}/vllm.json --update",
                    "mlamem gate --baseline {out}/vllm.json"],
    "graphs": [f"{PYTEST} tests/test_graphs_gpu.py tests/test_graphs.py tests/test_allocator.py "
               f"-k {NOT_GRAPH_REPRO}",
               *(c for k in (*BUILDS, "triton") for c in both(f"mlamem graphs --kernel {k} @graphs-{k}")),
               "mlamem graphs -s deepseek-v32-fp8-tp8 --capture-sizes 256,128,64,32,16,8,4,2,1",
               "mlamem graphs --report {out}/report-glm5 --format markdown",
               *both("mlamem repro-oom --cuda-graphs on @repro-graphs")],
    "native": ["python3 scripts/gluon_compile.py --check",
               f"{PYTEST} tests/test_triton_decode_gpu.py tests/test_triton_decode.py",
               *(c for s in DECODE[:2] for c in both(f"mlamem profile --kernel triton-native {T} -s {s} "
                                                     f"@native-{s}")),
               *ncu("triton-native-8", "--kernel triton-native --heads 8"),
               *ncu("triton-64", "--kernel triton --heads 64"), *ncu("flashmla-8", "--kernel flashmla")],
    "native-bench": [f"{BENCH} --sweep --tokens 8192 --rank-tokens 8192 --json {{out}}/sweep.json",
                     f"{BENCH} --lse --json {{out}}/bench.json"],
    "gluon-designs": ["python3 scripts/gluon_compile.py --check --heads 8,16,64",
                      f"{PYTEST} tests/test_triton_decode_gpu.py -k 'every_design and gluon'",
                      f"{BENCH} --rank-tokens 8192,32768 --json {{out}}/bench.json",
                      *ncu("gluon-bf16-scale-8", "--kernel triton-native --design gluon-bf16-scale"),
                      *ncu("gluon-8", "--kernel triton-native --design gluon")],
    # the house: validate for every kernel and operation the registry pairs (reference: the
    # CPU one; flashinfer where its wheels travel), and mlamem's own part of a call's time; in
    # three suites of under 10 minutes each (house-flashmla, house-vllm, house-own)
    "house": [*HOUSE_VALIDATES, "python3 benchmarks/overhead.py"],
    "house-flashmla": [c for c in HOUSE_VALIDATES if "--kernel flashmla " in c],
    "house-vllm": [c for c in HOUSE_VALIDATES if "--kernel flashmla-vllm " in c],
    "house-own": [*(c for c in HOUSE_VALIDATES if "--kernel triton" in c), "python3 benchmarks/overhead.py"],
    # the noisy neighbour: a second process allocating and freeing 2 GiB in a loop moves
    # no allocator figure and no per-process one (profile, graphs), nor repro-oom's KV cache,
    # cap, headroom, verdict and limits (charged per process)
    "neighbour": [f"{PYTEST} {NEIGHBOUR}"],
    # on an H100: GLM-5's shipped scenario targets CUDA's H100 total (81079 MiB), so repro-oom runs
    # measured on the GPU it names: vLLM eager, the seed's pasted serve command, SGLang, vLLM's graphs
    # (on an H200 the same commands emulate the H100, keeping to its room); first this GPU's
    # non_torch.toml record (non_torch_probe.py record: GLM-5's and Kimi-K2's step ops)
    "h100": ["nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv",
             "python3 scripts/non_torch_probe.py record",
             *both("mlamem repro-oom @repro-glm5"),
             *both(f"mlamem repro-oom --serve '{SEED_SERVE} --enforce-eager' --gpu 'H100 SXM 80GB' "
                   "--weights-per-rank 40GiB @repro-seed-eager"),
             # the seed's OOM line (--log): the ledger beside the measured rank, its safe values
             f"mlamem repro-oom --serve '{SEED_SERVE} --enforce-eager' --gpu 'H100 SXM 80GB' "
             "--weights-per-rank 40GiB --log docs/examples/server.log @repro-seed-log",
             *both("mlamem repro-oom --engine sglang @repro-glm5-sglang"),
             *both("mlamem repro-oom --cuda-graphs on @repro-glm5-graphs"),
             # graphs --predict models GLM-5's H100 on the H100's record: each figure as measured
             *both("mlamem graphs @graphs-glm5")],
    # the rank with what it allocates beyond attention (spec/engines/rank_buffers.py),
    # measured against predicted field by field: GLM-5 and DeepSeek-V3.2 at their shipped TP8 on
    # vLLM and SGLang, and DeepSeek-V3.2 with expert parallelism (vLLM DP8 + EP, SGLang TP8 + EP),
    # each on an H100's 80 GB (DeepSeek-V3.2's weights overridden to fit it)
    "rank": compared(RANK_CASES),
    "rank-drafts": compared(DRAFT_CASES),
    "rank-older": compared(OLDER_CASES),
    "api": [f"{PYTEST} tests/test_api_gpu.py tests/test_shards_gpu.py tests/test_api.py tests/test_shards.py "
            "tests/test_pytest_plugin.py tests/test_api_readme.py tests/test_plugin_kernel.py"],
}


def argv_of(command: str, out: Path) -> list[str]:
    """The command's words: {out} filled in, @NAME spelled out, globs expanded, `mlamem` a module."""
    words = [w for word in shlex.split(command.format(out=out))
             for w in (["--format", "json", "--output", f"{out}/{word[1:]}.json"] if word[0] == "@" else
                       sorted(glob.glob(word)) or [word] if "*" in word or "[" in word else [word])]
    return ["python3", "-m", "mlamem", *words[1:]] if words[0] == "mlamem" else words


def label(command: str) -> str:
    """A command's name in the table: its @NAME, else its program or mlamem command."""
    words = shlex.split(command)
    return next((w[1:] for w in words if w[0] == "@"),
                Path(next(w for w in words if w not in ("python3", "-m", "mlamem"))).stem)


def run(argv: list[str], log: Path, env: dict[str, str]) -> int | str:
    """Runs one command, its output shown and kept in `log`: its exit code, or 'skip'."""
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        log.write_text(f"{argv[0]} not found: skipped\n")
        return "skip"
    print(f"$ {shlex.join(argv)}", flush=True)
    with log.open("w") as handle, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   env=env, text=True, start_new_session=True) as child:
        timer = threading.Timer(TIMEOUT_S, os.killpg, (child.pid, 9))  # its group: pytest's children too
        timer.start()
        for line in child.stdout:
            sys.stdout.write(line)
            handle.write(line)
        timer.cancel()
        if child.wait() == -9:
            handle.write(f"killed after {TIMEOUT_S} s\n")
        return child.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="all", help=f"all, or some of: {', '.join(SUITES)}")
    parser.add_argument("--list", action="store_true", help="name the suites, run nothing")
    parser.add_argument("outdir", nargs="?", type=Path)
    args = parser.parse_args(argv)
    names = list(SUITES) if args.suite == "all" else args.suite.split(",")
    unknown = [n for n in names if n not in SUITES]
    if unknown or not (args.list or args.outdir):
        print(f"gpu_check.py: unknown suite {unknown[0]!r}; expected all or some of: {', '.join(SUITES)}"
              if unknown else "gpu_check.py: give OUTDIR, the folder for results.tar.gz", file=sys.stderr)
        return 2
    if args.list:
        print(*(line for n in names for line in [n, *(f"  {c}" for c in SUITES[n] if args.suite != "all")]),
              sep="\n")
        return 0
    setup = subprocess.run(["bash", "-c", "source scripts/gpu-env.sh >&2 && env -0"], stdout=subprocess.PIPE)
    if setup.returncode:
        print("gpu_check.py: scripts/gpu-env.sh failed (its output is above)", file=sys.stderr)
        return 1
    env = {**dict(v.split("=", 1) for v in setup.stdout.decode().split("\0") if "=" in v),
           "PYTHONUNBUFFERED": "1"}
    args.outdir.mkdir(parents=True, exist_ok=True)
    results, table = Path(tempfile.mkdtemp(prefix="mlamem-gpu-check-")) / "results", []
    results.mkdir()
    for name in names:
        (results / name).mkdir()
        for i, command in enumerate(SUITES[name], 1):
            start, step = time.monotonic(), f"{i:02d}-{label(command)}"
            rc = run(argv_of(command, results / name), results / name / f"{step}.log", env)
            table.append(f"{name:14} {step:34} {rc!s:>4} {time.monotonic() - start:8.1f}")
            with tarfile.open(args.outdir / "results.tar.gz.part", "w:gz") as tar:
                tar.add(results, "results", filter=lambda f: None if f.name.endswith(".ncu-rep") else f)
            (args.outdir / "results.tar.gz.part").rename(args.outdir / "results.tar.gz")
    summary = "\n".join([f"{'suite':14} {'command':34} {'rc':>4} {'seconds':>8}", *table])
    (args.outdir / "summary.txt").write_text(summary + "\n")
    print(summary)
    return 1 if any(line.split()[2] not in ("0", "skip") for line in table) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
