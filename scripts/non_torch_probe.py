"""Where a rank's non-torch device memory (CUDA context, libraries, module loads) comes from.

Non-torch memory, read two ways (mlamem.runtime.memory.NonTorchReading): "process", this process's own
NVML figure less torch's reserved memory (what a measured repro-oom case charges, and what the
model's context_bytes and modules are); "device", NVML's used memory of the device, less what
other processes used before this one touched CUDA, less reserved (the engines' reading; the
model's process_bytes is what it holds beyond "process"). This probe prints both at each step
of an emulated engine case and around a kernel's first calls, each in a fresh process, as JSON
lines:

    python3 scripts/non_torch_probe.py            # every probe, one fresh process each
    python3 scripts/non_torch_probe.py PROBE ARG  # one probe in this process
    python3 scripts/non_torch_probe.py graph-captures KERNEL [ORDER WARMUP]
                                                  # CUDA-graph captures: every order, fresh
                                                  # processes; TOML records, then JSON
    python3 scripts/non_torch_probe.py record     # this GPU's [[setup]] record for
                                                  # non_torch.toml (step-ops of GLM-5 and
                                                  # Kimi-K2, fresh processes), then JSON

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

    from mlamem.commands.repro import scenario_engine
    from mlamem.engines.base import Budget
    from mlamem.kernels import FlashMLA
    from mlamem.runtime import nvml
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory, read_non_torch
    from mlamem.spec import scenario

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

    from mlamem.kernels import KERNELS
    from mlamem.operations.sparse_decode import run_kernel
    from mlamem.runtime import nvml
    from mlamem.runtime.inputs import make_inputs
    from mlamem.runtime.memory import CudaMemory
    from mlamem.spec import scenario

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

    from mlamem.kernels import FlashMLA
    from mlamem.operations.sparse_decode import run_kernel
    from mlamem.runtime import nvml
    from mlamem.spec import scenario

    used_before_cuda = nvml.used_by_uuid()
    chosen = scenario.load(scenario_name)
    from mlamem.runtime.memory import CudaMemory

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

    from mlamem.runtime import nvml
    from mlamem.runtime.memory import CudaMemory

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


# graph-captures: the pools one process captures, in order, each (path, sizes); GLM-5's 51
# FULL decode sizes are LIST, its largest first
GRAPH_ORDERS = {
    "repeat": lambda sizes: [("alloc", [sizes[0]] * 12)],  # (a) one size again and again
    "descending": lambda sizes: [("alloc", sizes)],  # (b) the list, largest first
    "second-pool": lambda sizes: [("alloc", sizes), ("alloc", sizes)],  # (c) after the first freed
    # vLLM 0.33.0's: the estimate's two largest in a throwaway pool, then every size
    "vllm": lambda sizes: [("alloc", sizes[:2]), ("alloc", sizes)],
    # `mlamem graphs`': the alloc path's list, then the workspace path's, a pool each
    "graphs": lambda sizes: [("alloc", sizes), ("workspace", sizes)],
}
WARMUPS = ("eager", "none")  # (d) each capture after one eager call of it, or with none before


def _graph_captures(kernel_name: str, order: str | None = None, warmup: str | None = None) -> dict:
    """Per CUDA-graph capture of one process, in `order` (GRAPH_ORDERS) with or without an
    eager warm-up before each: the allocator's reserved growth (the pool), mem_get_info's
    growth (device-wide, what vLLM reads) and this process's NVML growth, each over the
    capture, its outputs released; also the device's reading once each pool is freed. Without
    ORDER and WARMUP, every pair, each in a fresh process (the first capture of a process is
    the one that takes memory outside the allocator). Prints TOML records for
    mlamem/non_torch.toml's notes, with the command, before the JSON line."""
    if order is None or warmup is None:
        runs = [_fresh(["graph-captures", kernel_name, o, w]) for o in GRAPH_ORDERS for w in WARMUPS]
        toml = [run.pop("toml") if "toml" in run else f"# failed: {json.dumps(run)}"
                for run in runs]
        return {"probe": "graph-captures", "kernel": kernel_name, "runs": runs,
                "toml": "\n".join(toml)}
    import torch

    from mlamem.commands.graphs import sizes_to_capture
    from mlamem.kernels import load_kernel
    from mlamem.runtime import nvml
    from mlamem.runtime.graph_capture import CallGraphs
    from mlamem.runtime.measure import local_sm_count
    from mlamem.runtime.memory import CudaMemory
    from mlamem.spec import scenario

    used_before_cuda = nvml.used_by_uuid()
    glm = scenario.load("glm5-fp8-tp8")
    kernel = load_kernel(kernel_name)()
    if reason := kernel.unavailable_reason():  # imports the kernel's library, as mlamem does
        return {"probe": "graph-captures", "kernel": kernel_name, "failed": reason}
    memory = CudaMemory(used_before_cuda=used_before_cuda)
    pools = GRAPH_ORDERS[order](sizes_to_capture(glm, None))
    calls = {path: CallGraphs.make(memory, glm, kernel, path, max(sizes),
                                   sm_count=local_sm_count()) for path, sizes in pools}

    def reading() -> tuple[int, int, int | None]:
        memory.empty_cache()
        return (torch.cuda.memory_reserved(), memory.device_used_bytes(),
                memory.process_used_bytes())

    records, captures = [], 0
    for index, (path, sizes) in enumerate(pools):
        pool, graphs = torch.cuda.graph_pool_handle(), []
        for tokens in sizes:
            step, _ = calls[path].step_and_expected(memory, tokens)
            if warmup == "eager":
                step()  # its out and lse, dropped at once
            before = reading()
            graphs.append(torch.cuda.CUDAGraph())
            try:
                with torch.cuda.graph(graphs[-1], pool=pool):
                    outputs = step()
            except RuntimeError as exc:  # the records so far, and where it stopped
                records.append({"pool": index, "path": path, "tokens": tokens,
                                "failure": str(exc).splitlines()[0][:200]})
                return _graph_result(kernel_name, kernel, order, warmup, records)
            del outputs  # weak references only, as vLLM keeps a graph's outputs
            captures += 1
            records.append({"pool": index, "path": path, "tokens": tokens,
                            "live_graphs": len(graphs), "captures_in_process": captures,
                            **_growth(before, reading())})
        before = reading()
        graphs.clear()  # the pool's graphs destroyed, then the pool released
        del pool
        records.append({"pool": index, "path": path, "freed": True, **_growth(before, reading())})
    return _graph_result(kernel_name, kernel, order, warmup, records)


def _graph_result(kernel_name: str, kernel, order: str, warmup: str, records: list[dict]) -> dict:
    """graph-captures' JSON, with its records as TOML (`[[graph_capture]]` tables) under the
    command and the setup that measured them."""
    import datetime

    import torch

    command = f"python3 scripts/non_torch_probe.py graph-captures {kernel_name} {order} {warmup}"
    head = [f"# {command}", f"# on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"{kernel_name} {kernel.version()}, {datetime.date.today().isoformat()}"]
    toml = [*head, *(line for r in records for line in (
        "[[graph_capture]]", f'kernel = "{kernel_name}"', f'order = "{order}"',
        f'warmup = "{warmup}"', *(f"{k} = {_toml_value(v)}" for k, v in r.items()), ""))]
    return {"probe": "graph-captures", "kernel": kernel_name, "order": order, "warmup": warmup,
            "command": command, "records": records, "toml": "\n".join(toml)}


def _growth(before: tuple, after: tuple) -> dict:
    """Reserved, mem_get_info and per-process NVML growth between two readings (the last
    None where NVML does not list this process)."""
    names = ("pool_growth_bytes", "device_growth_bytes", "process_growth_bytes")
    return {name: None if a is None or b is None else b - a
            for name, a, b in zip(names, before, after, strict=True)}


def _toml_value(value) -> str:
    if value is None:
        return '"n/a"'  # TOML has no null
    return str(value).lower() if isinstance(value, bool) else json.dumps(value)


def _fresh(probe: list[str]) -> dict:
    """One probe in a fresh process: its JSON line, or what failed."""
    done = subprocess.run([sys.executable, __file__, *probe], capture_output=True, text=True,
                          timeout=300)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"probe": probe, "failed": done.stderr[-800:]}


def _record(kernel_name: str = "flashmla") -> dict:
    """This GPU's `[[setup]]` record for mlamem/non_torch.toml, from step-ops of GLM-5 (8 heads,
    padded: a fill first) and Kimi-K2 (64 heads: the decode first), each a fresh process: the
    context (after importing the kernel library, as a repro-oom case has it), the driver's bytes
    beyond this process, and the modules each first launch loads. What step-ops does not read
    (the CUDA-graph modules, unallocatable_bytes) is carried from this GPU's record, else the
    nearest one, and says so."""
    import dataclasses
    import datetime

    import torch

    from mlamem.kernels import load_kernel
    from mlamem.runtime.non_torch import find_setup

    runs = {name: dict(_fresh(["step-ops", name])["log"]) for name in
            ("glm5-fp8-tp8", "kimi-k2-fp8-tp4-dp")}
    context = runs["glm5-fp8-tp8"]["context + import flash_mla"]
    own = "process" if context["process"] is not None else "device"  # NVML lists it, or not
    grew = {name: {op: run[op][own] - run[previous][own]
                   for previous, op in zip(list(run), list(run)[1:], strict=False)}
            for name, run in runs.items()}
    shared = grew["kimi-k2-fp8-tp4-dp"]["flash_mla decode"]  # the decode before any fill
    fill = grew["glm5-fp8-tp8"]["aten.new_zeros"] - shared  # a fill loads both
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    carried = find_setup(kernel_name, props.name, torch.__version__, torch.version.cuda,
                         props.total_memory)
    command = f"python3 scripts/non_torch_probe.py record {kernel_name}"
    lines = [f"# {command}, {datetime.date.today().isoformat()}; carried from "
             f"{carried.gpu}'s record: unallocatable_bytes and the CUDA-graph modules",
             "[[setup]]", f'gpu = "{props.name}"', f"gpu_memory_bytes = {props.total_memory}",
             f'torch = "{torch.__version__}"', f'cuda = "{torch.version.cuda}"',
             f'kernel = "{kernel_name}"',
             f'kernel_version = "{load_kernel(kernel_name)().version()}"',
             f"process_bytes = {context['device'] - context[own]}",
             f"context_bytes = {context[own]}  # {own} reading",
             f"unallocatable_bytes = {carried.unallocatable_bytes}  # carried: not read here",
             f'command = "{command}"',
             f'measured_on = "{datetime.date.today().isoformat()}"']
    modules = [("random (randint)", grew["glm5-fp8-tp8"]["aten.randint"], ["aten.randint"]),
               ("loaded by a fill or FlashMLA's decode, whichever is first", shared,
                ["aten.new_zeros", "aten.zero_", "aten.fill_", f"{kernel_name}.decode"]),
               ("fill", fill, ["aten.new_zeros", "aten.zero_", "aten.fill_"]),
               *((m.name, m.bytes, list(m.loaded_by)) for m in carried.modules
                 if any(launch.startswith("torch.cuda.graph") for launch in m.loaded_by))]
    for name, size, loaded_by in modules:
        lines += ["", "[[setup.modules]]", f'name = "{name}"', f"bytes = {size}",
                  f"loaded_by = {json.dumps(loaded_by)}"]
    return {"probe": "record", "kernel": kernel_name, "fill_check_bytes":
            grew["kimi-k2-fp8-tp4-dp"].get("aten.fill_"), "carried_from":
            dataclasses.asdict(carried)["gpu"], "toml": "\n".join(lines)}


PROBES = {"record": _record, "engine": _engine_case, "first-calls": _first_calls, "step-ops": _step_ops,
          "physical": _physical, "graph-captures": _graph_captures}
ALL = [("step-ops", "glm5-fp8-tp8"), ("step-ops", "kimi-k2-fp8-tp4-dp"),
       ("first-calls", "flashmla", "1024"), ("first-calls", "flashmla", "32768"),
       ("first-calls", "triton", "1024"), ("first-calls", "reference", "256"),
       ("engine", "glm5-fp8-tp8", "alloc"), ("engine", "glm5-fp8-tp8", "workspace"),
       ("engine", "deepseek-v32-fp8-tp8", "alloc"), ("engine", "deepseek-v32-fp8-tp8", "workspace"),
       ("engine", "kimi-k2-fp8-tp4-dp", "workspace"), ("engine", "kimi-k2-context-reuse", "full"),
       ("engine", "kimi-k2-context-reuse", "none")]


def main(argv: list[str]) -> int:
    if argv:
        result = PROBES[argv[0]](*argv[1:])
        if "toml" in result and argv[2:]:  # one graph-captures run: its records, then JSON
            print(result["toml"])
        elif "toml" in result:  # every run: the records only, the runs' JSON already has them
            print(result.pop("toml"))
        print(json.dumps(result))
        return 0
    for probe in ALL:
        print(json.dumps(_fresh(list(probe))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
