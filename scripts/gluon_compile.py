"""Compiles the warp-specialised Gluon decode (kernels/gluon_sparse_decode.py) ahead of time for
SM90 without a GPU and prints what ptxas and the compiler report: compile-time figures, not
measurements of speed.

Usage: python3 scripts/gluon_compile.py [--producer-regs N] [--producer-warps N] [--maxnreg N]
                                         [--dump DIR]
       python3 scripts/gluon_compile.py --check   (on an SM90 GPU: runs launch_gluon against the
                                                   Triton kernel's `launch` without a split)
       (triton 3.6 installed; TRITON_INTERPRET unset)

The kernel's arguments are those `launch_gluon` passes for a benchmark-like shape (64 heads,
topk 2048, no split) on CPU tensors; Triton's own binder turns them into the signature,
constexprs and alignment attributes a launch would compile with (the Gluon source class), and
ptxas -v reads the PTX with --gpu-name=sm_90a as Triton's compile does.
"""

import argparse
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature

from mlamem.kernels import gluon_sparse_decode as gluon_decode
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN

TARGET = GPUTarget("cuda", 90, 32)
B, S_Q, HEADS, TOPK, BLOCK_SIZE = 1, 256, 64, 2048, 64


def compile_sm90(**overrides):
    """The kernel compiled for SM90 as launch_gluon would compile it (keyword overrides replace
    launch options or constexprs, e.g. PRODUCER_REGS=88, maxnreg=160)."""
    kv = torch.zeros(4 * TOPK // BLOCK_SIZE, BLOCK_SIZE, 1, BYTES_PER_TOKEN, dtype=torch.uint8)
    q = torch.zeros(B, S_Q, HEADS, 576, dtype=torch.bfloat16)
    indices = torch.zeros(B, S_Q, TOPK, dtype=torch.int32)
    out = torch.zeros(B, S_Q, HEADS, 512, dtype=torch.bfloat16)
    lse = torch.zeros(B, HEADS, S_Q, dtype=torch.float32)
    _, args, kwargs = gluon_decode.launch_args(q, kv, indices, out, lse, sm_scale=1 / math.sqrt(576),
                                               tokens_per_split=TOPK)
    kwargs.update(overrides)
    fn = gluon_decode._gluon_sparse_decode_attention
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization,
                                                          options)
    return triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=TARGET,
                          options=options.__dict__)


def ptxas_report(ptx: str) -> str:
    """ptxas -v's report (stderr) for the PTX, with Triton's flags for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        done = subprocess.run([knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--gpu-name=sm_90a",
                               source.name, "-o", "/dev/null"], capture_output=True, text=True,
                              check=True)
    return done.stderr


def sass_spills_by_region(ptx: str) -> dict:
    """Spill instructions (STL / LDL) in the SASS, each counted under the register count of the
    last USETMAXREG above it (the partition's setmaxnreg; 'kernel' before any): ptxas -v reports
    one figure for the whole kernel."""
    tools = Path(knobs.nvidia.ptxas.path).parent
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        subprocess.run([knobs.nvidia.ptxas.path, "--gpu-name=sm_90a", f"{tmp}/k.ptx", "-o",
                        f"{tmp}/k.cubin"], check=True, capture_output=True)
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", f"{tmp}/k.cubin"], check=True,
                              capture_output=True, text=True).stdout
    region, counts = "kernel", {}
    for line in sass.splitlines():
        found = re.search(r"USETMAXREG\.\S+ (?:UP\d, )?(0x[0-9a-f]+)", line)
        if found:
            region = f"setmaxnreg {int(found.group(1), 16)}"
        elif re.search(r"\b(?:STL|LDL)\b", line):
            counts[region] = counts.get(region, 0) + 1
    return counts


def ptx_facts(ptx: str) -> dict:
    """What the PTX shows of the warp specialisation and the memory instructions."""
    return {
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
        "wgmma.mma_async": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mbarrier.try_wait": len(re.findall(r"mbarrier\.try_wait", ptx)),
        "mbarrier.arrive": len(re.findall(r"mbarrier\.arrive", ptx)),
        "bar.sync / barrier.sync": len(re.findall(r"\b(?:bar|barrier)\.sync", ptx)),
        "fence.proxy.async": len(re.findall(r"fence\.proxy\.async", ptx)),
        "ld.global.v4 (16-byte gathers)": len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)),
        "ld.global.u8/b8 (byte loads)": len(re.findall(r"ld\.global(?:\.\w+)*\.(?:u8|b8)\b", ptx)),
        "st.shared": len(re.findall(r"st\.shared", ptx)),
        "local memory (ld/st.local)": len(re.findall(r"(?:ld|st)\.local", ptx)),
    }


def check_on_gpu() -> int:
    """Runs launch_gluon and the Triton kernel (no split) on random fp8_ds_mla data, with invalid
    indices, a query with no valid index and a topk that is not a multiple of BLOCK_N; prints
    the largest differences. Needs an SM90 GPU."""
    from mlamem.kernels import triton_sparse_decode as triton_decode
    from mlamem.kernels.fp8_ds_mla import quantize

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    worst = float("-inf")
    for b, s_q, heads, topk, block_size in ((2, 3, 64, 2048, 64), (1, 2, 128, 100, 64),
                                            (3, 1, 64, 64, 32), (1, 1, 64, 0, 64)):
        pool = 4096
        cache = quantize(torch.randn(pool, 576, generator=gen) * 2).view(
            pool // block_size, block_size, 1, BYTES_PER_TOKEN).to(device)
        q = torch.randn(b, s_q, heads, 576, generator=gen).to(torch.bfloat16).to(device)
        indices = torch.randint(0, pool, (b, s_q, topk), generator=gen, dtype=torch.int32)
        indices[torch.rand(b, s_q, topk, generator=gen) < 0.2] = -1
        indices[0, -1] = -1  # one query with no valid index: out 0, lse -inf
        indices = indices.to(device)
        sm_scale = 1 / math.sqrt(576)
        tokens_per_split = max(math.ceil(topk / 128), 1) * 128
        out, ref_out = (torch.full((b, s_q, heads, 512), float("nan"), dtype=torch.bfloat16,
                                   device=device) for _ in range(2))
        lse, ref_lse = (torch.full((b, heads, s_q), float("nan"), device=device) for _ in range(2))
        gluon_decode.launch_gluon(q, cache, indices, out, lse, sm_scale=sm_scale,
                                  tokens_per_split=tokens_per_split)
        triton_decode.launch(q, cache, indices, ref_out, ref_lse, None, None, sm_scale=sm_scale,
                             num_splits=1, tokens_per_split=tokens_per_split)
        torch.cuda.synchronize()
        # out: bf16 roundings may differ where the two kernels' tiles (64 / 128 tokens) rescale
        # the accumulator at different steps; allowed |diff| <= 1e-2 + 1e-2 * |ref|.
        diff = (out.float() - ref_out.float()).abs().nan_to_num(float("inf"))
        out_diff = diff.max().item()
        out_excess = (diff - 1e-2 - 1e-2 * ref_out.float().abs()).max().item()
        finite = ref_lse.isfinite()
        same_inf = bool((lse.isfinite() == finite).all())
        lse_diff = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        exact = (out == ref_out).float().mean().item()
        print(f"b={b} s_q={s_q} h_q={heads} topk={topk} block_size={block_size}: max |out diff| "
              f"{out_diff:.3g} ({exact:.1%} bit-equal), max |lse diff| {lse_diff:.3g}, "
              f"-inf lse where expected: {same_inf}")
        worst = max(worst, out_excess, lse_diff - 1e-3, 0.0 if same_inf else float("inf"))
    ok = worst <= 0
    print("CHECK OK" if ok else "CHECK FAILED")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producer-regs", type=int, default=None)
    parser.add_argument("--maxnreg", type=int, default=None)
    parser.add_argument("--producer-warps", type=int, default=None)
    parser.add_argument("--dump", type=Path, default=None, help="write the ttgir and ptx here")
    parser.add_argument("--check", action="store_true", help="run it against the Triton kernel "
                        "on an SM90 GPU instead of compiling ahead of time")
    opts = parser.parse_args()
    if opts.check:
        return check_on_gpu()
    overrides = {}
    if opts.producer_regs is not None:
        overrides["PRODUCER_REGS"] = opts.producer_regs
    if opts.producer_warps is not None:
        overrides["PRODUCER_WARPS"] = opts.producer_warps
    if opts.maxnreg is not None:
        overrides["maxnreg"] = opts.maxnreg

    print(f"triton {triton.__version__}, {TARGET}, sm_90a; shape b={B} s_q={S_Q} h_q={HEADS} "
          f"topk={TOPK}; {overrides or 'defaults'}")
    compiled = compile_sm90(**overrides)
    ptx = compiled.asm["ptx"]
    if opts.dump:
        opts.dump.mkdir(parents=True, exist_ok=True)
        for name in ("ttgir", "llir", "ptx"):
            (opts.dump / f"gluon_sparse_decode.{name}").write_text(compiled.asm[name])
    report = ptxas_report(ptx)
    print("ptxas -v:")
    for line in report.strip().splitlines():
        print("   ", line.split("ptxas info    : ")[-1])
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spill_stores = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    spill_loads = int(re.search(r"(\d+) bytes spill loads", report).group(1))
    shared = compiled.metadata.shared
    print(f"registers (kernel, before setmaxnreg): {registers}; spills {spill_stores} B stored / "
          f"{spill_loads} B loaded per thread")
    print(f"shared memory: {shared} B (explicit {gluon_decode.shared_bytes()} B; limit "
          f"{gluon_decode.SHARED_LIMIT} B) -> {'fits' if shared <= gluon_decode.SHARED_LIMIT else 'TOO BIG'}")
    print(f"warps: {compiled.metadata.num_warps} in all ({gluon_decode.PRODUCER_WARPS} producer)")
    print(f"  spill instructions in the SASS by region: {sass_spills_by_region(ptx) or 'none'}")
    for key, value in ptx_facts(ptx).items():
        print(f"  {key}: {value}")
    ok = spill_stores == 0 and spill_loads == 0 and shared <= gluon_decode.SHARED_LIMIT
    print("OK" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
