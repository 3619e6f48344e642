"""mlamem.track and mlamem.profile_call, predicted on the meta device (the CPU side of the API);
tests/test_api_gpu.py measures the same on a GPU."""

import dataclasses
import functools
import inspect
import pickle
import subprocess
import sys

import pytest
import torch

import mlamem
from mlamem.kernels import FlashMLA, TritonDecode
from mlamem.kernels.base import SPARSE_DECODE, BufferSpec
from mlamem.operations import kv_format, problem_for, workspace_rows
from mlamem.results.profile import ProfileRow
from mlamem.runtime.attribution import UNATTRIBUTED, ExpectedBuffer, expected_buffers
from mlamem.runtime.measure import measure_call, runner
from mlamem.runtime.memory import SimulatedMemory
from mlamem.runtime.paths import PATHS, KernelCall, plan, reserve_workspace, wrapper_allocations
from mlamem.spec import scenario
from mlamem.spec.units import MiB

PADDED_Q = (1024, 64, 576)  # T x padded heads x d_qk, bfloat16: 72 MiB


def pad_heads(q: torch.Tensor, heads: int = 64) -> torch.Tensor:
    """q (T, h, 576) -> a zero-padded copy (T, heads, 576), as an alloc path makes it."""
    padded = q.new_zeros((q.shape[0], heads, q.shape[2]))
    padded[:, :q.shape[1]] = q
    return padded


def decode_expect(kernel, chosen, tokens: int, path: str, sm_count: int) -> dict:
    """What `mlamem profile` expects the sparse decode at (tokens, path) to allocate inside the
    call: the path's and the kernel's buffers, by name, for `expect`."""
    op = SPARSE_DECODE
    capabilities = kernel.capabilities(op, kv_format(chosen, op))
    heads, padded_heads = chosen.heads_per_rank, capabilities.padded_heads(chosen.heads_per_rank)
    problem = problem_for(chosen, op, tokens, padded_heads)
    staged = plan(path, heads, capabilities, kernel.label, problem.q_dtype).staged
    expected = expected_buffers(
        wrapper_allocations(path, tokens, heads, padded_heads, chosen.d_qk, problem.q_dtype),
        kernel.allocations(problem, sm_count), staged)
    return {e.name: e for e in expected}


def decode_step(kernel, chosen, tokens: int, path: str, *, memory, sm_count: int, seed: int = 0):
    """The sparse decode call `mlamem profile` measures at (tokens, path), built as
    mlamem.runtime.measure builds it on `memory`'s device (the kernel, or on meta its allocation spec):
    (step, expect), where step() runs the path on inputs and a workspace made here."""
    op = SPARSE_DECODE
    capabilities = kernel.capabilities(op, kv_format(chosen, op))
    heads, padded_heads = chosen.heads_per_rank, capabilities.padded_heads(chosen.heads_per_rank)
    problem = problem_for(chosen, op, tokens, padded_heads)
    q, inputs = kernel.make_inputs(problem, heads, memory.device, seed)
    workspace = reserve_workspace(path, kernel, max_tokens=workspace_rows(chosen, op),
                                  padded_heads=padded_heads, d_qk=chosen.d_qk, d_v=chosen.d_v,
                                  topk=problem.topk, sm_count=sm_count, device=memory.device,
                                  q_dtype=problem.q_dtype)
    call = KernelCall(run=runner(kernel, memory, sm_count, problem, inputs), op=op,
                      padded_heads=padded_heads, takes_out=capabilities.takes_out,
                      q_dtype=problem.q_dtype)
    step = functools.partial(PATHS[path], q, call, workspace)
    return step, decode_expect(kernel, chosen, tokens, path, sm_count)


def test_track_predicts_a_function_on_meta():
    """track(device="meta"): the allocator model's peaks for the block, the buffer named from
    (shape, dtype), live at the peak, labelled predicted."""
    q = torch.empty((1024, 8, 576), dtype=torch.bfloat16, device="meta")
    with mlamem.track(expect={"padded_q": (PADDED_Q, torch.bfloat16)}, device="meta") as t:
        padded = pad_heads(q)
    assert padded.shape == PADDED_Q
    assert not t.measured
    assert t.peak_allocated_bytes == t.peak_reserved_bytes == t.nvml_peak_bytes == 72 * MiB
    assert t.nvml_process_peak_bytes is None  # the model reads no NVML: no per-process figure
    assert (t.allocations_in_call, t.bytes_allocated_in_call) == (1, 72 * MiB)
    [buffer] = t.buffers
    assert (buffer.name, buffer.allocated_by, buffer.live_at_peak) == ("padded_q", "user", True)
    assert t.missing == [] and t.failure is None and not t.oom


def test_in_place_and_views_of_earlier_tensors_allocate_nothing():
    """Predicted: an in-place op or a view on a tensor made before the block is no allocation;
    a new result is one."""
    workspace = torch.empty((1024, 1024), device="meta")
    with mlamem.track(device="meta") as t:
        workspace.mul_(2)
        workspace[:10].zero_()
        doubled = workspace * 2
    assert doubled.shape == workspace.shape
    assert [b.requested_bytes for b in t.buffers] == [4 * MiB]


def test_expect_names_buffers_in_every_form_and_the_rest_by_frame():
    """Bytes, (shape, dtype), BufferSpec and ExpectedBuffer name allocations in order; an
    expected buffer never allocated is missing; an unnamed allocation is named by its frame."""
    expect = {"a": 4 * MiB, "b": ((256, 1024), torch.float32),
              "c": BufferSpec("ignored", (1024,), torch.float32, "temporary"),
              "d": ExpectedBuffer("ignored", 512, "wrapper"), "never": 12345}
    with mlamem.track(expect=expect, device="meta") as t:
        kept = []
        for n in (4 * MiB, 1024 * 1024, 4096, 512, 100):
            kept_line = sys._getframe().f_lineno + 1
            kept.append(torch.empty(n, dtype=torch.uint8, device="meta"))
    assert len(kept) == 5
    here = (f"tests/test_api.py:{kept_line} "
            "test_expect_names_buffers_in_every_form_and_the_rest_by_frame")
    assert [(b.name, b.allocated_by) for b in t.buffers] == [
        ("a", "user"), ("b", "user"), ("c", "kernel"), ("d", "wrapper"), (here, "unknown")]
    assert {b.frame for b in t.buffers} == {here}
    assert t.missing == ["never"]


def scores_then_copy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A user's function with temporaries: a matmul, a softmax in fp32, a copy into a fresh
    output."""
    scores = x @ w
    probs = torch.softmax(scores.float(), dim=-1)
    out = torch.empty(probs.shape, dtype=x.dtype, device=x.device)
    out.copy_(probs)
    return out


def lines_of(fn, *texts: str) -> list[int]:
    """The line numbers of `fn`'s source lines holding each text, in order."""
    source, first = inspect.getsourcelines(fn)
    return [next(first + i for i, line in enumerate(source) if text in line) for text in texts]


def test_profile_call_names_every_allocation_of_a_function_by_its_frame():
    """profile_call on the meta device: each allocation of the user's function (the matmul's
    scores, the fp32 copy and its softmax, the fresh output) is named by the line of the test's
    function that made it; a buffer named by `expect` keeps its name and carries its frame."""
    x = torch.empty((4096, 1024), dtype=torch.bfloat16, device="meta")
    w = torch.empty((1024, 640), dtype=torch.bfloat16, device="meta")
    t = mlamem.profile_call(scores_then_copy, x, w, device="meta")
    matmul, softmax, fresh = (f"tests/test_api.py:{line} scores_then_copy" for line in lines_of(
        scores_then_copy, "x @ w", "torch.softmax", "torch.empty(probs.shape"))
    rows = 4096 * 640
    assert [(b.name, b.requested_bytes) for b in t.buffers] == [
        (matmul, rows * 2), (softmax, rows * 4), (softmax, rows * 4), (fresh, rows * 2)]
    assert all(b.frame == b.name and b.allocated_by == "unknown" for b in t.buffers)
    assert UNATTRIBUTED not in t.table() and matmul in t.table()

    named = mlamem.profile_call(scores_then_copy, x, w, device="meta",
                                expect={"probs": ((4096, 640), torch.float32)})
    assert [(b.name, b.frame) for b in named.buffers][:2] == [(matmul, matmul), ("probs", softmax)]
    [probs_row] = [line for line in named.table().splitlines() if line.startswith("probs ")]
    assert probs_row.split() == ["probs", "user", "10.000", "MiB", str(rows * 4), "yes",
                                 *softmax.split()]  # as wide as its rows: the frame whole
    assert f"buffer: probs; by: user; size: 10.000 MiB; bytes: {rows * 4}; live at peak: yes;\n" \
           f"frame: {softmax}\n" in named.table(width=80)  # too narrow: one record each


def test_a_bad_expectation_names_the_accepted_forms():
    """An expect value of another kind is a TypeError listing what is accepted."""
    with pytest.raises(TypeError, match=r"expect\['x'\].*\(shape, torch dtype\)"):
        mlamem.track(expect={"x": "2GiB"}, device="meta")


@pytest.mark.parametrize(("kernel", "path"), [(FlashMLA(), "alloc"), (FlashMLA(), "workspace"),
                                              (TritonDecode(), "workspace-full")])
def test_profile_call_predicts_what_profile_predicts(kernel, path):
    """profile_call on the meta device, on the call `mlamem profile` builds at GLM-5 T=1024,
    gives measure_call's predicted figures to the byte: peaks, allocations, every buffer."""
    glm = scenario.load("glm5-fp8-tp8")
    sm_count = glm.gpu.sm_count
    profiled = measure_call(SimulatedMemory(), glm, kernel, 1024, path, sm_count=sm_count,
                            max_tokens=workspace_rows(glm, SPARSE_DECODE))
    step, expect = decode_step(kernel, glm, 1024, path, memory=SimulatedMemory(),
                               sm_count=sm_count)
    t = mlamem.profile_call(step, expect=expect, device="meta")
    assert (t.peak_allocated_bytes, t.peak_reserved_bytes, t.nvml_peak_bytes) == (
        profiled.peak_allocated_bytes, profiled.peak_reserved_bytes, profiled.nvml_peak_bytes)
    # the same buffers; the API's also carry their frame, the call's line in this test
    assert [dataclasses.replace(b, frame=None) for b in t.buffers] == profiled.breakdown.buffers
    assert t.missing == profiled.breakdown.missing == []
    out, lse = t.value
    assert out.shape == (1024, glm.heads_per_rank, glm.d_v)


def test_inputs_made_before_are_not_in_the_model():
    """Predicted, the inputs made before profile_call are not in the allocator model: at T=8192
    the call's lse no longer fits the free tail of the KV cache's 20 MiB segment, which
    measure_call (inputs made on the model) shows, so reserved is 20 MiB higher."""
    glm = scenario.load("glm5-fp8-tp8")
    profiled = measure_call(SimulatedMemory(), glm, FlashMLA(), 8192, "alloc",
                            sm_count=glm.gpu.sm_count, max_tokens=workspace_rows(glm, SPARSE_DECODE))
    step, expect = decode_step(FlashMLA(), glm, 8192, "alloc", memory=SimulatedMemory(),
                               sm_count=glm.gpu.sm_count)
    t = mlamem.profile_call(step, expect=expect, device="meta")
    assert t.peak_allocated_bytes == profiled.peak_allocated_bytes
    assert t.peak_reserved_bytes - profiled.peak_reserved_bytes == 20 * MiB


def test_profile_call_warms_up_first():
    """A one-time allocation of the first call (a cache) is made in the warm-up and not
    counted; with warmup=False it is."""
    cache = []

    def scale(x):
        if not cache:
            cache.append(torch.empty(MiB, dtype=torch.uint8, device="meta"))
        return x * 2

    x = torch.empty(1024, device="meta")
    assert mlamem.profile_call(scale, x, device="meta").allocations_in_call == 1
    cache.clear()
    assert mlamem.profile_call(scale, x, device="meta", warmup=False).allocations_in_call == 2


def test_an_oom_in_the_block_is_recorded_not_raised():
    """The allocator model refusing a request inside the block: oom, with the request's size
    and the expected buffer it was, and no exception."""
    t = mlamem.track(expect={"big": 64 * MiB}, device="meta")
    t.memory.set_limit(32 * MiB)
    with t:
        torch.empty(64 * MiB, dtype=torch.uint8, device="meta")
    assert t.oom and t.oom_requested_bytes == 64 * MiB and t.oom_buffer == "big"
    assert t.peak_allocated_bytes is None and t.missing == ["big"]
    assert t.to_dict()["oom"] is True and "out of memory" in t.table()


def test_other_errors_propagate_after_the_figures():
    """An error that is not an OOM is raised, from track and from profile_call alike; the
    tracker keeps its line."""
    t = mlamem.track(device="meta")

    def allocate_and_fail():
        with t:
            torch.empty(MiB, device="meta")
            raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        allocate_and_fail()
    assert t.failure == "ValueError: bad shape" and not t.oom
    assert t.allocations_in_call == 1
    with pytest.raises(ZeroDivisionError):
        mlamem.profile_call(lambda: 1 / 0, device="meta")


def test_trackers_do_not_nest():
    """A second tracker inside a running one is refused (the allocator trace is per process)."""
    with mlamem.track(device="meta"), pytest.raises(RuntimeError, match="do not nest"):
        mlamem.profile_call(torch.empty, 8, device="meta")


def test_to_dict_is_the_profile_rows_schema():
    """to_dict's fields are ProfileRow's, with the same buffer objects (less the alloc-vs-
    workspace comparison)."""
    with mlamem.track(expect={"x": 1024}, device="meta") as t:
        frame_line = sys._getframe().f_lineno + 1
        torch.empty(1024, dtype=torch.uint8, device="meta")
    row = t.to_dict()
    assert set(row) <= set(ProfileRow.model_fields)
    assert row["buffers"] == [{"name": "x", "allocated_by": "user", "requested_bytes": 1024,
                               "block_bytes": 1024, "segment_bytes": 2 * MiB,
                               "live_at_peak": True,
                               "frame": "tests/test_api.py:"
                                        f"{frame_line} test_to_dict_is_the_profile_rows_schema"}]
    assert (row["allocations_in_call"], row["breakdown_peak_bytes"], row["oom"]) == (1, 1024, False)


def test_table_names_buffers_and_says_whether_they_add_up():
    """The text table: each buffer, its size, the peaks and that the parts add up to the peak."""
    q = torch.empty((1024, 8, 576), dtype=torch.bfloat16, device="meta")
    with mlamem.track(expect={"padded_q": (PADDED_Q, torch.bfloat16)}, device="meta") as t:
        pad_heads(q)
    text = t.table()
    assert "(PREDICTED)" in text and "padded_q" in text and "72.000 MiB" in text
    assert "buffers live at the peak add up to the peak (75497472 B)" in text


def test_save_snapshot_writes_the_blocks_trace(tmp_path):
    """save_snapshot pickles torch's snapshot layout holding the block's alloc events."""
    with mlamem.track(device="meta") as t:
        torch.empty(MiB, dtype=torch.uint8, device="meta")
    t.save_snapshot(tmp_path / "block.pickle")
    saved = pickle.loads((tmp_path / "block.pickle").read_bytes())
    assert [e["size"] for e in saved["device_traces"][0] if e["action"] == "alloc"] == [MiB]
    assert saved["segments"] == t.segments


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device here measures instead")
def test_without_cuda_track_names_the_fix():
    """No CUDA and no device="meta": NoCudaError (a UserError and a RuntimeError), one line
    naming device="meta"."""
    with pytest.raises(mlamem.NoCudaError, match='device="meta"') as raised:
        mlamem.track()
    assert isinstance(raised.value, RuntimeError) and "\n" not in str(raised.value)


def test_other_devices_are_refused():
    """A CPU device is a ValueError naming cuda and meta."""
    with pytest.raises(ValueError, match="cuda .* or meta"):
        mlamem.track(device="cpu")


def test_import_mlamem_imports_no_torch():
    """`import mlamem` stays light: the API loads torch on first access to mlamem.track."""
    code = ("import sys, mlamem; assert 'torch' not in sys.modules; mlamem.track; "
            "assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-P", "-c", code], check=True, timeout=120)


def _one_line_at_the_call(raised: pytest.ExceptionInfo, argument: str) -> None:
    """The error names the argument in one line and comes from mlamem.api, not from inside
    torch or rich."""
    assert argument in str(raised.value) and "\n" not in str(raised.value)
    assert raised.traceback[-1].path.name == "api.py"


@pytest.mark.parametrize("expect", ["scores", [("scores", 4096)], 4096])
def test_an_expect_that_is_no_mapping_is_one_line(expect):
    """expect= as a string, a list or a number: TypeError naming expect and the forms."""
    for start in (lambda: mlamem.track(expect=expect, device="meta"),
                  lambda: mlamem.profile_call(lambda: None, expect=expect, device="meta")):
        with pytest.raises(TypeError, match="give a mapping of buffer names") as raised:
            start()
        _one_line_at_the_call(raised, f"expect={expect!r}")


@pytest.mark.parametrize("device", ["META", "Cuda", "bogus", "cuda:x", 2.5, [0]])
def test_a_device_torch_cannot_name_is_one_line(device):
    """device="META" (or any other name torch has no device for): ValueError naming device
    and the two accepted, not torch's RuntimeError listing every backend."""
    for start in (lambda: mlamem.track(device=device),
                  lambda: mlamem.profile_call(lambda: None, device=device)):
        with pytest.raises(ValueError, match="expected cuda .* or meta") as raised:
            start()
        _one_line_at_the_call(raised, f"device {device!r}")


def test_the_figures_before_the_block_ends_are_one_line():
    """table() and summary() before the block: RuntimeError saying to call them after it, as
    save_snapshot says."""
    tracker = mlamem.track(device="meta")
    for method in (tracker.table, tracker.summary):
        with pytest.raises(RuntimeError, match=f"nothing measured yet: call {method.__name__} "
                                               "after the block ends") as raised:
            method()
        _one_line_at_the_call(raised, method.__name__)


@pytest.mark.parametrize("width", ["x", 80.0, True, 0, -3])
def test_a_table_width_that_is_no_column_count_is_one_line(width):
    """table(width=...) takes a count of columns >= 1 (or None): anything else is one line."""
    with mlamem.track(device="meta") as tracker:
        torch.empty(16, device="meta")
    with pytest.raises((TypeError, ValueError), match="give the columns to fit") as raised:
        tracker.table(width=width)
    _one_line_at_the_call(raised, f"width={width!r}")
