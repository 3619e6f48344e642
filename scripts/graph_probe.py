"""Probe: how a kernel call's allocations land in a CUDA-graph private pool (issue 15).

Captures one attention call per size of a capture list, largest first, into one shared pool,
as vLLM does, and records per capture the allocator's figures, mem_get_info, the allocator
trace and whether the replay equals the eager call bit for bit. Its JSON is what the graph
model in mlamem/allocator.py was checked against.

    python3 scripts/graph_probe.py OUT.json [--kernel flashmla] [--path alloc] [--sizes 512,256,1]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from mlamem import scenario as scenarios
from mlamem.kernels import load_kernel
from mlamem.measure import local_sm_count, runner
from mlamem.memory import CudaMemory
from mlamem.operations import kv_format, problem_for
from mlamem.paths import PATHS, KernelCall, reserve_workspace


def stats() -> dict:
    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"allocated": s["allocated_bytes.all.current"], "reserved": s["reserved_bytes.all.current"],
            "peak_allocated": s["allocated_bytes.all.peak"], "peak_reserved": s["reserved_bytes.all.peak"],
            "device_used": total - free}


def probe(kernel_name: str, path: str, sizes: list[int], scenario_name: str) -> dict:
    scenario = scenarios.load(scenario_name)
    kernel = load_kernel(kernel_name)()
    memory = CudaMemory()
    op = "sparse-decode"
    capabilities = kernel.capabilities(op, kv_format(scenario, op))
    padded = capabilities.padded_heads(scenario.heads_per_rank)
    sm_count = local_sm_count()
    largest = max(sizes)
    problem = problem_for(scenario, op, largest, padded)
    q_all, inputs = kernel.make_inputs(problem, scenario.heads_per_rank, memory.device, 0)
    workspace = reserve_workspace(path, kernel, max_tokens=scenario.serving.max_num_batched_tokens,
                                  padded_heads=padded, d_qk=scenario.d_qk, d_v=scenario.d_v,
                                  topk=problem.topk, sm_count=sm_count, device=memory.device)
    pool = torch.cuda.graph_pool_handle()
    graphs, records = [], []
    for tokens in sorted(sizes, reverse=True):
        sub = problem_for(scenario, op, tokens, padded)
        sub_inputs = type(inputs)(kv=inputs.kv, indices=inputs.indices[:, :tokens]
                                  if inputs.indices.dim() == 3 and inputs.indices.shape[0] == 1
                                  else inputs.indices[:tokens])
        call = KernelCall(run=runner(kernel, memory, sm_count, sub, sub_inputs), op=op,
                          padded_heads=padded, takes_out=capabilities.takes_out)
        step = functools.partial(PATHS[path], q_all[:tokens], call, workspace)
        eager_out, eager_lse = step()
        eager_out, eager_lse = eager_out.cpu(), eager_lse.cpu()
        torch.cuda.synchronize()
        memory.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = stats()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.memory._record_memory_history(max_entries=100_000, clear_history=True)
        with torch.cuda.graph(graph, pool=pool):
            out, lse = step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        after_capture = stats()
        graph.replay()
        torch.cuda.synchronize()
        equal = bool(torch.equal(out.cpu(), eager_out) and torch.equal(lse.cpu(), eager_lse))
        del out, lse  # vLLM keeps only weak references to a capture's outputs
        after_release = stats()
        graphs.append(graph)
        events = [{k: e.get(k) for k in ("action", "addr", "size", "stream")}
                  for e in (snap["device_traces"][0] if snap["device_traces"] else [])]
        records.append({"tokens": tokens, "before": before, "after_capture": after_capture,
                        "after_release": after_release, "replay_equal": equal, "events": events,
                        "segments": [{k: s.get(k) for k in ("address", "total_size",
                                                            "allocated_size", "segment_pool_id",
                                                            "segment_type", "stream")}
                                     for s in snap["segments"]]})
        print(f"{kernel_name} {path} T={tokens}: reserved +"
              f"{after_capture['reserved'] - before['reserved']} peak_alloc +"
              f"{after_capture['peak_allocated'] - before['allocated']} held "
              f"{after_release['allocated'] - before['allocated']} device +"
              f"{after_release['device_used'] - before['device_used']} equal={equal}", flush=True)
    final = stats()
    del graphs
    memory.empty_cache()
    return {"kernel": kernel_name, "path": path, "scenario": scenario_name, "captures": records,
            "final": final, "after_graphs_deleted": stats()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--kernel", default="flashmla")
    parser.add_argument("--path", default="alloc")
    parser.add_argument("--scenario", default="glm5-fp8-tp8")
    parser.add_argument("--sizes", default="512,256,128,64,8,4,2,1")
    args = parser.parse_args()
    result = probe(args.kernel, args.path, [int(s) for s in args.sizes.split(",")], args.scenario)
    with open(args.output, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
