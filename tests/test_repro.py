"""repro-oom on the CPU: the engine's budget arithmetic, verdicts, the search, the subprocesses."""

import json
import sys
from pathlib import Path

import pytest
import torch

from mlamem.cli import main
from mlamem.commands.repro import (
    check_local_gpu,
    host_setup,
    largest_fitting,
    prediction_differences,
    run_case,
    run_repro,
)
from mlamem.engines.base import Budget
from mlamem.engines.decode_rank import activation_specs
from mlamem.engines.vllm import VLLM, kv_cache_bytes
from mlamem.kernels import FlashMLA, TritonDecode
from mlamem.kernels.base import BufferSpec, simulate_run
from mlamem.runtime.allocator import AllocatorOutOfMemory
from mlamem.runtime.memory import SimulatedMemory, is_out_of_memory
from mlamem.spec import scenario as scenarios
from mlamem.spec.engines.vllm import kv_block_bytes
from mlamem.spec.errors import UserError
from mlamem.testing import no_gpu, one_line_error, scenario_as_run

FIXTURES = Path(__file__).parent / "fixtures"

GiB = 1024**3


@pytest.fixture(scope="module")
def glm():
    return scenarios.load("glm5-fp8-tp8")


def glm_budget(glm, tokens=32768):
    return Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, tokens)


def test_kv_cache_arithmetic_by_hand():
    """KV cache = utilization x total - non-KV, floored to whole blocks; never negative."""
    budget = Budget(gpu_memory_bytes=80 * GiB, utilization=0.85, max_num_batched_tokens=32768)
    assert budget.requested_bytes == 73_014_444_032  # 0.85 x 85,899,345,920
    block = 64 * 656 * 78  # block_size x fp8_ds_mla bytes x layers = 3,274,752
    # 73,014,444,032 - 53,687,091,200 = 19,327,352,832 = 5901.9 blocks -> 5901 blocks
    assert kv_cache_bytes(budget, 50 * GiB, block) == 5901 * 3_274_752 == 19_324_311_552
    assert kv_cache_bytes(budget, 70 * GiB, block) == 0


def test_engine_case_adds_up_for_glm5(glm):
    """The predicted glm5 case: block size, profile peak and KV size, each worked by hand."""
    # 64 tokens x 78 layers x (656 B fp8_ds_mla + 132 B indexer keys), one cache group
    assert kv_block_bytes(glm) == 3_933_696
    # hidden_states + residual (32768 x 6144 x 2 B each) + q (32768 x 8 x 576 x 2 B)
    # + attn_output (32768 x 8 x 512 x 2 B) = 2 x 402,653,184 + 301,989,888 + 268,435,456
    assert sum(s.nbytes for s in activation_specs(glm, 32768)) == 1_375_731_712
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), glm_budget(glm), "workspace",
                   sm_count=132)
    # the residual stream (805,306,368) under the largest stage beyond attention, the indexer's
    # profile branch with the DSA layer's locals beside it (vllm_pass.attention_locals:
    # 32768 x 39,616 B = 1,298,137,088; the indexer's fp8 query and weights, its 512-MiB
    # logits and the top-k exchange: 1,212,153,856) = 2,510,290,944, past the sampler's over
    # the PR's 256 requests (561,381,376); the emulated allocator's rounding adds 917,504
    assert case.profile_peak_bytes == 805_306_368 + 2_510_290_944 + 917_504 == 3_316_514_816
    assert case.workspace_bytes == 32768 * 64 * (576 + 512) * 2  # padded q + out, bf16
    # init: 40 GiB of placeholder weights (42,949,672,960) + that workspace (4,563,402,752) + the
    # indexer's top-k buffer (32768 x 2048 x 4 B = 268,435,456) + the synthetic KV pool of the
    # inputs (4 x 2048 tokens x 656 B = 5,373,952) = 47,786,885,120; then what vLLM keeps: the
    # shared workspace's excess over the path's (the fused MoE's workspace13 + workspace2,
    # 2 x 32768 x 8 x 6144 x 2 B = 6 GiB, less 4,563,402,752 = 1,879,048,192) and the sampler's
    # top-k/top-p scratch (132 SMs x 154880 x 4 B = 81,776,640, a 78-MiB block)
    assert case.init_bytes == 47_786_885_120 + 1_879_048_192 + 81_788_928 == 49_747_722_240
    # 0.85 x 81079 MiB = 72,264,869,478 B requested, less init and the profile peak
    # (53,064,237,056; no non-torch memory in this simulated memory) leaves 19,200,632,422 B:
    # 4881.07 blocks of 3,933,696 B, so 4881 blocks of 64 tokens (max_model_len 131072 is
    # whole blocks: the count vLLM logs is every block's 64 tokens)
    assert case.kv_cache_bytes == 4881 * 3_933_696 == 19_200_370_176
    assert case.kv_cache_tokens == 4881 * 64 == 312_384
    assert case.headroom_bytes == case.torch_limit_bytes - case.step_peak_bytes > 0


def test_predicted_glm5_defaults(glm):
    """glm5 defaults (32768 tokens, past the alloc path's limit 31488 with the DSA layer's
    attention locals): the alloc path OOMs on the 8 GiB o_accum; the workspace path fits."""
    result = run_repro(glm, glm_budget(glm), ["alloc", "workspace"], command="test",
                       predict=True)
    alloc, workspace = result.cases
    assert not result.measured
    assert alloc["verdict"] == "oom" and alloc["phase"] == "step"
    assert alloc["oom_buffer"] == "o_accum" and alloc["oom_allocated_by"] == "kernel"
    assert alloc["oom_requested_bytes"] == 8 * GiB
    assert 0 < alloc["free_bytes_at_oom"] < 8 * GiB
    assert workspace["verdict"] == "fits" and workspace["headroom_bytes"] > 0
    assert alloc["out_staging_gain_bytes"] == 32768 * 64 * 512 * 2
    assert 0 < alloc["max_safe_tokens"] < 32768 < workspace["max_safe_tokens"]
    assert "predicted" in alloc["max_safe_method"]


def test_max_safe_tokens_is_the_boundary(glm):
    """The reported largest safe T fits and T + 1 does not, on the model."""
    result = run_repro(glm, glm_budget(glm), ["alloc"], command="test", predict=True)
    limit = result.cases[0]["max_safe_tokens"]
    for tokens, verdict in ((limit, "fits"), (limit + 1, "oom")):
        target = host_setup("flashmla", predict=True, target_bytes=glm.gpu.memory_bytes)
        case = VLLM.emulate(SimulatedMemory(non_torch=target), glm, FlashMLA(),
                            glm_budget(glm, tokens), "alloc", sm_count=132)
        assert case.verdict == verdict


H200_RUNS = FIXTURES / "reports" / "non-torch-h200"


@pytest.mark.parametrize("name", ["deepseek-v32-fp8-tp8", "kimi-k2-fp8-tp4-dp",
                                  "kimi-k2-context-reuse"])
def test_prediction_equals_the_h200_run(name, monkeypatch, vllm_cache_as_measured,
                                        rank_before_stages):
    """Every verdict, KV size, headroom and largest safe T of a fresh H200 run of an H200
    target, predicted to the byte (only what a prediction cannot give is skipped, by name).
    These runs (2026-12-02) charged the device-wide non-torch reading, as a case does where NVML
    does not list its process: the model charges the same, the record's context and
    process_bytes together. They predate the rank's stages beyond attention: the rank is
    predicted as it ran (`rank_before_stages`)."""
    from mlamem.commands import repro
    from mlamem.runtime.non_torch import calibrated

    found = repro.host_setup

    def device_wide(kernel, predict=False, **target):
        setup = found(kernel, predict=True, **target)
        return calibrated(setup, 0, setup.process_bytes, device_wide=True)

    monkeypatch.setattr(repro, "host_setup", device_wide)
    measured = json.loads((H200_RUNS / f"{name}.json").read_text())
    assert all(c.get("nvml_visibility") is None for c in measured["cases"])  # device-wide
    chosen = scenario_as_run(name, measured["budget"])
    budget = Budget(**{k: measured["budget"][k] for k in
                       ("gpu_memory_bytes", "utilization", "max_num_batched_tokens")})
    predicted = run_repro(chosen, budget, ["alloc", "workspace"], command="test", predict=True)
    assert measured["measured"] and not predicted.measured
    assert prediction_differences(measured, predicted) == []


def test_a_smaller_target_measured_without_its_physical_room_differs_only_in_the_limits(
        vllm_cache_as_measured, rank_before_stages):
    """GLM-5's 81559 MiB target of 2026-12-02 ran on the H200's larger memory, before a measured
    run kept to the target's room: the modules its step loads took the H200's spare memory, so
    its limits (31856, 39008) are above the prediction with the target as the physical device
    (lower); every other field is equal. The run predates the rank's stages beyond attention,
    predicted as it ran (`rank_before_stages`)."""
    from mlamem.commands import repro
    from mlamem.runtime.non_torch import calibrated

    setup = repro.host_setup("flashmla", predict=True, target_bytes=81559 * 2**20)
    measured = json.loads((H200_RUNS / "glm5-fp8-tp8.json").read_text())
    chosen = scenario_as_run("glm5-fp8-tp8", measured["budget"])
    budget = Budget(**{k: measured["budget"][k] for k in
                       ("gpu_memory_bytes", "utilization", "max_num_batched_tokens")})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repro, "host_setup", lambda kernel, predict=False, **target: calibrated(
            setup, 0, setup.process_bytes, device_wide=True))
        predicted = run_repro(chosen, budget, ["alloc", "workspace"], command="test",
                              predict=True)
    differences = prediction_differences(measured, predicted)
    assert [d.split(": ")[:2] for d in differences] == [["alloc", "max_safe_tokens"],
                                                       ["workspace", "max_safe_tokens"]]
    for was, case in zip(measured["cases"], predicted.cases, strict=True):
        assert case["max_safe_tokens"] < was["max_safe_tokens"]


def test_h200_limits_as_the_issue_states():
    """GLM-5 defaults on the H200: 31856 (alloc) and 39008 (workspace) tokens, confirmed."""
    glm = json.loads((H200_RUNS / "glm5-fp8-tp8.json").read_text())
    assert [c["max_safe_tokens"] for c in glm["cases"]] == [31856, 39008]
    assert all("confirmed on the GPU" in c["max_safe_method"] for c in glm["cases"])


@pytest.mark.parametrize(("threshold", "guess"), [(37, 32768), (37, 37), (40000, 32768),
                                                  (1, 5), (0, 100), (1 << 21, 3)])
def test_largest_fitting_finds_the_threshold(threshold, guess):
    """Galloping from the guess, then bisecting, finds the last T that fits."""
    found, calls = largest_fitting(lambda t: t <= threshold, guess)
    assert found == threshold
    if guess == threshold and 0 < threshold < 1 << 21:
        assert calls == 2  # a right guess is confirmed by two probes


class _RaisingKernel(FlashMLA):
    """Runs on the meta device and fails the way a stable-ABI kernel does."""

    runs_on_meta = True

    def __init__(self, error: str):
        super().__init__()
        self.error = error

    def run(self, problem, q, inputs, *, out=None, **staged):
        if self.error == "oom":
            try:
                return simulate_run(self, 132, problem, q, inputs, out=out, **staged)
            except AllocatorOutOfMemory:  # what crosses the stable ABI is a RuntimeError
                raise RuntimeError('torch_call_dispatcher("aten::new_empty", ...) failed') from None
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_oom_as_runtime_error_is_an_oom(glm):
    """An OOM that arrives as a RuntimeError is classified by num_ooms and named from the trace."""
    case = VLLM.emulate(SimulatedMemory(), glm, _RaisingKernel("oom"), glm_budget(glm), "alloc",
                        sm_count=132)
    assert case.verdict == "oom" and case.failure.startswith("RuntimeError: torch_call_dispatcher")
    assert case.oom_buffer == "o_accum" and case.oom_requested_bytes == 8 * GiB


def test_other_kernel_failure_is_an_error(glm):
    """A kernel failure that is not an OOM is reported as an error, never as an OOM."""
    case = VLLM.emulate(SimulatedMemory(), glm, _RaisingKernel("illegal"), glm_budget(glm),
                   "workspace", sm_count=132)
    assert case.verdict == "error" and "illegal memory access" in case.failure
    assert case.oom_buffer is None and case.oom_requested_bytes is None


def test_is_out_of_memory_classification():
    """OutOfMemoryError is an OOM; a RuntimeError only with num_ooms growing or OOM text."""
    assert is_out_of_memory(torch.OutOfMemoryError("x"), 0, 0)
    assert is_out_of_memory(RuntimeError("torch_call_dispatcher aten::new_empty"), 3, 4)
    assert not is_out_of_memory(RuntimeError("CUDA error: illegal memory access"), 3, 3)
    assert not is_out_of_memory(ValueError("CUDA out of memory"), 0, 1)


def test_no_kv_room_is_its_own_verdict(glm):
    """When init and profile leave nothing for the KV cache, the engine does not start."""
    # init (40 GiB of weights, the workspaces: 46.3 GiB) and the profile peak (3.1 GiB) fit in
    # 56 GiB but exceed 0.85 x 56 GiB = 47.6 GiB
    budget = Budget(56 * GiB, 0.85, 32768)
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "alloc", sm_count=132)
    assert case.verdict == "no-kv-room" and case.phase == "kv-cache"


def test_a_crashed_case_still_gets_a_verdict(glm):
    """A case process that dies without a result becomes 'crashed', naming the signal."""
    request = {"path": "alloc", "budget": {"max_num_batched_tokens": 1024}}
    case = run_case(request, worker=[sys.executable, "-c", "import os; os.abort()"])
    assert case["verdict"] == "crashed" and "SIGABRT" in case["failure"]


@no_gpu
def test_case_process_reports_what_it_cannot_measure(glm):
    """The real case process runs, and without a GPU says why it measured nothing."""
    request = {"scenario": scenarios.to_dict(glm), "path": "alloc", "kernel": "flashmla",
               "budget": {"gpu_memory_bytes": 80 * GiB, "utilization": 0.85,
                          "max_num_batched_tokens": 1024}}
    case = run_case(request)
    assert case["verdict"] == "error" and case["failure"].startswith("cannot measure")


def test_local_gpu_must_hold_the_target():
    """A target GPU larger than the local one is refused with the fix: nvidia-smi's H100 figure
    (81559 MiB) on an H100, whose CUDA total is 81079 MiB, is told the local figure."""
    check_local_gpu(Budget(80 * GiB, 0.85, 1), 140 * GiB, "H200")
    with pytest.raises(UserError, match="no larger than the local one"):
        check_local_gpu(Budget(200 * GiB, 0.85, 1), 140 * GiB, "H200")
    with pytest.raises(UserError, match=r"79\.179 GiB; .* e\.g\. its own 81079MiB$") as error:
        check_local_gpu(Budget(81559 * 2**20, 0.85, 1), 85017493504, "NVIDIA H100 80GB HBM3")
    assert error.value.field == "gpu_memory_bytes"


@no_gpu
def test_cli_json_and_expectations(capsys, tmp_path):
    """JSON has a verdict per path; --expect-* turn verdicts into exit codes."""
    target = tmp_path / "repro.json"
    assert main(["repro-oom", "--format", "json", "--output", str(target),
                 "--expect-oom", "alloc", "--expect-fit", "workspace"]) == 0
    data = json.loads(target.read_text())
    assert data["schema"] == "mlamem.repro-oom/1" and data["measured"] is False
    assert [c["verdict"] for c in data["cases"]] == ["oom", "fits"]
    assert main(["repro-oom", "--paths", "alloc", "--expect-fit", "alloc"]) == 1
    assert "expected to fit but oom" in capsys.readouterr().err


@no_gpu
def test_cli_markdown_labels_prediction(capsys):
    """The Markdown says PREDICTED and names the failing buffer."""
    assert main(["repro-oom", "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "PREDICTED" in text and "OOM in step: o_accum (8.000 GiB, by kernel)" in text


def test_context_reuse_three_ways():
    """kimi-k2-context-reuse, predicted: no reserve and the fp8-only reserve OOM on the BF16
    full_kv; the everything-charged reserve fits by trimming requests at its admission cap."""
    kimi = scenarios.load("kimi-k2-context-reuse")
    budget = Budget(kimi.gpu.memory_bytes, kimi.gpu.gpu_memory_utilization, 8192)
    result = run_repro(kimi, budget, ["alloc"], command="test", predict=True)
    none, fp8, full = result.cases
    assert result.engine == "trtllm-context-reuse"
    assert [c["variant"] for c in result.cases] == ["none", "fp8", "full"]
    for case in (none, fp8):
        assert case["verdict"] == "oom" and case["oom_buffer"] == "full_kv"
        assert case["attended_tokens"] == 16 * 32768 and case["trimmed"] == []
    assert fp8["reserve_bytes"] == 20_480 * 16 * 32768  # w x L_cap, under the clamp
    assert full["verdict"] == "fits" and full["headroom_bytes"] > 0
    assert full["admitted"] == list(range(10)) and full["trimmed"] == list(range(10, 16))
    assert full["attended_tokens"] <= full["admission_cap_tokens"]
    assert none["kv_pool_tokens"] > fp8["kv_pool_tokens"] > full["kv_pool_tokens"]


def test_context_reuse_result_renders_in_a_report(tmp_path, capsys):
    """A saved context-reuse result reads back into `mlamem report` with its three variants."""
    saved, report = tmp_path / "ctx.json", tmp_path / "report.md"
    assert main(["repro-oom", "-s", "kimi-k2-context-reuse", "--predict", "--format", "json",
                 "--output", str(saved)]) == 0
    assert main(["report", str(saved), "--output", str(report)]) == 0
    text = report.read_text()
    assert "### Context-MLA reuse OOM: kimi-k2-context-reuse (PREDICTED)" in text
    assert "| fp8-only reserve (the PR) | OOM in step: full_kv" in text


def test_repro_workspace_full_step_allocates_only_the_engines_buffers(glm):
    """With every kernel buffer staged, the step allocates only the engine's activations."""
    budget = Budget(gpu_memory_bytes=glm.gpu.memory_bytes,
                    utilization=glm.gpu.gpu_memory_utilization,
                    max_num_batched_tokens=glm.serving.max_num_batched_tokens)
    result = run_repro(glm, budget, ["workspace", "workspace-full"], command="t",
                       kernel=TritonDecode(), predict=True)
    workspace, full = result.cases
    assert result.kernel["name"] == "triton"
    assert full["verdict"] == "fits"
    assert {b.allocated_by for b in full["buffers"]} == {"engine"}
    assert "o_accum" in {b.name for b in workspace["buffers"]}
    extra = full["workspace_bytes"] - workspace["workspace_bytes"]
    lse = BufferSpec("lse", (64 * budget.max_num_batched_tokens,), torch.float32, "returned")
    assert lse.nbytes < extra < lse.nbytes + 64 * 2**20  # lse plus tens of MB of accumulators


def test_the_target_gpu_is_the_physical_device_of_the_prediction():
    """GLM-5's H100 target is predicted on the H100's record, its memory the physical device:
    31488 and 38257 with the DSA layer's attention locals (predicted; the H100 of 2026-12-06
    measured the rank before them: reports/repro-oom-h100/h100). DeepSeek-V3.2's H200 target
    on the H200's record.
    A target no record holds takes the nearest record's figures with its own memory, and says
    which."""
    def predicted(name, gpu_memory_bytes=None):
        chosen = scenarios.load(name)
        budget = Budget(gpu_memory_bytes or chosen.gpu.memory_bytes, 0.85, 32768)
        return run_repro(chosen, budget, ["alloc", "workspace"], command="test", predict=True)

    glm = predicted("glm5-fp8-tp8")
    assert [c["max_safe_tokens"] for c in glm.cases] == [31488, 38257]
    assert glm.non_torch.gpu == "NVIDIA H100 80GB HBM3" and glm.non_torch.assumed is None
    assert not any("spare" in n for n in glm.notes)
    deepseek = predicted("deepseek-v32-fp8-tp8")
    assert deepseek.non_torch.gpu_memory_bytes == 150109880320  # the H200's own total
    other = predicted("glm5-fp8-tp8", 100 * 2**30)
    assert other.non_torch.gpu_memory_bytes == 100 * 2**30
    assert ("no record of the 100.000 GiB target: the nearest record, the NVIDIA H100 80GB "
            "HBM3's, with the target's memory as the physical device") in other.non_torch.assumed
    assert any("the nearest record" in n for n in other.notes)


def _predicted_json(args: list[str], tmp_path, capsys) -> dict:
    output = tmp_path / "predicted.json"
    assert main(["repro-oom", *args, "--predict", "--format", "json", "--output", str(output)]) == 0
    capsys.readouterr()
    return json.loads(output.read_text())


@pytest.mark.parametrize("memory", ["150GiB", "1TiB"])
def test_a_target_larger_than_every_record_is_modelled_with_its_own_memory(memory, tmp_path,
                                                                          capsys):
    """--gpu-memory above the recorded H200's (150 GiB, 1 TiB): the target is the physical
    device, so the KV cache the budget sizes fits in it and both paths reach the step (they ran
    out of memory on the KV cache itself, at exit 0, while the H200's memory was the device);
    the non-torch figures are the nearest record's, and the result says so."""
    result = _predicted_json(["--gpu-memory", memory], tmp_path, capsys)
    for case in result["cases"]:
        assert case["oom_buffer"] != "kv_cache" and case["phase"] in ("step", "done"), case
        assert case["max_safe_tokens"], case
    assert result["non_torch"]["gpu"] == "NVIDIA H200"  # the nearest record: the largest
    assert result["non_torch"]["gpu_memory_bytes"] == result["budget"]["gpu_memory_bytes"]
    assert any("no record of the" in n and "nearest record" in n for n in result["notes"])


@pytest.mark.parametrize(("gpu", "words"), [
    ("B200", "FlashMLA's SM100 kernels (B200, compute capability 10.0) are not modelled"),
    ("A100", "FlashMLA has no kernel for the A100 80GB (compute capability 8.0)")])
def test_a_target_without_a_modelled_flashmla_kernel_is_refused_in_one_line(gpu, words, capsys):
    """FlashMLA on a B200 (SM100: kernels not modelled nor measured here) or an A100 (SM80: no
    FlashMLA kernel) is refused in one line, exit 2: a B200 was predicted with SM90's
    accumulators (an OOM of the KV cache on the H200's memory), an A100 at 108 SMs, silently."""
    assert main(["repro-oom", "--gpu", gpu, "--predict"]) == 2
    assert words in one_line_error(capsys)


def test_an_a100_target_is_refused_for_flashmla_only(tmp_path, capsys):
    """The refusal is the kernel's: the Triton decode, which runs on an A100, is predicted."""
    result = _predicted_json(["--gpu", "A100", "--kernel", "triton"], tmp_path, capsys)
    assert result["kernel"]["sm_count"] == 108
