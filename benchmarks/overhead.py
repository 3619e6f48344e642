"""Profiler overhead: wall time of a measured call against a bare call of the same path.

Run on a GPU with flash_mla:  python3 benchmarks/overhead.py [--tokens 8192,32768]
"""

import argparse
import functools
import json
import statistics
import time

import torch
import triton.testing

from mlamem import scenario
from mlamem.inputs import make_inputs
from mlamem.kernels import FlashMLA
from mlamem.measure import measure_call
from mlamem.memory import CudaMemory
from mlamem.paths import PATHS, decode_call


def bare_call(glm, kernel, tokens):
    """Median ms of the alloc path alone: do_bench (events) and host wall time with sync."""
    inputs = make_inputs(glm, tokens, torch.device("cuda"))
    call = decode_call(decode=kernel.decode, kv_cache=inputs.kv_cache, indices=inputs.indices,
                      sm_scale=glm.softmax_scale, d_v=glm.d_v, padded_heads=64, takes_out=False)
    step = functools.partial(PATHS["alloc"], inputs.q, call, None)
    events_ms = triton.testing.do_bench(step, warmup=50, rep=500, return_mode="median")
    walls = []
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) * 1e3)
    return events_ms, statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="8192,32768")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    glm, kernel = scenario.load("glm5-fp8-tp8"), FlashMLA()
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        events_ms, bare_wall_ms = bare_call(glm, kernel, tokens)
        measured = [measure_call(CudaMemory(), glm, kernel, tokens, "alloc", sm_count=132,
                                 max_tokens=32768).wall_time_ms for _ in range(args.repeats)]
        rows.append({"tokens": tokens, "bare_do_bench_ms": events_ms,
                     "bare_wall_ms": bare_wall_ms,
                     "measured_call_wall_ms": statistics.median(measured),
                     "overhead_ms": statistics.median(measured) - bare_wall_ms})
    print(json.dumps(rows, indent=2))
    print(f"{'T':>6} {'do_bench ms':>12} {'bare wall ms':>13} {'measured ms':>12} {'overhead':>9}")
    for r in rows:
        print(f"{r['tokens']:>6} {r['bare_do_bench_ms']:>12.3f} {r['bare_wall_ms']:>13.3f} "
              f"{r['measured_call_wall_ms']:>12.3f} {r['overhead_ms']:>9.3f}")


if __name__ == "__main__":
    main()
