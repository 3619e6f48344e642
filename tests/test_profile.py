"""Predictions: the same wrapper code on the meta device, against the allocator model."""

import json
from pathlib import Path

import pytest
import torch

from mlamem import scenario
from mlamem.errors import UserError
from mlamem.kernels import FlashMLA, Reference
from mlamem.measure import measure_call
from mlamem.memory import SimulatedMemory
from mlamem.profile import DEFAULT_TOKENS, run_profile

H200_RUN = Path(__file__).parent.parent / "reports" / "profile-h200" / "glm5-fp8-tp8.json"
GiB = 1024**3


@pytest.fixture(scope="module")
def glm5_prediction():
    return run_profile(scenario.load("glm5-fp8-tp8"), DEFAULT_TOKENS, ["alloc", "workspace"],
                       command="test", predict=True)


def test_predictions_equal_the_h200_measurement(glm5_prediction):
    """Every predicted byte count equals what the H200 measured (reports/profile-h200)."""
    measured = json.loads(H200_RUN.read_text())
    assert measured["measured"] and not glm5_prediction.measured
    keys = ("tokens", "path", "peak_allocated_bytes", "peak_reserved_bytes", "nvml_peak_bytes")
    assert [[row.__dict__[k] for k in keys] for row in glm5_prediction.rows] == [
        [row[k] for k in keys] for row in measured["rows"]]


def test_alloc_path_reproduces_the_source_prs_before_column(glm5_prediction):
    """0.384, 3.068, 6.137, 12.273 GiB at T = 1024, 8192, 16384, 32768."""
    alloc = [r.peak_allocated_bytes / GiB for r in glm5_prediction.rows if r.path == "alloc"]
    assert alloc == pytest.approx([0.384, 3.068, 6.137, 12.273], abs=0.001)


def test_workspace_saves_exactly_the_padded_q(glm5_prediction):
    """Without out=, the workspace path saves the padded q, T x 64 x 576 bf16, and nothing else."""
    rows = {(r.tokens, r.path): r for r in glm5_prediction.rows}
    for t in DEFAULT_TOKENS:
        saved = rows[t, "alloc"].peak_allocated_bytes - rows[t, "workspace"].peak_allocated_bytes
        assert saved == t * 64 * 576 * 2
        assert rows[t, "workspace"].staged == ["padded_q"]
    assert glm5_prediction.notes == ["out not staged: this FlashMLA build has no out= argument"]


def test_kimi_needs_no_padding_so_paths_match():
    """Kimi-K2 with attention-DP has 64 heads per rank: nothing to pad, nothing to stage."""
    result = run_profile(scenario.load("kimi-k2-fp8-tp4-dp"), [8192], ["alloc", "workspace"],
                         command="test", predict=True)
    alloc, workspace = result.rows
    assert alloc.peak_allocated_bytes == workspace.peak_allocated_bytes
    assert workspace.staged == []
    assert "q not staged: 64 heads per rank need no padding" in result.notes


def test_kernel_spec_accounts_for_split_kv_accumulators():
    """At T=32768 the spec holds out 2 GiB, lse 8 MiB, lse_accum 16 MiB, o_accum 8 GiB."""
    specs = {s.name: s.nbytes for s in FlashMLA().allocations((1, 32768, 64, 576), 512, 132)}
    assert specs == {"out": 2 * GiB, "lse": 8 << 20, "scheduler_metadata": 32, "num_splits": 8,
                     "lse_accum": 16 << 20, "o_accum": 8 * GiB}
    small = {s.name: s.shape for s in FlashMLA().allocations((1, 4, 64, 576), 512, 132)}
    assert small["o_accum"][0] == 1 + 132 // 4  # b + num_sm_parts


def test_meta_views_allocate_nothing():
    """Views and in-place ops on meta tensors add no allocation; a view keeps its base alive."""
    memory = SimulatedMemory()
    with memory:
        base = torch.empty((1024, 1024), device="meta")
        view = base[:10].unsqueeze(0)
        view.zero_()
        assert memory.model.allocated_bytes == 4 << 20
        del base
        assert memory.model.allocated_bytes == 4 << 20
        del view
        assert memory.model.allocated_bytes == 0


def test_simulated_oom_is_a_row():
    """Under a memory limit the prediction reports an OOM row with the failing request."""
    glm = scenario.load("glm5-fp8-tp8")
    row = measure_call(SimulatedMemory(limit_bytes=2 * GiB), glm, FlashMLA(), 8192, "alloc",
                       sm_count=132, max_tokens=32768)
    assert row.oom and row.peak_allocated_bytes is None
    assert row.oom_requested_bytes == 2 * 8192 * 64 * 512 * 4  # o_accum


def test_workspace_tokens_above_max_num_batched_tokens_are_refused():
    """The workspace is sized for max_num_batched_tokens; larger T is a user error."""
    with pytest.raises(UserError, match="--max-num-batched-tokens"):
        run_profile(scenario.load("glm5-fp8-tp8"), [65536], ["workspace"], command="t")


def test_reference_kernel_runs_the_same_protocol_on_meta():
    """The torch reference runs itself on the meta device; its temporaries are unattributed."""
    glm = scenario.load("glm5-fp8-tp8")
    row = measure_call(SimulatedMemory(), glm, Reference(), 256, "alloc", sm_count=132,
                       max_tokens=32768)
    assert row.failure is None
    names = {b.name for b in row.breakdown.buffers}
    assert "padded_q" in names and "unattributed" in names
    assert row.breakdown.peak_bytes == row.peak_allocated_bytes
