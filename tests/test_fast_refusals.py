"""A bad value, a bad name or a bad file is refused before torch is imported: the refusal costs
the CLI's start-up, not the seconds of `import torch` (benchmarks/cli_start.py times them)."""

import json
import pickle
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results"

# each: a command line mlamem must refuse (exit 2) without importing torch
REFUSED = [
    ["repro-oom", "-s", "nosuch"],
    ["repro-oom", "--utilization", "2"],
    ["repro-oom", "--engine", "sglang", "--mem-fraction-static", "1"],
    ["repro-oom", "--format", "yaml"],
    ["profile", "-s", "/nonexistent/scenario.toml"],
    ["profile", "--tokens", "0"],
    ["graphs", "-s", "nosuch"],
    ["graphs", "--format", "yaml"],
    ["plan", "-s", "nosuch"],
    ["validate", "-s", "nosuch"],
    ["compare", "-s", "/nonexistent/scenario.toml"],
    ["gate", "--baseline", "/nonexistent/baseline.json"],
    ["repro-oom", "--gpu", "H300"],
    ["repro-oom", "--model", "/nonexistent/config.json"],
    ["repro-oom", "--model", str(resources.files("mlamem.spec.models") / "glm-5.json")],  # weights > GPU
    ["graphs", "--weights-per-rank", "40"],  # not an option: its figures do not depend on them
    ["repro-oom", "--weights-per-rank", "0"],
    ["repro-oom", "--serve", "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8_ds_mla "
     "--max-model-len 131072", "--gpu", "H100 SXM 80GB"],  # weights > GPU
    ["plan", "--serve", "vllm serve zai-org/GLM-5-FP8", "-s", "glm5-fp8-tp8"],
    ["graphs", "--gpu", "H300"],
    ["explain", "/nonexistent.pickle"],
    ["explain", "rand.bin"],
    ["explain", "list.pickle"],
    ["report", "rand.bin"],
    ["report", "/dev/zero"],
    ["report", "rand.bin", "--output", "/dev/stdout"],
    ["profile", "--paths", ""],
    ["profile", "--paths", "bogus"],
    ["profile", "--tokens", "2147483648"],
    ["profile", "--kernel", "triton", "--op", "dense-decode"],
    ["plan", "--sweep", "utilization=0.8,0.8"],
    ["plan", "--sweep", "bogus=1"],
    ["scenarios", "--serve", "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 "
     "--tp 8 --context-length 4096 --kv-cache-dtype bf16"],
    ["repro-oom", "--engine", "bogus"],
    ["report", "plan.json"],  # a plan is no report section
    ["diff", "profile.json", "snapshot.pickle"],  # a result and a snapshot do not compare
    ["profile", "--tokens", "40000"],  # above the scenario's max_num_batched_tokens
    ["profile", "--op", "dense-decode", "--context-len", "999999"],  # past max_model_len
    ["profile", "--op", "sparse-prefill", "--kv-len", "999999"],
    ["graphs", "-s", "kimi-k2-dense-tp4-dp"],  # drives no sparse decode
    ["repro-oom", "-s", "kimi-k2-dense-tp4-dp"],
    ["repro-oom", "--gpu-memory", "0"],
    ["repro-oom", "--max-num-batched-tokens", "3000000000"],  # past int32
    ["repro-oom", "--mem-fraction-static", "0.8", "--engine", "vllm"],  # SGLang's knob
    ["repro-oom", "--expect-oom", "NAME"],  # no such case
    ["repro-oom", "--expect-fit", "none"],  # a TRT-LLM variant, not a vLLM path
]

CHILD = """
import contextlib, io, json, sys
from mlamem.cli.main import main
with contextlib.redirect_stderr(io.StringIO()) as err:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "stderr": err.getvalue()}))
"""


@pytest.mark.parametrize("args", REFUSED, ids=" ".join)
def test_a_refusal_imports_no_torch(args, tmp_path):
    (tmp_path / "rand.bin").write_bytes(bytes(range(256)) * 8)  # neither a pickle nor UTF-8
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2]))  # a pickle, not a snapshot
    for name, source in (("plan.json", "plan-kimi-k2-context-reuse.json"),
                         ("profile.json", "profile-glm5-h200.json")):
        (tmp_path / name).write_bytes((RESULTS / source).read_bytes())
    (tmp_path / "snapshot.pickle").write_bytes((FIXTURES / "glm5-t1024-h200.snapshot.pickle").read_bytes())
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 2 and result["stderr"].startswith("mlamem: error:"), result
    assert not result["torch"], f"mlamem {' '.join(args)} imported torch before refusing"
