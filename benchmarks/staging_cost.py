"""Where the workspace path's extra time goes: the wrappers' q handling alone, without a kernel.

The sparse decode's workspace path measured 2 to 3% slower than the alloc path on the H200
(reports/kernels-h200). This times, at the GLM-5 TP8 shape (8 heads padded to 64, d_qk 576),
what each path does to q before the kernel (`triton.testing.do_bench` medians, ms):
- alloc: `new_zeros` for the padded q, then copy the real heads in;
- workspace: copy the real heads into the reserved buffer, then zero the padding heads;
- workspace, padding zeroed once: only the copy (the padding heads stay zero from init).

Usage (GPU): python3 benchmarks/staging_cost.py [--tokens 8192,32768]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

HEADS, PADDED, D_QK = 8, 64, 576


def wrappers(tokens: int) -> list:
    """The three ways to get q ready, as callables over one q and one reserved buffer."""
    q = torch.randn((tokens, HEADS, D_QK), dtype=torch.bfloat16, device="cuda")
    staged = torch.zeros((tokens, PADDED, D_QK), dtype=torch.bfloat16, device="cuda")

    def alloc():
        padded = q.new_zeros((tokens, PADDED, D_QK))
        padded[:, :HEADS].copy_(q)

    def workspace():
        staged[:, :HEADS].copy_(q)
        staged[:, HEADS:].zero_()

    def zeroed_once():
        staged[:, :HEADS].copy_(q)

    return [alloc, workspace, zeroed_once]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,32768")
    args = parser.parse_args()
    print(f"{'T':>6} {'alloc':>8} {'workspace':>10} {'zeroed once':>12}  (ms, wrapper only)")
    for tokens in map(int, args.tokens.split(",")):
        times = [do_bench(f, warmup=25, rep=200, return_mode="median")
                 for f in wrappers(tokens)]
        print(f"{tokens:>6} {times[0]:>8.3f} {times[1]:>10.3f} {times[2]:>12.3f}")


if __name__ == "__main__":
    main()
