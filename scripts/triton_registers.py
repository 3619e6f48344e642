"""Registers and spills of the Triton attention kernels (the fallbacks' designs, scaled and
folded-f16) per launch config, compiled ahead of time for SM90 without a GPU: compile-time
figures, not measurements of speed. (The Gluon kernel's are printed by scripts/gluon_compile.py.)

Usage: python3 scripts/triton_registers.py  (triton installed; TRITON_INTERPRET unset)

The kernel's arguments are those `sparse_mla_decode_triton` passes for the benchmark's shape
(topk = 2048, no split) at 64 heads, and for the native-head kernel at 8 and 16 heads (GLM-5
and DeepSeek-V3.2 at TP8: one program of 16 rows), on CPU tensors; Triton's own binder turns
them into the signature, constexprs and alignment attributes a launch would compile with, and
ptxas -v reads the PTX as Triton's compile does. ptxas takes all 255 registers a thread may have
unless maxnreg caps it (168 lets three 4-warp programs share an SM's 65,536), so the figure
that matters is the spills.
"""

import math
import re
import subprocess
import sys
import tempfile

import torch

try:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN
    from mlamem.kernels.own import triton_sparse_decode as kernels
    from mlamem.kernels.own.triton_decode import sparse_mla_decode_triton
except ImportError as exc:  # triton (and its Gluon) compile the kernels
    sys.exit(f"triton_registers.py: needs triton 3.6 ({exc}); pip install triton")

TARGET = GPUTarget("cuda", 90, 32)  # warp size 32, as the CUDA driver reports
S_Q, TOPK, BLOCK_SIZE = 256, 2048, 64  # s_q only needs to be > 1 and to fill the SMs
L = kernels.LaunchConfig
CONFIGS = [(64, L(block_n=n, num_warps=w, num_stages=st))
           for n, w, st in ((128, 8, 1), (128, 8, 2), (64, 8, 1), (64, 8, 2), (32, 8, 1), (32, 4, 1))]
CONFIGS += [(64, L(64, 8, 1, "folded-f16"))]
CONFIGS += [(heads, L(block_n=n, num_warps=w, num_stages=st))
            for heads in (8, 16)
            for n, w, st in ((128, 8, 1), (128, 4, 1), (64, 4, 1), (64, 4, 2), (64, 8, 2))]
CONFIGS += [(heads, config) for heads in (8, 16) for config in (
    L(64, 8, 1, "folded-f16"), L(32, 4, 1, "folded-f16", max_registers=168),
    kernels.NATIVE_FALLBACK_CONFIG)]


# the attention kernels (one per design) and the combine, which a split launches after it
LAUNCHED_KERNELS = ("_sparse_decode_attention", "_folded_decode_attention", "_combine_splits")


def attention_call(heads, config, split=False) -> tuple[object, tuple, dict]:
    """The attention kernel the wrapper launches for config, with its positional and keyword
    arguments; split: for one query on 132 SMs, so the topk is split."""
    calls = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((self.kernel, args, kwargs))

    pool = 4 * TOPK
    kv = torch.zeros(pool // BLOCK_SIZE, BLOCK_SIZE, 1, BYTES_PER_TOKEN, dtype=torch.uint8)
    s_q = 1 if split else S_Q
    q = torch.zeros(1, s_q, heads, 576, dtype=torch.bfloat16)
    indices = torch.zeros(1, s_q, TOPK, dtype=torch.int32)
    originals = {name: getattr(kernels, name) for name in LAUNCHED_KERNELS}
    for name, kernel in originals.items():
        setattr(kernels, name, Recorder(kernel))
    try:
        sparse_mla_decode_triton(q, kv, indices, sm_scale=1 / math.sqrt(576),
                                 sm_count=132 if split else 1,
                                 config=config, native=heads < 64)
    finally:
        for name, kernel in originals.items():
            setattr(kernels, name, kernel)
    return calls[0]


def compile_sm90(heads, config, split=False):
    """The attention kernel compiled for SM90 as a launch at `heads` with config would compile it."""
    fn, args, kwargs = attention_call(heads, config, split)
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization,
                                                          options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                          options=options.__dict__)


def ptxas_usage(ptx: str) -> dict:
    """Registers per thread and bytes of stack and spills, from ptxas -v with Triton's flags."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        done = subprocess.run([knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--gpu-name=sm_90a", source.name,
                               "-o", "/dev/null"], capture_output=True, text=True, check=True)
    number = lambda pattern: int(re.search(pattern, done.stderr).group(1))  # noqa: E731
    return {"registers": number(r"Used (\d+) registers"),
            "stack": number(r"(\d+) bytes stack frame"),
            "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads")}


def main() -> None:
    print(f"triton {triton.__version__}, {TARGET}; stack and spills in bytes per thread, "
          "shared memory in bytes per program\n")
    print("| heads | config | registers | stack | spill stores / loads | shared |")
    print("|---|---|---|---|---|---|")
    for heads, c in CONFIGS:
        compiled = compile_sm90(heads, c)
        usage = ptxas_usage(compiled.asm["ptx"])
        print(f"| {heads} | {c.label} | {usage['registers']} | {usage['stack']} | "
              f"{usage['spill_stores']} / {usage['spill_loads']} | {compiled.metadata.shared} |",
              flush=True)
    for heads, c in CONFIGS:  # the split variant of each (a call too small to fill the SMs)
        compile_sm90(heads, c, split=True)
    print(f"\nevery config also compiles with a split ({len(CONFIGS)} configs)")


if __name__ == "__main__":
    sys.exit(main())
