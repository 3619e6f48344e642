"""`mlamem explain` on a snapshot plain PyTorch wrote on a GPU: a FlashMLA call inside a larger
function that has its own buffers, recorded with `_record_memory_history` and `_dump_snapshot`
in a child process (pytest's own process asks CUDA nothing). Written on
a CPU session, to run on the H200."""

import json
import subprocess
import sys

import pytest

from mlamem.cli import main

pytestmark = pytest.mark.gpu
HELD_OUT = (2048, 6144)  # T values no shipped sweep or fixture has

# The user's code: a layer whose attention runs the alloc path of sgl-flash-mla (q padded from
# GLM-5's 8 heads per rank to 64), between buffers of its own.
_RECORD = f"""
import sys, torch
from mlamem.spec import scenario
from mlamem.kernels import FlashMLA
from mlamem.runtime.measure import local_sm_count, plan_call
from mlamem.runtime.memory import CudaMemory

glm, kernel, memory, sms = scenario.load("glm5-fp8-tp8"), FlashMLA(), CudaMemory(), local_sm_count()

def layer(t):
    call = plan_call(glm, kernel, "sparse-decode", t, "alloc", sm_count=sms)
    attention = call.prepare(memory, max_tokens=t)
    hidden = torch.empty((t, 7168), dtype=torch.bfloat16, device="cuda")
    out, lse = attention()
    return hidden.sum() + out.float().sum()

torch.cuda.memory._record_memory_history(max_entries=100000)
for t in {HELD_OUT!r}:
    layer(t)
    torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(sys.argv[1])
"""


def _in_child(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-P", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module", autouse=True)
def _flashmla_runs():
    """Skip, with sgl-flash-mla's one-line reason, where it cannot run (asked in a child)."""
    reason = _in_child("-c", "from mlamem.kernels import FlashMLA; "
                             "print(FlashMLA().unavailable_reason() or '')").strip()
    if reason:
        pytest.skip(f"flashmla: {reason}")


def test_explain_finds_each_call_of_a_plain_pytorch_snapshot(tmp_path, capsys):
    """Each call is found with its T and 64 heads on the alloc path; the layer's own buffer is
    named by its frame; the saving equals `mlamem profile`'s for that T."""
    shot = tmp_path / "layer.pickle"
    _in_child("-c", _RECORD, str(shot))
    assert main(["explain", str(shot), "-s", "glm5-fp8-tp8", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    calls = [c for c in doc["calls"] if c["path"] == "alloc"]
    assert [c["implied"] for c in calls] == [[{"tokens": t, "heads": 64}] for t in HELD_OUT]
    assert any(f["frame"].startswith("<string>:") and f["frame"].endswith(" layer")
               for f in doc["by_frame"]), doc["by_frame"]  # the user's frame, not mlamem's
    profile = tmp_path / "p.json"
    assert main(["profile", "--predict", "--tokens", ",".join(map(str, HELD_OUT)),
                 "--format", "json", "--output", str(profile)]) == 0
    rows = {(r["tokens"], r["path"]): r["peak_allocated_bytes"]
            for r in json.loads(profile.read_text())["rows"]}
    for call, t in zip(calls, HELD_OUT, strict=True):
        assert call["saving"]["saving_bytes"] == rows[(t, "alloc")] - rows[(t, "workspace")]
