"""Warm-up calls of one sparse decode, then one call inside the NVTX range `decode`, for
Nsight Compute (`ncu`) to profile every kernel of that call and nothing else:

    ncu --nvtx --nvtx-include "decode/" --set full -o decode \
        python3 scripts/decode_call.py --kernel triton-native --heads 8 --tokens 8192

Inputs as in benchmarks/triton_vs_flashmla.py (topk 2048, every index valid) from its hbm pool
(4 GiB) or, with --pool l2, its small one. --kernel flashmla pads q to 64 heads as an engine
does, so the pad's kernels are in the range too.
"""

import argparse
import importlib.util
import math
from pathlib import Path

import torch

BENCH = Path(__file__).parent.parent / "benchmarks" / "triton_vs_flashmla.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["triton", "triton-native", "flashmla"],
                        default="triton-native")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--pool", choices=["l2", "hbm"], default="hbm")
    parser.add_argument("--design", help="a LaunchConfig design of mlamem's kernel (e.g. "
                        "gluon-bf16-scale; default: the default config's)")
    parser.add_argument("--warmup", type=int, default=2, help="calls before the profiled one")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "decode_call.py: needs a CUDA GPU (it profiles one call under ncu)\n")
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    from mlamem.kernels.own.triton_decode import sparse_mla_decode_triton

    config = None
    if args.design is not None:
        from mlamem.kernels.own.triton_sparse_decode import DESIGNS, LaunchConfig

        if args.design not in DESIGNS:
            parser.exit(2, f"decode_call.py: --design must be one of {', '.join(DESIGNS)}\n")
        config = LaunchConfig(block_n=64, num_warps=8, design=args.design)
    kv = bench.make_pool(bench.POOLS[args.pool])
    q, indices = bench.make_query(args.tokens, args.heads, bench.POOLS[args.pool])
    def call():
        if args.kernel == "flashmla":
            return bench.flashmla_padded(q, kv, indices)
        return sparse_mla_decode_triton(q, kv, indices, sm_scale=1 / math.sqrt(576),
                                        config=config, native=args.kernel == "triton-native")

    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("decode")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"{args.warmup} warm-up calls and one in NVTX range 'decode': {args.kernel}"
          + (f" ({args.design})" if args.design else "") + " at "
          f"{args.heads} heads, T={args.tokens}, pool {args.pool}")


if __name__ == "__main__":
    main()
