"""The engines package: its registry, the skeleton's order, a scenario's `engines`, --engine,
old results' `mode`, and that the old modules are gone."""

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlamem.commands.repro import read_result, run_case, run_repro, scenario_engine
from mlamem.engines import engine_names, engine_spec, load_engine, request_engine
from mlamem.engines.base import Budget, Engine, Phase, Verdict
from mlamem.engines.vllm import VLLM
from mlamem.kernels import FlashMLA
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError
from mlamem.testing import check_bad_input, no_gpu, scenario_file

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1024**3
MiB = 1024**2


def test_registry_names_and_loads_each_engine():
    """Every registered name loads an Engine subclass of that name, whose case names itself
    by a field the case has: its spec's key field, its spec the one the registry holds."""
    assert engine_names() == ["vllm", "trtllm-context-reuse", "sglang"]
    for name in engine_names():
        engine, spec = load_engine(name), engine_spec(name)
        assert issubclass(engine, Engine) and engine.name == name == spec.name
        assert engine.spec is spec and engine.view is spec.view
        assert engine.case_type.key_field == spec.key_field
        assert (engine.reads_utilization, engine.searched_fraction, engine.step_knob_name) == (
            spec.reads_utilization, spec.searched_fraction, spec.step_knob_name)
        assert engine.case_type.key_field in {f for f in engine.case_type.__dataclass_fields__}
    with pytest.raises(ValueError, match="unknown engine 'sgl'; expected one of vllm, "):
        load_engine("sgl")


def test_registry_imports_no_engine_module():
    """Listing the engines and validating a scenario import neither torch nor an engine's rank:
    only the engines' spec modules (their scenario tables)."""
    code = ("import sys; from mlamem.engines import engine_names; engine_names(); "
            "from mlamem.spec import scenario; scenario.load('kimi-k2-context-reuse'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('mlamem.engines.')))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_old_modules_are_gone():
    """mlamem.engine and mlamem.context_reuse no longer exist; the engines package replaced them."""
    for old in ("mlamem.engine", "mlamem.context_reuse"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_verdicts_and_phases_serialise_as_before():
    """The enums write the strings mlamem.repro-oom/1 has always had, and the graph phases sit
    between profile, KV sizing and the step."""
    assert [v.value for v in Verdict] == ["fits", "oom", "no-kv-room", "error", "crashed"]
    assert [p.value for p in Phase] == ["init", "profile", "graph-estimate", "kv-cache",
                                       "capture", "step", "done"]
    assert json.dumps({"verdict": Verdict.NO_KV_ROOM}) == '{"verdict": "no-kv-room"}'


def test_skeleton_calls_the_phases_in_order():
    """emulate runs init, profile, the graph estimate, KV sizing, the capture, then the step."""
    calls = []

    class Traced(VLLM):
        def init(self):
            calls.append(("init", self.case.phase))
            super().init()

        def profile(self):
            calls.append(("profile", self.case.phase))
            super().profile()

        def estimate_graphs(self):
            calls.append(("estimate_graphs", self.case.phase))

        def size_kv_cache(self):
            calls.append(("size_kv_cache", self.case.phase))
            return super().size_kv_cache()

        def capture_graphs(self):
            calls.append(("capture_graphs", self.case.phase))

        def step(self):
            calls.append(("step", self.case.phase))
            return super().step()

    glm = scenarios.load("glm5-fp8-tp8")
    budget = Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 1024)
    case = Traced.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "workspace", sm_count=132)
    assert calls == [("init", "init"), ("profile", "profile"),
                     ("estimate_graphs", "graph-estimate"), ("size_kv_cache", "kv-cache"),
                     ("capture_graphs", "capture"), ("step", "step")]
    assert case.verdict == "fits" and case.phase == "done"


def test_a_failure_before_the_step_names_what_the_engine_allocated():
    """An OOM in init is the engine's own allocation: named by what it was allocating."""
    glm = scenarios.load("glm5-fp8-tp8")
    budget = Budget(30 * GiB, 0.85, 1024)  # 40 GiB of placeholder weights do not fit under it
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "alloc", sm_count=132)
    assert case.verdict == "oom" and case.phase == "init"
    assert case.oom_buffer == "weights" and case.oom_allocated_by == "init"
    assert case.oom_requested_bytes == glm.parallel.weights_bytes


def test_scenario_engines_default_and_declared():
    """A file without `engines` serves vLLM; glm5-fp8-tp8 declares vLLM first, then SGLang;
    kimi-k2-context-reuse declares context reuse first, so repro-oom's default stays the
    context-reuse reproduction."""
    assert scenarios.load("kimi-k2-fp8-tp4-dp").engines == ("vllm",)
    glm = scenarios.load("glm5-fp8-tp8")
    assert glm.engines == ("vllm", "sglang") and scenario_engine(glm).name == "vllm"
    kimi = scenarios.load("kimi-k2-context-reuse")
    assert kimi.engines == ("trtllm-context-reuse", "vllm")
    assert scenario_engine(kimi).name == "trtllm-context-reuse"
    assert scenario_engine(kimi, "vllm").name == "vllm"
    assert scenarios.from_dict(scenarios.to_dict(kimi), "again").engines == kimi.engines


@pytest.mark.parametrize(("engines", "problem"), [
    ('["sgl"]', "has unknown 'sgl'; expected names from ['vllm', 'trtllm-context-reuse', 'sglang']"),
    ("[]", "is empty"),
    ('["vllm", "vllm"]', "lists 'vllm' more than once"),
    ('"vllm"', "must be a list of names"),
])
def test_scenario_engines_are_checked(tmp_path, engines, problem):
    """`engines` lists registered names, each once; anything else is one line naming the field."""
    path = scenario_file(tmp_path, edits={'engines = ["vllm", "sglang"]': f"engines = {engines}"})
    with pytest.raises(UserError, match="top].engines") as caught:
        scenarios.load(str(path))
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_undeclared_engine_is_one_line_exit_2():
    """--engine naming an engine the scenario does not declare exits 2 naming the declared."""
    line = check_bad_input(["repro-oom", "--predict", "--engine", "trtllm-context-reuse"],
                           "glm5-fp8-tp8 declares vllm")
    assert line.startswith("mlamem: error: --engine: ") and "not trtllm-context-reuse" in line
    check_bad_input(["repro-oom", "-s", "kimi-k2-fp8-tp4-dp", "--predict", "--engine", "sglang"],
                    "declares vllm")


def test_context_reuse_refuses_a_scenario_without_block_reuse(tmp_path):
    """The context-reuse engine, declared on a scenario without block reuse, refuses it in one
    line naming the serving fields it needs."""
    path = scenario_file(tmp_path, edits={'engines = ["vllm", "sglang"]':
                                          'engines = ["trtllm-context-reuse"]'})
    line = check_bad_input(["repro-oom", "-s", str(path), "--predict"], "block_reuse = true")
    assert "has block_reuse = false, chunked_prefill = " in line


def test_expectations_are_checked_against_the_chosen_engine():
    """--expect-oom names a case of the chosen engine: a variant for context reuse, a path
    for vLLM on the same scenario."""
    check_bad_input(["repro-oom", "-s", "kimi-k2-context-reuse", "--predict", "--expect-oom",
                     "alloc"], "not among the reserve variants none,fp8,full")
    check_bad_input(["repro-oom", "-s", "kimi-k2-context-reuse", "--engine", "vllm", "--predict",
                     "--expect-oom", "fp8"], "not among the --paths alloc,workspace")


def test_vllm_on_the_context_reuse_scenario(capsys):
    """--engine vllm runs kimi-k2-context-reuse's sparse decode step per path, as plan reads it."""
    from mlamem.cli import main

    assert main(["repro-oom", "-s", "kimi-k2-context-reuse", "--engine", "vllm", "--predict",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "vllm" and "mode" not in data
    assert [c["path"] for c in data["cases"]] == ["alloc", "workspace"]
    assert all("max_safe_tokens" in c for c in data["cases"])


@pytest.mark.parametrize(("mode", "engine"), [("decode", "vllm"), (None, "vllm"),
                                              ("context-reuse", "trtllm-context-reuse")])
def test_old_results_map_mode_to_the_engine(mode, engine):
    """A file written before `engine` reads with the engine its `mode` meant (none: decode)."""
    data = json.loads((FIXTURES / "results" / "repro-oom-glm5-h200.json").read_text())
    data.pop("engine", None)
    data.pop("mode", None)
    if mode is not None:
        data["mode"] = mode
    result = read_result(data)
    assert result.engine == engine and "mode" not in result.file_dict()


def test_a_new_result_names_its_engine():
    """run_repro writes `engine`, not `mode`, and a saved result reads back unchanged."""
    kimi = scenarios.load("kimi-k2-context-reuse")
    budget = Budget(kimi.gpu.memory_bytes, kimi.gpu.gpu_memory_utilization, 8192)
    result = run_repro(kimi, budget, ["alloc"], command="test", predict=True)
    data = json.loads(json.dumps(result.file_dict()))
    assert data["engine"] == "trtllm-context-reuse" and "mode" not in data
    assert read_result(data).file_dict() == data


def test_requests_name_their_engine():
    """A case request names its engine; one from before `engine` is read by its case key."""
    assert request_engine({"engine": "vllm", "variant": "fp8"}) == "vllm"
    assert request_engine({"variant": "fp8"}) == "trtllm-context-reuse"
    assert request_engine({"path": "alloc"}) == "vllm"


@no_gpu
def test_the_case_process_reads_an_old_style_request():
    """`python -m mlamem.engines` still takes a request without `engine` that names a reserve
    variant, and answers with a context-reuse case saying why it measured nothing."""
    kimi = scenarios.load("kimi-k2-context-reuse")
    request = {"scenario": scenarios.to_dict(kimi), "variant": "fp8", "kernel": "flashmla",
               "budget": {"gpu_memory_bytes": kimi.gpu.memory_bytes, "utilization": 0.9,
                          "max_num_batched_tokens": 8192}}
    case = run_case(request)
    assert case["variant"] == "fp8" and "budget_bytes" in case and "path" not in case
    assert case["verdict"] == "error" and case["failure"].startswith("cannot measure")


def test_a_case_embeds_its_steps_record_and_saves_the_figures_it_always_saved():
    """The step's CallRecord rides on the case; its JSON is the case's fields, no record."""
    glm = scenarios.load("glm5-fp8-tp8")
    budget = Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 1024)
    case = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "alloc", sm_count=132)
    assert case.verdict == "fits" and case.call.failure is None
    assert case.step_peak_bytes == case.call.after.peak_reserved
    assert case.buffers and case.buffers == [b.to_dict() for b in case.call.buffers]
    data = case.to_dict()
    assert "call" not in data and list(data)[0] == "path"
    assert json.loads(json.dumps(data))["step_peak_bytes"] == case.step_peak_bytes


def test_each_engine_builds_its_own_budget():
    """An engine's budget holds its own options (vLLM's CUDA graphs); an option an engine lacks
    passes while off and is refused, naming the field, when set."""
    from mlamem.engines.vllm import VLLMBudget

    knobs = {"gpu_memory_bytes": 80 * GiB, "utilization": 0.85, "max_num_batched_tokens": 1024}
    vllm = VLLM.make_budget(**knobs, cuda_graphs=True, capture_sizes=[8, 1])
    assert isinstance(vllm, VLLMBudget) and vllm.capture_sizes == (8, 1)
    assert vllm.to_dict()["cuda_graphs"] is True
    assert "cuda_graphs" not in VLLM.make_budget(**knobs).to_dict()
    context_reuse = load_engine("trtllm-context-reuse")
    assert context_reuse.make_budget(**knobs, cuda_graphs=False, capture_sizes=None) == Budget(**knobs)
    with pytest.raises(UserError) as refused:
        context_reuse.make_budget(**knobs, cuda_graphs=True)
    assert refused.value.field == "cuda_graphs"
    assert (VLLM.searched_knob, context_reuse.searched_knob) == ("max_num_batched_tokens", None)


def test_a_predicted_case_has_no_nvml_fields():
    """Nothing is read from NVML on the model: a predicted case's JSON is as it read before the
    NVML readings, for every engine; a measured case names them (None until read)."""
    from mlamem.engines.base import NVML_FIELDS
    glm = scenarios.load("glm5-fp8-tp8")
    budget = Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization, 1024)
    predicted = VLLM.emulate(SimulatedMemory(), glm, FlashMLA(), budget, "alloc", sm_count=132)
    assert not set(NVML_FIELDS) & set(predicted.to_dict())
    measured = dataclasses.replace(predicted, measured=True).to_dict()
    assert {"nvml_visibility", "nvml_process_step_peak_bytes", "other_processes_bytes",
            "non_torch_process_bytes", "non_torch_device_bytes"} <= set(measured)
    assert "graph_estimate_other_processes_bytes" not in measured  # graphs off: no graph_ field


@pytest.mark.parametrize(("others", "said"), [(2 * GiB, "2.000 GiB"), (None, "unknown")])
def test_the_note_says_vllms_graph_estimate_stays_device_wide(others, said):
    """With CUDA graphs, a case's note says the estimate reads the device as vLLM does, and the
    others' use then (unknown where NVML does not list this process); a case that read nothing
    (crashed) has no note."""
    from mlamem.commands.repro import non_torch_notes
    case = {"path": "workspace", "nvml_visibility": "this process", "non_torch_bytes": 500 * MiB,
            "non_torch_process_bytes": 500 * MiB, "non_torch_device_bytes": 501 * MiB,
            "other_processes_bytes": 0, "graph_estimate_other_processes_bytes": others}
    [note] = non_torch_notes([case, {"path": "alloc", "nvml_visibility": None}], "path")
    assert note.startswith("workspace: non-torch memory charged from this process's own NVML "
                           "figure (500.000 MiB)")
    assert note.endswith("other processes using 0 B then; vLLM's CUDA-graph estimate stays "
                         "device-wide, as vLLM reads it (mem_get_info's growth): other processes "
                         f"used {said} then")
