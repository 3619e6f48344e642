"""mlamem's own sparse decodes (the Gluon warp-specialized kernel and the Triton designs) against
FlashMLA, side by side in one run.

Run on a GPU with flash_mla and triton:
    python3 benchmarks/triton_vs_flashmla.py [--tokens 8192,32768] [--rank-tokens 1024,8192,32768]
        [--pools l2,hbm] [--sweep] [--lse] [--json FILE]

Part 1, 64 heads (FlashMLA's own shape): h_q = 64, topk = 2048, s_q in --tokens, every index
valid, from each KV pool of --pools:
  l2   4 x topk tokens (5.4 MB): the gathers hit the H200's 60 MB L2;
  hbm  4 GiB of cache (6.5 M tokens): the gathers come from HBM.
FlashMLA, then mlamem's kernel in the default config (the Gluon kernel, gluon-bf16-scale), the
Gluon kernel's first design (gluon, the default before), the Triton fallback and (--sweep) other
launch configs of the Triton designs (a config that would fall back on this GPU is named, not
timed); TFLOP/s = 2 * s_q * h_q * topk * (576 + 512) / time, and the ratio to FlashMLA's.
"gathered" is the KV bytes the attention programs read, s_q * (h_q / 64) * topk * 656, over
the time.

Part 2, the heads of one tensor-parallel rank: GLM-5 TP8 (8 heads) and DeepSeek-V3.2 TP8 (16),
topk 2048, T in --rank-tokens, from the hbm pool. FlashMLA's padded call, as an engine runs it
(q.new_zeros to 64 heads, the copy, the call: the pad is timed), against mlamem's native-head
call at the rank's heads (`--kernel triton-native`); time per call and speedup = FlashMLA's
time / native's (above 1: native is faster).

Every row records what the call allocates: the allocator's peak during one call in allocating
mode, above what was allocated before it. Times are `triton.testing.do_bench` medians. --sweep
also times other launch configs (the table each fallback was chosen from); --lse compares both
kernels' lse with the fp32 reference.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import tempfile

import torch

HEADS, TOPK, BLOCK_SIZE = 64, 2048, 64
RANK_HEADS = {"glm5-fp8-tp8": 8, "deepseek-v32-fp8-tp8": 16}  # per rank at TP8
HBM_POOL_BYTES = 4 * 1024**3
BYTES_PER_TOKEN = 656  # kernels/fp8_ds_mla.py
POOLS = {"l2": 4 * TOPK,  # tokens
         "hbm": -(-HBM_POOL_BYTES // BYTES_PER_TOKEN // BLOCK_SIZE) * BLOCK_SIZE}
SM_SCALE = 1 / math.sqrt(576)
LSE_SHAPES = [(4096, 128, 128), (1024, 64, 2048)]  # (s_q, h_q, topk) of the --lse check
SCHEMA = "mlamem.bench/2"
# --sweep: the Triton launch configs timed beside the default and the Triton fallback
# (LaunchConfig's fields: block_n, num_warps, num_stages, design, max_registers).
SWEEP_64 = [(64, 8, 1), (64, 8, 2), (64, 8, 1, "folded-f16")]
SWEEP_RANK = [(64, 8, 2), (64, 8, 1), (64, 8, 1, "folded-f16"), (64, 8, 2, "folded-f16"),
              (32, 4, 1, "folded-f16", 168)]
# timed beside the default at every T: the Gluon kernel's first design, the default before
COMPARED = [(64, 8, 1, "gluon")]


def attention_flops(tokens: int, heads: int, topk: int = TOPK) -> int:
    return 2 * tokens * heads * topk * (576 + 512)


def timing_row(kernel: str, tokens: int, heads: int, pool: str, ms: float, allocated_bytes: int,
               rel_l2_vs_flashmla: float | None = None) -> dict:
    """One timed call as the JSON records it (schema mlamem.bench/2, README)."""
    row = {"kernel": kernel, "tokens": tokens, "heads": heads, "pool": pool,
           "pool_tokens": POOLS[pool], "ms": ms,
           "tflops": attention_flops(tokens, heads) / ms / 1e9,
           "gathered_tb_per_s": tokens * max(heads // 64, 1) * TOPK * BYTES_PER_TOKEN / ms / 1e9,
           "allocated_bytes": allocated_bytes}
    if rel_l2_vs_flashmla is not None:
        row["rel_l2_vs_flashmla"] = rel_l2_vs_flashmla
    return row


def with_ratio(rows: list[dict]) -> list[dict]:
    """Part 1's rows of one s_q and pool, FlashMLA's first: each gets its TFLOP/s over FlashMLA's."""
    return [row | {"ratio_vs_flashmla": row["tflops"] / rows[0]["tflops"]} for row in rows]


def with_speedup(scenario: str, rows: list[dict]) -> list[dict]:
    """Part 2's rows of one scenario and T, FlashMLA's padded call first: each gets the
    scenario and FlashMLA's time over its own."""
    return [{"scenario": scenario, **row, "speedup_vs_flashmla_padded": rows[0]["ms"] / row["ms"]}
            for row in rows]


def document(environment: dict, rows: list[dict], rank_rows: list[dict],
             lse_rows: list[dict]) -> dict:
    """The JSON document --json writes: part 1's rows (with ratio_vs_flashmla), part 2's
    rank_rows (FlashMLA's padded call and the native call per scenario and T), lse."""
    return {"schema": SCHEMA, "topk": TOPK, "environment": environment, "rows": rows,
            "rank_rows": rank_rows, "lse": lse_rows}


def make_pool(tokens: int, seed: int = 0) -> torch.Tensor:
    """(tokens / 64, 64, 1, 656) fp8_ds_mla cache of standard normal latents, quantized on the
    GPU a million tokens at a time."""
    from mlamem.kernels.fp8_ds_mla import quantize

    kv = torch.empty((tokens, BYTES_PER_TOKEN), dtype=torch.uint8, device="cuda")
    gen = torch.Generator("cuda").manual_seed(seed)
    for start in range(0, tokens, 1 << 20):
        count = min(1 << 20, tokens - start)
        kv[start:start + count] = quantize(torch.randn(count, 576, device="cuda", generator=gen))
    return kv.view(tokens // BLOCK_SIZE, BLOCK_SIZE, 1, BYTES_PER_TOKEN)


def make_query(tokens: int, heads: int, pool_tokens: int, topk: int = TOPK, seed: int = 0):
    """q (1, tokens, heads, 576) bf16 and indices (1, tokens, topk) int32, all valid."""
    gen = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn((1, tokens, heads, 576), device="cuda", generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, pool_tokens, (1, tokens, topk), dtype=torch.int32, device="cuda",
                            generator=gen)
    return q, indices


def allocated_in(step) -> tuple[object, int]:
    """step()'s result and the allocator's peak during it, above what was allocated before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def relative_l2(out, reference) -> float:
    return ((out.float() - reference.float()).norm() / reference.float().norm()).item()


def median_ms(step) -> float:
    import triton.testing

    return triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")


def flashmla_padded(q, kv, indices):
    """What an engine runs below 64 heads: q zero-padded to 64 heads, then FlashMLA's call;
    returns the rank's heads of out and lse."""
    from mlamem.kernels import FlashMLA
    from mlamem.operations.sparse_decode import run_kernel

    heads = q.shape[2]
    padded = q.new_zeros((*q.shape[:2], HEADS, q.shape[3]))
    padded[:, :, :heads] = q
    out, lse = run_kernel(FlashMLA(), padded, kv, indices, sm_scale=SM_SCALE, d_v=512)
    return out[:, :, :heads], lse[:, :heads]


def config_label(name: str, config, default) -> str:
    return f"{name} {config.label}" + (" (default)" if config == default else "")


def configs_for(heads: int, sweep: bool) -> list:
    """The default config, COMPARED, the Triton fallback at `heads`, then (with --sweep) the
    others of SWEEP_64 or SWEEP_RANK."""
    from mlamem.kernels.own.triton_sparse_decode import DEFAULT_CONFIG, LaunchConfig, fallback_config

    others = [LaunchConfig(*fields) for fields in (SWEEP_64 if heads >= HEADS else SWEEP_RANK)]
    configs = [DEFAULT_CONFIG, *(LaunchConfig(*fields) for fields in COMPARED),
               fallback_config(heads), *(others if sweep else [])]
    return list(dict.fromkeys(configs))


def runs_as(config, heads: int, tokens: int, sm_count: int):
    """config, or None (with the reason printed) where the call would fall back to another."""
    from mlamem.kernels.own.triton_decode import split_plan
    from mlamem.kernels.own.triton_sparse_decode import runnable_config

    splits = split_plan(1, tokens, heads, TOPK, sm_count, config.block_n).split
    runs, reason = runnable_config(config, heads, torch.device("cuda"), splits)
    if reason is not None:
        print(f"  {config.label}: not timed, it would run {runs.label}: {reason}")
        return None
    return config


def bench_64_heads(tokens: int, pool: str, kv, sweep: bool, sm_count: int) -> list[dict]:
    """Part 1 at one s_q and pool: FlashMLA, then the Triton kernel in each config."""
    from mlamem.kernels import FlashMLA
    from mlamem.kernels.own.triton_decode import sparse_mla_decode_triton, split_plan
    from mlamem.kernels.own.triton_sparse_decode import DEFAULT_CONFIG
    from mlamem.operations.sparse_decode import run_kernel

    q, indices = make_query(tokens, HEADS, POOLS[pool])
    print(f"\n64 heads, s_q={tokens}, pool {pool} ({POOLS[pool]} tokens): triton plan "
          f"{split_plan(1, tokens, HEADS, TOPK, sm_count)}")
    flashmla = functools.partial(run_kernel, FlashMLA(), q, kv, indices, sm_scale=SM_SCALE,
                                 d_v=512)
    (reference, _), allocated = allocated_in(flashmla)
    rows = [timing_row("FlashMLA", tokens, HEADS, pool, median_ms(flashmla), allocated)]
    for config in configs_for(HEADS, sweep):
        if runs_as(config, HEADS, tokens, sm_count) is None:
            continue
        label = config_label("mlamem", config, DEFAULT_CONFIG)
        step = functools.partial(sparse_mla_decode_triton, q, kv, indices, sm_scale=SM_SCALE,
                                 config=config)
        try:
            (out, _), allocated = allocated_in(step)
            rows.append(timing_row(label, tokens, HEADS, pool, median_ms(step), allocated,
                                   relative_l2(out, reference)))
        except Exception as exc:  # a config that does not compile (e.g. out of shared memory)
            print(f"  {label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    rows = with_ratio(rows)
    for row in rows:
        error = row.get("rel_l2_vs_flashmla")
        print(f"  {row['kernel']:<76} {row['ms']:9.3f} ms {row['tflops']:7.1f} TFLOP/s "
              f"{row['gathered_tb_per_s']:6.2f} TB/s gathered  x{row['ratio_vs_flashmla']:.3f} "
              f"{row['allocated_bytes'] / 2**20:10.1f} MiB allocated"
              + (f"  rel L2 {error:.2e}" if error is not None else ""))
    return rows


def bench_rank(scenario: str, tokens: int, kv, sweep: bool, sm_count: int) -> list[dict]:
    """Part 2 at one scenario and T: FlashMLA's padded call, then the native-head Triton call in
    each config; speedup = FlashMLA's time / this call's."""
    from mlamem.kernels.own.triton_decode import sparse_mla_decode_triton
    from mlamem.kernels.own.triton_sparse_decode import DEFAULT_CONFIG

    heads = RANK_HEADS[scenario]
    q, indices = make_query(tokens, heads, POOLS["hbm"])
    padded = functools.partial(flashmla_padded, q, kv, indices)
    (reference, _), allocated = allocated_in(padded)
    rows = [timing_row("FlashMLA, q padded to 64 heads (pad timed)", tokens, heads, "hbm",
                       median_ms(padded), allocated)]
    for config in configs_for(heads, sweep):
        if runs_as(config, heads, tokens, sm_count) is None:
            continue
        label = config_label("mlamem native heads", config, DEFAULT_CONFIG)
        step = functools.partial(sparse_mla_decode_triton, q, kv, indices, sm_scale=SM_SCALE,
                                 config=config, native=True)
        try:
            (out, _), allocated = allocated_in(step)
            rows.append(timing_row(label, tokens, heads, "hbm", median_ms(step), allocated,
                                   relative_l2(out, reference)))
        except Exception as exc:
            print(f"  {label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    print(f"\n{scenario}: {heads} heads per rank, T={tokens}, pool hbm")
    rows = with_speedup(scenario, rows)
    for row in rows:
        error = row.get("rel_l2_vs_flashmla")
        print(f"  {row['kernel']:<92} {row['ms']:9.3f} ms  x{row['speedup_vs_flashmla_padded']:.3f} "
              f"{row['allocated_bytes'] / 2**20:10.1f} MiB allocated"
              + (f"  rel L2 {error:.2e}" if error is not None else ""))
    return rows


def lse_errors() -> list[dict]:
    """Largest |lse - the fp32 reference's| of each kernel, and between the two, at two shapes."""
    from mlamem.kernels import FlashMLA, TritonDecode
    from mlamem.kernels.reference import sparse_mla_decode_reference
    from mlamem.operations.sparse_decode import run_kernel
    from mlamem.testing import random_decode_inputs

    decodes = {"flashmla": functools.partial(run_kernel, FlashMLA()),
               "triton": functools.partial(run_kernel, TritonDecode()),
               "reference": sparse_mla_decode_reference}
    rows = []
    for tokens, heads, topk in LSE_SHAPES:
        q, kv, indices = random_decode_inputs(tokens, heads, topk, seed=0, invalid_fraction=0,
                                              device="cuda")
        lse = {name: decode(q, kv, indices, sm_scale=SM_SCALE, d_v=512)[1].float()
               for name, decode in decodes.items()}
        rows.append({"tokens": tokens, "heads": heads, "topk": topk}
                    | {f"{a}_vs_{b}": (lse[a] - lse[b]).abs().max().item()
                       for a, b in (("flashmla", "reference"), ("triton", "reference"),
                                    ("triton", "flashmla"))})
        print(f"  lse at s_q={tokens} h_q={heads} topk={topk}: max |FlashMLA - fp32 reference| "
              f"{rows[-1]['flashmla_vs_reference']:.2e}, |mlamem - reference| "
              f"{rows[-1]['triton_vs_reference']:.2e}, |mlamem - FlashMLA| "
              f"{rows[-1]['triton_vs_flashmla']:.2e}")
    return rows


def write_json(path: str, doc: dict) -> None:
    """Atomically: a run cut short leaves no half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".part", delete=False) as file:
        json.dump(doc, file, indent=2)
    os.replace(file.name, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,32768", help="part 1's s_q values")
    parser.add_argument("--rank-tokens", default="1024,8192,32768", help="part 2's T values")
    parser.add_argument("--pools", default="l2,hbm", help="part 1's KV pools: l2, hbm or both")
    parser.add_argument("--sweep", action="store_true",
                        help="also time the other designs and launch configs (SWEEP_64, SWEEP_RANK)")
    parser.add_argument("--lse", action="store_true",
                        help="also compare both kernels' lse with the fp32 reference's")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    pools = args.pools.split(",")
    if not set(pools) <= set(POOLS):
        parser.error(f"--pools: expected l2, hbm or l2,hbm, got {args.pools}")

    from mlamem.kernels import FlashMLA, TritonDecode
    from mlamem.kernels.own.triton_decode import triton_version

    for kernel in (FlashMLA(), TritonDecode()):
        if (reason := kernel.unavailable_reason()) is not None:
            parser.exit(2, f"triton_vs_flashmla.py: {kernel.label} is unavailable: {reason}\n")
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    environment = {"gpu": torch.cuda.get_device_name(), "sm_count": sm_count,
                   "torch": torch.__version__, "triton": triton_version(),
                   "flash_mla": FlashMLA().version()}
    print(", ".join(f"{k} {v}" for k, v in environment.items()) + f"; topk={TOPK}")
    kv = {pool: make_pool(POOLS[pool]) for pool in {*pools, "hbm"}}
    rows = [row for pool in pools for tokens in map(int, args.tokens.split(","))
            for row in bench_64_heads(tokens, pool, kv[pool], args.sweep, sm_count)]
    rank_rows = [row for scenario in RANK_HEADS for tokens in map(int, args.rank_tokens.split(","))
                 for row in bench_rank(scenario, tokens, kv["hbm"], args.sweep, sm_count)]
    lse_rows = lse_errors() if args.lse else []
    if args.json:
        write_json(args.json, document(environment, rows, rank_rows, lse_rows))
    print("\nsummary: part 1 ratio of TFLOP/s to FlashMLA's; part 2 FlashMLA padded time / "
          "native time (default configs)")
    for row in rows + rank_rows:
        if "(default)" in row["kernel"]:
            figure = row.get("ratio_vs_flashmla", row.get("speedup_vs_flashmla_padded"))
            print(f"  {row.get('scenario', '64 heads'):<22} T={row['tokens']:<6} pool "
                  f"{row['pool']:<4} {row['ms']:8.3f} ms  x{figure:.3f}")


if __name__ == "__main__":
    main()
