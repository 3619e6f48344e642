"""Throughput of the Triton sparse decode against FlashMLA, side by side in one run.

Run on a GPU with flash_mla and triton:
    python3 benchmarks/triton_vs_flashmla.py [--tokens 8192,32768] [--sweep] [--lse] [--json FILE]

Both kernels run on the same inputs (h_q = 64, topk = 2048, a pool of 4 x topk tokens, every
index valid) in allocating mode; times are `triton.testing.do_bench` medians. FLOPs per call
are 2 * s_q * h_q * topk * (576 + 512). "gathered" is the KV bytes the attention programs read,
s_q * (h_q / 64) * topk * 656, over the time: the rate that bounds a gather-bound kernel.
--sweep also times other launch configs of the Triton kernel (tile size, warps, pipelining
stages), the table the default config was chosen from.
"""

import argparse
import functools
import json
import math

import torch
import triton.testing

from mlamem.kernels import FlashMLA, TritonDecode
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, quantize
from mlamem.kernels.reference import sparse_mla_decode_reference
from mlamem.kernels.triton_decode import sparse_mla_decode_triton, split_plan, triton_version
from mlamem.kernels.triton_sparse_decode import DEFAULT_CONFIG, LaunchConfig

HEADS, TOPK, BLOCK_SIZE = 64, 2048, 64
SM_SCALE = 1 / math.sqrt(576)
LSE_SHAPES = [(4096, 128, 128), (1024, 64, 2048)]  # (s_q, h_q, topk) of the --lse check
SWEEP = [LaunchConfig(32, 8, 1), LaunchConfig(32, 4, 1), LaunchConfig(64, 8, 1),
         LaunchConfig(64, 8, 2), LaunchConfig(64, 8, 3), LaunchConfig(128, 4, 1),
         LaunchConfig(64, 16, 1), LaunchConfig(128, 16, 1)]


def make_inputs(tokens: int, heads: int = HEADS, topk: int = TOPK, seed: int = 0):
    """q (1, tokens, heads, 576) bf16, a 4 x topk token fp8_ds_mla cache, indices (1, tokens, topk)."""
    gen = torch.Generator().manual_seed(seed)
    pool = 4 * topk
    kv = quantize(torch.randn(pool, 576, generator=gen)).view(
        pool // BLOCK_SIZE, BLOCK_SIZE, 1, BYTES_PER_TOKEN).cuda()
    q = torch.randn((1, tokens, heads, 576), device="cuda").to(torch.bfloat16)
    indices = torch.randint(0, pool, (1, tokens, topk), dtype=torch.int32, device="cuda")
    return q, kv, indices


def lse_errors() -> list[dict]:
    """Largest |lse - the fp32 reference's| of each kernel, and between the two, at two shapes."""
    rows = []
    for tokens, heads, topk in LSE_SHAPES:
        q, kv, indices = make_inputs(tokens, heads, topk)
        lse = {name: decode(q, kv, indices, sm_scale=SM_SCALE, d_v=512)[1].float()
               for name, decode in (("flashmla", FlashMLA().decode),
                                    ("triton", TritonDecode().decode),
                                    ("reference", sparse_mla_decode_reference))}
        rows.append({"tokens": tokens, "heads": heads, "topk": topk}
                    | {f"{a}_vs_{b}": (lse[a] - lse[b]).abs().max().item()
                       for a, b in (("flashmla", "reference"), ("triton", "reference"),
                                    ("triton", "flashmla"))})
        print(f"  lse at s_q={tokens} h_q={heads} topk={topk}: max |FlashMLA - fp32 reference| "
              f"{rows[-1]['flashmla_vs_reference']:.2e}, |Triton - reference| "
              f"{rows[-1]['triton_vs_reference']:.2e}, |Triton - FlashMLA| "
              f"{rows[-1]['triton_vs_flashmla']:.2e}")
    return rows


def measure(label: str, step, tokens: int, reference_out=None) -> dict:
    """One kernel's median time, TFLOP/s and gathered TB/s; its out's error against FlashMLA's."""
    out, _ = step()
    ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
    flops = 2 * tokens * HEADS * TOPK * (576 + 512)
    gathered_bytes = tokens * (HEADS // 64) * TOPK * BYTES_PER_TOKEN
    row = {"kernel": label, "tokens": tokens, "ms": ms, "tflops": flops / ms / 1e9,
           "gathered_tb_per_s": gathered_bytes / ms / 1e9}
    if reference_out is not None:
        row["rel_l2_vs_flashmla"] = ((out.float() - reference_out.float()).norm()
                                     / reference_out.float().norm()).item()
    return row


def bench_size(tokens: int, configs: list[LaunchConfig], sm_count: int) -> list[dict]:
    """FlashMLA, then the Triton kernel in each config, at one s_q; prints a table."""
    q, kv, indices = make_inputs(tokens)
    print(f"\ns_q={tokens}: triton plan {split_plan(1, tokens, HEADS, TOPK, sm_count)}")
    flashmla = functools.partial(FlashMLA().decode, q, kv, indices, sm_scale=SM_SCALE, d_v=512)
    flashmla_out, _ = flashmla()
    results = [measure("FlashMLA", flashmla, tokens)]
    for config in configs:
        label = (f"Triton block_n={config.block_n} warps={config.num_warps} "
                 f"stages={config.num_stages}"
                 + (" (default)" if config == DEFAULT_CONFIG else ""))
        step = functools.partial(sparse_mla_decode_triton, q, kv, indices, sm_scale=SM_SCALE,
                                 config=config)
        try:
            results.append(measure(label, step, tokens, flashmla_out))
        except Exception as exc:  # a config that does not compile (e.g. out of shared memory)
            print(f"  {label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    for row in results:
        row["ratio_vs_flashmla"] = row["tflops"] / results[0]["tflops"]
        error = row.get("rel_l2_vs_flashmla")
        print(f"  {row['kernel']:<48} {row['ms']:9.3f} ms {row['tflops']:7.1f} TFLOP/s "
              f"{row['gathered_tb_per_s']:6.2f} TB/s gathered  x{row['ratio_vs_flashmla']:.3f}"
              + (f"  rel L2 {error:.2e}" if error is not None else ""))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,32768")
    parser.add_argument("--sweep", action="store_true", help="also time other launch configs")
    parser.add_argument("--lse", action="store_true",
                        help="also compare both kernels' lse with the fp32 reference's")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sm_count} SMs, torch {torch.__version__}, triton "
          f"{triton_version()}, flash_mla {FlashMLA().version()}; h_q={HEADS}, topk={TOPK}")
    configs = [DEFAULT_CONFIG, *(SWEEP if args.sweep else [])]
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        rows += bench_size(tokens, configs, sm_count)
        torch.cuda.empty_cache()
    lse_rows = lse_errors() if args.lse else []
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"schema": "mlamem.bench/1", "heads": HEADS, "topk": TOPK,
                       "sm_count": sm_count, "rows": rows, "lse": lse_rows}, file, indent=2)


if __name__ == "__main__":
    main()
