"""Where a rank's non-torch device memory (CUDA context, libraries, module loads) comes from.

Non-torch memory, read two ways (mlamem.memory.NonTorchReading): "process", this process's own
NVML figure less torch's reserved memory (what a measured repro-oom case charges, and what the
model's context_bytes and modules are); "device", NVML's used memory of the device, less what
other processes used before this one touched CUDA, less reserved (the engines' reading; the
model's process_bytes is what it holds beyond "process"). This probe prints both at each step
of an emulated engine case and around a kernel's first calls, each in a fresh process, as JSON
lines:

    python3 scripts/non_torch_probe.py            # every probe, one fresh process each
    python3 scripts/non_torch_probe.py PROBE ARG  # one probe in this process

Needs a CUDA GPU (and flash_mla for the flashmla probes). Its figures feed
`mlamem/non_torch.toml`.
"""

from __future__ import annotations

import json
import subprocess
import sys


def _both(memory) -> dict:
    """The non-torch memory now, this process's own and device-wide, with NVML's visibility."""
    reading = memory.non_torch_reading()
    return {"process": reading.process_bytes, "device": reading.device_bytes,
            "visibility": reading.visibility}


def _engine_case(scenario_name: str, path: str) -> dict:
    """An emulated repro-oom case with non-torch memory read at every allocator-stats call."""
    import inspect

    from mlamem import nvml, scenario
    from mlamem.engines.base import Budget
    from mlamem.kernels import FlashMLA
    from mlamem.measure import local_sm_count
    from mlamem.memory import CudaMemory, read_non_torch
    from mlamem.repro import scenario_engine

    used_before_cuda = nvml.used_by_uuid()
    chosen = scenario.load(scenario_name)
    FlashMLA().unavailable_reason()  # imports flash_mla, as the case's process does

    class Logged(CudaMemory):
        log: list = []

        def stats(self, device: bool = True):
            s = super().stats(device)
            caller = inspect.stack()[1]
            if caller.function != "non_torch_reading":  # the reading's own stats call
                reading = read_non_torch(self.nvml_handle, self.used_by_others, s.reserved)
                self.log.append([f"{caller.function}:{caller.lineno}",
                                 {"process": reading.process_bytes,
                                  "device": reading.device_bytes}])
            return s

    memory = Logged(used_before_cuda=used_before_cuda)
    budget = Budget(chosen.gpu.memory_bytes, chosen.gpu.gpu_memory_utilization,
                    chosen.serving.max_num_batched_tokens)
    engine = scenario_engine(chosen)  # the scenario's first: context reuse names a variant
    case = engine.emulate(memory, chosen, FlashMLA(), budget, path, sm_count=local_sm_count())
    after = _both(memory)
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
    from mlamem.operations.sparse_decode import run_kernel

    used_before_cuda = nvml.used_by_uuid()
    glm = scenario.load("glm5-fp8-tp8")
    kernel = KERNELS[kernel_name]()
    log = []
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    log.append(["cuda context", _both(memory)])
    reason = kernel.unavailable_reason()
    log.append([f"unavailable_reason() = {reason}", _both(memory)])
    t = int(tokens)
    inputs = make_inputs(glm, t, torch.device("cuda"))
    torch.cuda.synchronize()
    log.append(["inputs", _both(memory)])
    q = inputs.q.new_zeros((1, t, 64, 576))
    q[..., :8, :] = inputs.q.unsqueeze(0)
    torch.cuda.synchronize()
    log.append(["padded q", _both(memory)])
    if kernel_name == "flashmla":
        import flash_mla

        flash_mla.get_mla_metadata()
        torch.cuda.synchronize()
        log.append(["get_mla_metadata", _both(memory)])
    for call in range(2):
        torch.cuda.reset_peak_memory_stats()
        reserved = torch.cuda.memory_reserved()
        with nvml.PeakSampler(memory.nvml_handle) as sampler:
            out, lse = run_kernel(kernel, q, inputs.kv_cache, inputs.indices,
                                  sm_scale=glm.softmax_scale, d_v=glm.d_v)
            torch.cuda.synchronize()
        log.append([f"decode call {call}", _both(memory),
                    {"peak_reserved_delta": torch.cuda.max_memory_reserved() - reserved,
                     "nvml_peak_minus_reserved_peak":
                         sampler.peak_bytes - memory.used_by_others
                         - torch.cuda.max_memory_reserved()}])
        del out, lse
    torch.cuda.empty_cache()
    log.append(["empty_cache", _both(memory)])
    return {"probe": "first-calls", "kernel": kernel_name, "tokens": t, "log": log}


def _step_ops(scenario_name: str) -> dict:
    """Non-torch memory after each CUDA op of an engine case, in the case's order, as the
    allocator model sees them (aten op names)."""
    import torch

    from mlamem import nvml, scenario
    from mlamem.kernels import FlashMLA
    from mlamem.operations.sparse_decode import run_kernel

    used_before_cuda = nvml.used_by_uuid()
    chosen = scenario.load(scenario_name)
    from mlamem.memory import CudaMemory

    memory = CudaMemory(used_before_cuda=used_before_cuda)
    kernel = FlashMLA()
    log = [["start", _both(memory)]]
    kernel.unavailable_reason()
    torch.empty(1, device="cuda")
    log.append(["context + import flash_mla", _both(memory)])
    t, heads, cuda = 1024, chosen.heads_per_rank, torch.device("cuda")
    gen = torch.Generator(cuda).manual_seed(0)

    def after(name, fn):
        result = fn()
        torch.cuda.synchronize()
        log.append([name, _both(memory)])
        return result

    kv = after("kv_cache .to(cuda) (H2D)",
               lambda: torch.zeros((64, 64, 1, 656), dtype=torch.uint8).to(cuda))
    idx = after("aten.randint", lambda: torch.randint(0, 4096, (1, t, 2048), dtype=torch.int32,
                                                       device=cuda, generator=gen))
    q = after("aten.empty (activations)",
              lambda: torch.empty((t, heads, 576), dtype=torch.bfloat16, device=cuda))
    after("aten.normal_", lambda: q.normal_(generator=gen))
    if heads < 64:
        qp = after("aten.new_zeros", lambda: q.new_zeros((t, 64, 576)))
        after("aten.copy_ (strided, bf16)", lambda: qp[:, :heads].copy_(q))
        after("aten.zero_ (slice)", lambda: qp[:, heads:].zero_())
    else:
        qp = q
    import flash_mla

    out, lse = after("flash_mla decode", lambda: run_kernel(kernel, qp.unsqueeze(0), kv, idx,
                                                            sm_scale=0.1, d_v=512))
    attn = torch.empty((t, heads, 512), dtype=torch.bfloat16, device=cuda)
    after("aten.copy_ (attn_output <- out heads)", lambda: attn.copy_(out[0, :, :heads]))
    after("aten.copy_ (contiguous)", lambda: attn.clone())
    after("aten.fill_", lambda: attn.fill_(1.0))
    del flash_mla
    return {"probe": "step-ops", "scenario": scenario_name, "log": log}


def _physical(step_ops: str) -> dict:
    """How much torch can reserve, against total - non-torch: the largest allocation that still
    succeeds on top of a big one, found by bisection (run with PYTORCH_NO_CUDA_MEMORY_CACHING=1
    so every allocation is a cudaMalloc)."""
    import torch

    from mlamem import nvml
    from mlamem.memory import CudaMemory

    used_before_cuda = nvml.used_by_uuid()
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    torch.empty(1, device="cuda")
    if step_ops == "yes":
        q = torch.empty((1024, 8, 576), dtype=torch.bfloat16, device="cuda").normal_()
        q.new_zeros((1024, 64, 576))[:, :8].copy_(q)
        del q
    torch.cuda.synchronize()
    non_torch = memory.non_torch_device_bytes()  # the physical device: device-wide
    total = memory.total_bytes
    free, _ = torch.cuda.mem_get_info()
    big = torch.empty(total - non_torch - memory.used_by_others - (4 << 30), dtype=torch.uint8,
                      device="cuda")
    low, high = 0, 8 << 30
    while high - low > (1 << 20):
        middle = (low + high) // 2
        try:
            extra = torch.empty(middle, dtype=torch.uint8, device="cuda")
            del extra
            low = middle
        except (torch.OutOfMemoryError, torch.AcceleratorError):  # cudaMalloc failed
            high = middle
    reachable = big.numel() + low
    return {"probe": "physical", "step_ops": step_ops, "total": total, "non_torch": non_torch,
            "used_by_others": memory.used_by_others, "mem_get_info_free": free,
            "largest_reservable": reachable,
            "total_minus_non_torch_minus_others": total - non_torch - memory.used_by_others,
            "non_torch_after": _both(memory)}


PROBES = {"engine": _engine_case, "first-calls": _first_calls, "step-ops": _step_ops,
          "physical": _physical}
ALL = [("step-ops", "glm5-fp8-tp8"), ("step-ops", "kimi-k2-fp8-tp4-dp"),
       ("first-calls", "flashmla", "1024"), ("first-calls", "flashmla", "32768"),
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
