"""Where a rank's non-torch device memory (CUDA context, libraries, module loads) comes from.

Non-torch memory = NVML used memory of the device, less what other processes used before this
one touched CUDA, less torch's reserved memory. This probe prints it at each step of an emulated
engine case and around a kernel's first calls, each in a fresh process, as JSON lines:

    python3 scripts/non_torch_probe.py            # every probe, one fresh process each
    python3 scripts/non_torch_probe.py PROBE ARG  # one probe in this process

Needs a CUDA GPU (and flash_mla for the flashmla probes). Its figures feed
`mlamem/non_torch.toml`.
"""

from __future__ import annotations

import json
import subprocess
import sys


def _engine_case(scenario_name: str, path: str) -> dict:
    """An emulated repro-oom case with non-torch memory read at every allocator-stats call."""
    import inspect

    from mlamem import nvml, scenario
    from mlamem.context_reuse import emulate_context, is_context_reuse
    from mlamem.engine import Budget, emulate
    from mlamem.kernels import FlashMLA
    from mlamem.measure import local_sm_count
    from mlamem.memory import CudaMemory

    used_before_cuda = nvml.used_by_uuid()
    chosen = scenario.load(scenario_name)
    FlashMLA().unavailable_reason()  # imports flash_mla, as the case's process does

    class Logged(CudaMemory):
        log: list = []

        def stats(self):
            s = super().stats()
            caller = inspect.stack()[1]
            self.log.append([f"{caller.function}:{caller.lineno}",
                             s.device_used - self.used_by_others - s.reserved])
            return s

    memory = Logged(used_before_cuda=used_before_cuda)
    budget = Budget(chosen.gpu.memory_bytes, chosen.gpu.gpu_memory_utilization,
                    chosen.serving.max_num_batched_tokens)
    if is_context_reuse(chosen):
        case = emulate_context(memory, chosen, path, budget.gpu_memory_bytes, budget.utilization)
    else:
        case = emulate(memory, chosen, FlashMLA(), budget, path, sm_count=local_sm_count())
    after = memory.non_torch_bytes()
    result = {k: v for k, v in case.to_dict().items() if k != "buffers"}
    return {"probe": "engine", "scenario": scenario_name, "path": path, "log": Logged.log,
            "non_torch_after_case": after, "case": result}


def _first_calls(kernel_name: str, tokens: str) -> dict:
    """Non-torch memory around a kernel's first calls at the GLM-5 shape."""
    import torch

    from mlamem import nvml, scenario
    from mlamem.inputs import make_inputs
    from mlamem.kernels import KERNELS
    from mlamem.memory import CudaMemory

    used_before_cuda = nvml.used_by_uuid()
    glm = scenario.load("glm5-fp8-tp8")
    kernel = KERNELS[kernel_name]()
    log = []
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    log.append(["cuda context", memory.non_torch_bytes()])
    reason = kernel.unavailable_reason()
    log.append([f"unavailable_reason() = {reason}", memory.non_torch_bytes()])
    t = int(tokens)
    inputs = make_inputs(glm, t, torch.device("cuda"))
    torch.cuda.synchronize()
    log.append(["inputs", memory.non_torch_bytes()])
    q = inputs.q.new_zeros((1, t, 64, 576))
    q[..., :8, :] = inputs.q.unsqueeze(0)
    torch.cuda.synchronize()
    log.append(["padded q", memory.non_torch_bytes()])
    if kernel_name == "flashmla":
        import flash_mla

        flash_mla.get_mla_metadata()
        torch.cuda.synchronize()
        log.append(["get_mla_metadata", memory.non_torch_bytes()])
    for call in range(2):
        torch.cuda.reset_peak_memory_stats()
        reserved = torch.cuda.memory_reserved()
        with nvml.PeakSampler(memory.nvml_handle) as sampler:
            out, lse = kernel.decode(q, inputs.kv_cache, inputs.indices,
                                     sm_scale=glm.softmax_scale, d_v=glm.d_v)
            torch.cuda.synchronize()
        log.append([f"decode call {call}", memory.non_torch_bytes(),
                    {"peak_reserved_delta": torch.cuda.max_memory_reserved() - reserved,
                     "nvml_peak_minus_reserved_peak":
                         sampler.peak_bytes - memory.used_by_others
                         - torch.cuda.max_memory_reserved()}])
        del out, lse
    torch.cuda.empty_cache()
    log.append(["empty_cache", memory.non_torch_bytes()])
    return {"probe": "first-calls", "kernel": kernel_name, "tokens": t, "log": log}


PROBES = {"engine": _engine_case, "first-calls": _first_calls}
ALL = [("first-calls", "flashmla", "1024"), ("first-calls", "flashmla", "32768"),
       ("first-calls", "triton", "1024"), ("first-calls", "reference", "256"),
       ("engine", "glm5-fp8-tp8", "alloc"), ("engine", "glm5-fp8-tp8", "workspace"),
       ("engine", "deepseek-v32-fp8-tp8", "alloc"), ("engine", "deepseek-v32-fp8-tp8", "workspace"),
       ("engine", "kimi-k2-fp8-tp4-dp", "workspace"), ("engine", "kimi-k2-context-reuse", "full"),
       ("engine", "kimi-k2-context-reuse", "none")]


def main(argv: list[str]) -> int:
    if argv:
        print(json.dumps(PROBES[argv[0]](*argv[1:])))
        return 0
    for probe in ALL:
        done = subprocess.run([sys.executable, __file__, *probe], capture_output=True, text=True,
                              timeout=300)
        lines = done.stdout.strip().splitlines()
        print(lines[-1] if lines else json.dumps({"probe": probe, "failed": done.stderr[-800:]}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
