"""`mlamem profile`'s sweep, predicted: the same wrapper code on the meta device, against the
allocator model, equals the H200's measurement, for FlashMLA and the Triton kernel."""

import json
from pathlib import Path

import pytest

from mlamem.commands.profile import DEFAULT_TOKENS, run_profile
from mlamem.commands.sweep import Request, plan
from mlamem.kernels import FlashMLA, TritonDecode
from mlamem.kernels.base import ACCUM_WORKSPACE
from mlamem.spec import scenario
from mlamem.spec.errors import UserError

H200_RUN = Path(__file__).parent / "fixtures" / "results" / "profile-glm5-h200.json"
GiB = 1024**3
ALL_PATHS = ["alloc", "workspace", "workspace-full"]


@pytest.fixture(scope="module")
def glm5_prediction():
    return run_profile(scenario.load("glm5-fp8-tp8"), DEFAULT_TOKENS, ["alloc", "workspace"],
                       command="test", predict=True)


def test_predictions_equal_the_h200_measurement(glm5_prediction):
    """Every predicted byte count equals what the H200 measured (a copy of
    reports/profile-h200/glm5-fp8-tp8.json)."""
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


def test_workspace_tokens_above_max_num_batched_tokens_are_refused():
    """The workspace is sized for max_num_batched_tokens; larger T is refused by the planner,
    before run_profile, a user error naming the field (the CLI words it as --tokens)."""
    glm5 = ("glm5-fp8-tp8", scenario.load("glm5-fp8-tp8"))
    with pytest.raises(UserError, match="raise max_num_batched_tokens") as caught:
        plan(Request("profile", "flashmla", scenarios=[glm5], ops=["sparse-decode"],
                     values={"sparse-decode": [65536]}, paths=["workspace"]))
    assert caught.value.field == "tokens"


@pytest.fixture(scope="module")
def triton_prediction():
    return run_profile(scenario.load("glm5-fp8-tp8"), DEFAULT_TOKENS, ALL_PATHS, command="test",
                       kernel=TritonDecode(), predict=True)


def _rows(result, path):
    return [r for r in result.rows if r.path == path]


def test_triton_workspace_column_is_the_prs_after_column(triton_prediction):
    """q and out staged: 0.251, 2.006, 4.012, 8.023 GiB at T = 1024, 8192, 16384, 32768."""
    rows = _rows(triton_prediction, "workspace")
    assert [r.peak_allocated_bytes / GiB for r in rows] == pytest.approx(
        [0.251, 2.006, 4.012, 8.023], abs=0.001)
    assert all(r.staged == ["padded_q", "out"] for r in rows)


def test_triton_alloc_column_is_flashmlas(triton_prediction):
    """Allocating mode mirrors FlashMLA's buffers, so the alloc columns agree to the byte."""
    flashmla = run_profile(scenario.load("glm5-fp8-tp8"), DEFAULT_TOKENS, ["alloc"], command="test",
                           kernel=FlashMLA(), predict=True)
    assert ([r.peak_allocated_bytes for r in _rows(triton_prediction, "alloc")]
            == [r.peak_allocated_bytes for r in flashmla.rows])


def test_workspace_full_allocates_nothing_inside_the_call(triton_prediction):
    """q, out, lse and accumulators staged: 0 allocations, 0 bytes, and nothing missing."""
    for row in _rows(triton_prediction, "workspace-full"):
        assert row.staged == ["padded_q", "out", "lse", ACCUM_WORKSPACE]
        assert row.peak_allocated_bytes == 0 and row.peak_reserved_bytes == 0
        assert row.allocations_in_call == 0 and row.buffers == [] and row.missing_buffers == []


def test_native_heads_need_no_padded_q_a_third_way():
    """`--kernel triton-native` at GLM-5 TP8 (8 heads per rank): no padded q on any path, out and
    lse at 8 heads, no accumulators at T >= 132, so the alloc path holds only out and lse
    (T = 32768: 256 MiB + 1 MiB) against FlashMLA's 12.27 GiB; workspace-full holds nothing."""
    from mlamem.kernels import TritonNativeDecode

    glm5 = scenario.load("glm5-fp8-tp8")
    result = run_profile(glm5, [1024, 32768], ALL_PATHS, command="test",
                         kernel=TritonNativeDecode(), predict=True)
    assert "q not staged: 8 heads per rank need no padding" in result.notes
    for row in result.rows:
        assert "padded_q" not in [b.name for b in row.buffers] + row.staged
    alloc = {r.tokens: r for r in _rows(result, "alloc")}
    assert [b.name for b in alloc[32768].buffers] == ["out", "lse"]
    assert alloc[32768].peak_allocated_bytes == 32768 * 8 * 512 * 2 + 8 * 32768 * 4
    assert [r.staged for r in _rows(result, "workspace")] == [["out"], ["out"]]
    assert all(r.peak_allocated_bytes == 0 for r in _rows(result, "workspace-full"))


def _line_of(fn, text: str) -> int:
    """The line of `fn`'s source that holds `text`."""
    import inspect

    source, first = inspect.getsourcelines(fn)
    return next(first + i for i, line in enumerate(source) if text in line)


def test_frames_name_where_each_buffer_was_allocated(tmp_path, capsys):
    """profile --breakdown --frames, predicted: each buffer carries the frame that allocated it.
    From the console, every frame is mlamem's (the innermost outside torch then): the padded q
    the alloc path's line, the kernel's buffers the line of its allocation spec's stand-in.
    Called from this test, this test's line is the innermost frame outside mlamem. Without
    --frames no buffer has one."""
    import subprocess
    import sys

    from mlamem.cli import main
    from mlamem.runtime import paths
    from mlamem.spec import kernel_api

    args = ["profile", "--predict", "--tokens", "1024", "--breakdown"]
    saved = tmp_path / "framed.json"
    subprocess.run([sys.executable, "-m", "mlamem", *args, "--frames", "--output", str(saved)],
                   check=True, capture_output=True, cwd=tmp_path)
    framed = json.loads(saved.read_text())
    padded_q = f"mlamem/runtime/paths.py:{_line_of(paths.alloc_path, 'q.new_zeros')} alloc_path"
    spec = ("mlamem/spec/kernel_api.py:"
            f"{_line_of(kernel_api.allocate_missing, 'torch.empty(spec.shape')} allocate_missing")
    alloc, workspace = framed["rows"]
    assert [(b["name"], b["frame"]) for b in alloc["buffers"]] == [
        ("padded_q", padded_q), *((b["name"], spec) for b in alloc["buffers"][1:])]
    assert {b["frame"] for b in workspace["buffers"]} == {spec}

    assert main([*args, "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert all("frame" not in b for row in plain["rows"] for b in row["buffers"])  # no stacks
    assert [[b["name"] for b in r["buffers"]] for r in plain["rows"]] == [
        [b["name"] for b in r["buffers"]] for r in framed["rows"]]  # the specs name them all

    here = sys._getframe().f_lineno + 1
    assert main([*args, "--frames", "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "| live at peak | workspace path | frame |" in markdown
    assert (f"| padded_q | wrapper | {1024 * 64 * 576 * 2} | 72.000 MiB | yes | removed | "
            f"`tests/test_profile.py:{here} test_frames_name_where_each_buffer_was_allocated` |"
            in markdown)


def test_a_prediction_has_no_per_process_figure_nor_nvml_note(glm5_prediction):
    """Predicted rows model the device-wide delta (reserved) only: this process's NVML peak is
    measured or absent, and the note on the two NVML figures comes with a measurement."""
    assert [row.nvml_process_peak_bytes for row in glm5_prediction.rows] == [None] * 8
    assert not [n for n in glm5_prediction.notes if n.startswith("NVML")]


@pytest.mark.parametrize(("visibility", "says"), [
    ("this process", "nvml_process_peak_bytes is this process's own peak"),
    ("not listed: pid namespace", "this process's own figure is absent (not listed: pid namespace)"),
    ("no NVML process list", "this process's own figure is absent (no NVML process list)"),
])
def test_the_nvml_note_names_both_figures_or_the_fallback(visibility, says):
    from mlamem.commands.profile import nvml_note
    note = nvml_note(visibility)
    assert "device-wide used memory's delta (all processes)" in note and says in note
