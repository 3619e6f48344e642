"""What mlamem's one measure function (`measure.measure_one`) adds to a call, on a GPU.

Run on a GPU with flash_mla:  python3 benchmarks/overhead.py [--tokens 8192,32768] [--json PATH]

One call: the alloc path of FlashMLA's sparse decode at GLM-5 TP8 shapes. Every "wall" figure is
host wall time from just before the call to just after a `torch.cuda.synchronize()`, in ms, the
median of --repeats rounds; each round runs every variant once, in a shuffled order, so drift in
the GPU's clocks or in cudaMalloc's time falls on all variants alike:
- warm: the allocator's cache already holds the call's blocks (no cudaMalloc);
- cold: after `empty_cache`, so the call pays cudaMalloc for its segments, as a measured call
  does (the protocol measures with a cold cache, for the reserved figure);
- measured: `measure_one` after `empty_cache`; its `wall_time_ms`, which times the call and one
  synchronize under the allocator trace and the NVML sampler;
- trace, sampler: cold, under the allocator trace alone (trace_1k: a 1,000-entry ring), or the
  NVML sampler alone (sampler_2ms: polling every 2 ms, not 0.5 ms): where the cost lies.
mlamem's part is measured - cold (both pay the same cudaMalloc); its share is that over warm.
"host" is the measure function's own time around the call (the trace on and off, the snapshot,
the NVML reads, the attribution): it adds to a sweep's time, not to the call's figure.
The allocations a call makes after `empty_cache` are timed apart: each buffer, named, as
`torch.empty` of its bytes after `empty_cache`, in the call's order.
"""

import argparse
import contextlib
import json
import random
import statistics
import time
from pathlib import Path

import torch

from mlamem.kernels import FlashMLA
from mlamem.kernels.base import SPARSE_DECODE
from mlamem.runtime import nvml
from mlamem.runtime.measure import local_sm_count, measure_one, plan_call
from mlamem.runtime.memory import CudaMemory
from mlamem.spec import scenario


def timed(memory, call, cold: bool, around=contextlib.nullcontext) -> float:
    """Host wall ms of one `call()` and a synchronize; `cold`: after empty_cache; `around`: a
    context manager entered around the call, outside the timing."""
    if cold:
        memory.empty_cache()
    memory.synchronize()
    with around():
        start = time.perf_counter()
        value = call()
        memory.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
    del value
    return elapsed


@contextlib.contextmanager
def trace_only(memory, max_entries: int = 100_000):
    """The allocator trace measure_one records (CudaMemory.watch), without the NVML sampler."""
    torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=max_entries,
                                             device=memory.device, clear_history=True)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=memory.device)


def measured_once(memory, step, expected) -> tuple[float, float]:
    """measure_one after empty_cache: its wall_time_ms, and its own host time around the call
    (its whole time less wall_time_ms)."""
    memory.empty_cache()
    start = time.perf_counter()
    record = measure_one(memory, step, expected)
    total_ms = (time.perf_counter() - start) * 1e3
    if record.failure is not None:
        raise SystemExit(f"the measured call failed: {record.failure.text}")
    return record.wall_time_ms, total_ms - record.wall_time_ms


def interleaved(variants: dict, repeats: int, seed: int = 0) -> dict[str, float]:
    """The median of each variant's ms over `repeats` rounds, every round running each
    variant once in a shuffled order, so drift in the GPU's clocks or the driver's cudaMalloc
    falls on all of them alike."""
    order, times = list(variants), {name: [] for name in variants}
    shuffle = random.Random(seed).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            times[name].append(variants[name]())
    return {name: statistics.median(t) for name, t in times.items()}


def allocations(memory, expected, repeats: int) -> list[dict]:
    """Each buffer the call allocates, as torch.empty of its bytes after empty_cache, in the
    call's order (the earlier ones held, as in the call): median ms, with the synchronize."""
    times: list[list[float]] = [[] for _ in expected]
    for _ in range(repeats):
        memory.empty_cache()
        held = []
        for index, buffer in enumerate(expected):
            memory.synchronize()
            start = time.perf_counter()
            held.append(torch.empty(buffer.nbytes, dtype=torch.uint8, device=memory.device))
            memory.synchronize()
            times[index].append((time.perf_counter() - start) * 1e3)
        del held
    return [{"buffer": b.name, "allocated_by": b.allocated_by, "bytes": b.nbytes,
             "ms": statistics.median(t)} for b, t in zip(expected, times, strict=True)]


def row(memory, glm, kernel, tokens: int, repeats: int) -> dict:
    sm_count = local_sm_count()
    planned = plan_call(glm, kernel, SPARSE_DECODE, tokens, "alloc", sm_count=sm_count)
    step = planned.prepare(memory, max_tokens=tokens)
    expected = planned.expected
    import triton.testing

    step()  # loads the kernel's modules
    hosts = []

    def measured() -> float:
        wall, host = measured_once(memory, step, expected)
        hosts.append(host)
        return wall

    handle = memory.nvml_handle
    medians = interleaved({
        "warm": lambda: timed(memory, step, cold=False),
        "cold": lambda: timed(memory, step, cold=True),
        "trace": lambda: timed(memory, step, True, lambda: trace_only(memory)),
        "trace_1k": lambda: timed(memory, step, True, lambda: trace_only(memory, 1000)),
        "sampler": lambda: timed(memory, step, True, lambda: nvml.PeakSampler(handle)),
        "sampler_2ms": lambda: timed(memory, step, True, lambda: nvml.PeakSampler(handle, 0.002)),
        "measured": measured,
    }, repeats)
    result = {"tokens": tokens, "warm_do_bench_ms": triton.testing.do_bench(
        step, warmup=25, rep=200, return_mode="median")}
    result.update({f"{name}_wall_ms": ms for name, ms in medians.items()})
    result["host_ms"] = statistics.median(hosts)
    result["allocations"] = allocations(memory, expected, repeats)
    result["allocations_ms"] = sum(a["ms"] for a in result["allocations"])
    result["mlamem_ms"] = result["measured_wall_ms"] - result["cold_wall_ms"]
    result["mlamem_share"] = result["mlamem_ms"] / result["warm_wall_ms"]
    step = None  # the inputs go before the next row
    memory.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,32768")
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    glm, kernel, memory = scenario.load("glm5-fp8-tp8"), FlashMLA(), CudaMemory()
    rows = [row(memory, glm, kernel, int(t), args.repeats) for t in args.tokens.split(",")]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        print(f"T={r['tokens']}: the call's allocations after empty_cache (torch.empty each, "
              "synchronized, median ms)")
        for a in r["allocations"]:
            print(f"  {a['buffer']:<24} {a['allocated_by']:<8} {a['bytes']:>14} B "
                  f"{a['ms']:>8.3f} ms")
    print("\nhost wall ms, median (call + synchronize); mlamem = measured - cold; "
          "share = mlamem / warm")
    header = ("T", "do_bench", "warm", "cold", "allocs", "trace", "trace_1k", "sampler",
              "sampler_2ms", "measured", "mlamem", "share", "host")
    print(" ".join(f"{h:>9}" for h in header))
    for r in rows:
        cells = (r["warm_do_bench_ms"], r["warm_wall_ms"], r["cold_wall_ms"], r["allocations_ms"],
                 r["trace_wall_ms"], r["trace_1k_wall_ms"], r["sampler_wall_ms"],
                 r["sampler_2ms_wall_ms"], r["measured_wall_ms"], r["mlamem_ms"])
        print(f"{r['tokens']:>9} " + " ".join(f"{c:>9.3f}" for c in cells)
              + f" {r['mlamem_share']:>8.1%} {r['host_ms']:>9.3f}")


if __name__ == "__main__":
    main()
