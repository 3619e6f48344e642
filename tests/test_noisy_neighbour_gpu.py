"""A noisy neighbour on the same GPU: a second process allocates and frees 2 GiB in a loop
while a `profile` sweep, a `graphs` run and a `repro-oom` run run. Every allocator figure and
every per-process figure equals the run without it; the figures read device-wide (NVML's used
memory, mem_get_info), as engines read them, are the ones it moves. repro-oom charges this
process's own non-torch memory where NVML lists it, so its KV cache, cap, headroom, verdict and
limits are in the stable set; its device-wide readings are recorded beside them, labelled. On
its case, this process's NVML step peak equals the allocator's reserved peak plus the non-torch
memory the model gives (mlamem/non_torch.toml), within TOLERANCE_BYTES.

Each mlamem run is a fresh process (`python -P -m mlamem`, or repro's case process), so this
pytest process's own CUDA state is the same static neighbour to both runs."""

import json
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from mlamem.runtime import nvml
from mlamem.testing import needs_flashmla

pytestmark = needs_flashmla
GiB = 1024**3
SCENARIO = "glm5-fp8-tp8"
# The model charges this process's own non-torch memory (context and modules), as a measured
# case does where NVML lists it; the H200 record is this process's own figure (non_torch_probe.py
# step-ops, 2026-12-05), which the case's equalled to the byte on that host (639631360 B at the
# workspace step, quiet and noisy alike). Another host's driver may hold a few MiB more or less
# (the device-wide reading moved 3.25 MiB between two H200s), hence 4 MiB.
TOLERANCE_BYTES = 4 << 20
# The neighbour: 2 GiB taken and given back every few milliseconds, a dot per cycle in its log.
NEIGHBOUR = """
import sys, time, torch
torch.empty(1, device="cuda")
print("ready", flush=True)
while True:
    block = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.004)
    del block
    torch.cuda.empty_cache()
    time.sleep(0.004)
    sys.stdout.write("."); sys.stdout.flush()
"""
NEIGHBOUR_ROOM_BYTES = 3 * GiB  # its 2 GiB block and its CUDA context
# The figures a neighbour moves: read device-wide (the engines' way), or times.
DEVICE_WIDE = {"nvml_peak_bytes", "wall_time_ms", "median_ms", "device_growth_bytes",
               "device_bytes", "unexplained_device_bytes", "created", "command", "environment",
               "notes", "other_processes_bytes", "graph_estimate_other_processes_bytes"}
# A repro-oom case's device-wide readings, recorded beside the charged figures: the neighbour's
DEVICE_WIDE_READINGS = {"non_torch_device_bytes", "nvml_step_peak_bytes"}
# Where NVML does not list the case's process (a container), the charge falls back to the
# device-wide reading, and these move with it: the cap, the KV cache sized under it, the step's
# peak and headroom that hold it, and the limits searched from it
FROM_DEVICE_WIDE_FALLBACK = {"non_torch_bytes", "torch_limit_bytes", "kv_cache_bytes",
                             "kv_cache_tokens", "step_peak_bytes", "headroom_bytes",
                             "nvml_process_step_peak_bytes", "free_bytes_at_oom",
                             "max_safe_tokens", "max_safe_method"}


@contextmanager
def neighbour(log_path):
    """The neighbour, started and ready (its CUDA context made), for the body; it must still be
    cycling at the end, and its log shows it cycled."""
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=log,
                                 stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while "ready" not in log_path.read_text():  # after any warning CUDA prints first
            assert child.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the neighbour never got ready"
            time.sleep(0.1)
        yield
        assert child.poll() is None, f"the neighbour stopped: {log_path.read_text()[-500:]}"
    finally:
        child.terminate()
        child.wait(timeout=60)
    assert log_path.read_text().count(".") > 10, "the neighbour barely cycled"


def _room_for_the_neighbour_or_skip(target_mib: int) -> None:
    """repro-oom caps its rank at the target GPU's memory: on a device no larger (an H100 for the
    H100 target), the neighbour's 2 GiB and its CUDA context find no room beside it."""
    handle = nvml.nvml_query("nvmlDeviceGetHandleByIndex", 0)
    memory = None if handle is None else nvml.nvml_query("nvmlDeviceGetMemoryInfo", handle)
    if memory is None or memory.total < target_mib * 2**20 + NEIGHBOUR_ROOM_BYTES:
        pytest.skip(f"no room for the neighbour beside a {target_mib} MiB rank on this device "
                    "(an H200 has it)")


def _mlamem(*args: str, output) -> dict:
    done = subprocess.run([sys.executable, "-P", "-m", "mlamem", *args, "--format", "json",
                           "--output", str(output)], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(output.read_text())


def _without(value, names):
    """`value` with the keys in `names` dropped, at every depth, and device-sourced estimates."""
    if isinstance(value, dict):
        return {k: _without(v, names) for k, v in value.items() if k not in names}
    if isinstance(value, list):
        return [_without(v, names) for v in value
                if not (isinstance(v, dict) and v.get("source") == "device")]
    return value


def _per_process_or_skip(visible: bool, why: str) -> None:
    """The per-process checks need NVML to list this process with its memory."""
    if not visible:
        pytest.skip(f"NVML gives no per-process figure here ({why}): only the device-wide ones, "
                    "which a neighbour moves")


def _twice(run, tmp_path):
    """`run(tag)` alone, then beside the neighbour."""
    quiet = run("quiet")
    with neighbour(tmp_path / "neighbour.log"):
        noisy = run("noisy")
    return quiet, noisy


def test_profile_sweep_beside_a_neighbour(tmp_path):
    """The sweep's allocator figures, breakdowns and this process's NVML peaks are the same."""
    quiet, noisy = _twice(lambda tag: _mlamem(
        "profile", "-s", SCENARIO, "--tokens", "1024,8192", "--require-gpu",
        output=tmp_path / f"profile-{tag}.json"), tmp_path)
    assert _without(noisy, DEVICE_WIDE) == _without(quiet, DEVICE_WIDE)
    [note] = [n for n in noisy["notes"] if n.startswith("NVML: ")]
    _per_process_or_skip(all(row["nvml_process_peak_bytes"] for row in noisy["rows"]), note)


def test_graphs_run_beside_a_neighbour(tmp_path):
    """Each capture's pool, held and peak bytes, its buffers and the allocator's estimate are
    the same; the device-wide growth (mem_get_info) is the neighbour's to move."""
    quiet, noisy = _twice(lambda tag: _mlamem(
        "graphs", "-s", SCENARIO, "--capture-sizes", "512,256,8,1",
        output=tmp_path / f"graphs-{tag}.json"), tmp_path)
    assert noisy["measured"] and all(p["failure"] is None for p in noisy["paths"])
    assert _without(noisy, DEVICE_WIDE) == _without(quiet, DEVICE_WIDE)


def test_repro_oom_beside_a_neighbour(tmp_path, record_property):
    """The workspace case's verdict, KV cache, cap, headroom, step buffers, charged non-torch
    memory and largest safe max_num_batched_tokens are the same (charged from this process's own
    NVML figure), and its own NVML step peak stays reserved + the model's non-torch; its
    device-wide readings are recorded (record_property), not compared. Where NVML does not list
    the process, the fallback's figures are left out of the comparison and the rest skipped."""
    from mlamem.commands.repro import host_setup
    from mlamem.engines.base import Budget
    from mlamem.engines.vllm import VLLM
    from mlamem.kernels import FlashMLA
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import SimulatedMemory
    from mlamem.spec import scenario as scenarios

    _room_for_the_neighbour_or_skip(scenarios.load(SCENARIO).gpu.memory_mib)
    quiet, noisy = _twice(lambda tag: _mlamem(
        "repro-oom", "-s", SCENARIO, "--paths", "workspace",
        output=tmp_path / f"repro-{tag}.json"), tmp_path)
    cases = [case for result in (quiet, noisy) for case in result["cases"]]
    for tag, case in zip(("quiet", "noisy"), cases, strict=True):
        assert case["verdict"] == "fits", case.get("failure")
        record_property(f"device-wide, {tag}", {k: case.get(k) for k in sorted(
            DEVICE_WIDE_READINGS | {"other_processes_bytes", "non_torch_bytes"})})
    own = all(case["nvml_visibility"] == nvml.THIS_PROCESS for case in cases)
    moved = DEVICE_WIDE | DEVICE_WIDE_READINGS | (set() if own else FROM_DEVICE_WIDE_FALLBACK)
    assert _without(noisy, moved) == _without(quiet, moved)
    _per_process_or_skip(own, cases[-1]["nvml_visibility"])
    glm = scenarios.load(SCENARIO)
    budget = Budget(glm.gpu.memory_bytes, glm.gpu.gpu_memory_utilization,
                    glm.serving.max_num_batched_tokens)
    modelled = SimulatedMemory(non_torch=host_setup("flashmla"))
    VLLM.emulate(modelled, glm, FlashMLA(), budget, "workspace", sm_count=local_sm_count())
    for case in cases:
        assert case["non_torch_bytes"] == case["non_torch_process_bytes"]  # the charge: its own
        own_non_torch = case["nvml_process_step_peak_bytes"] - case["step_peak_bytes"]
        assert abs(own_non_torch - modelled.non_torch_bytes()) <= TOLERANCE_BYTES, (
            own_non_torch, modelled.non_torch_bytes())
