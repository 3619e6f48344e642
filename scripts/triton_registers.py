"""Registers and spills of the Triton attention kernel per launch config, compiled ahead of time
for SM90 without a GPU: compile-time figures, not measurements of speed.

Usage: python3 scripts/triton_registers.py  (triton installed; TRITON_INTERPRET unset)

The kernel's arguments are those `sparse_mla_decode_triton` passes for the benchmark's shape
(h_q = 64, topk = 2048, no split) on CPU tensors; Triton's own binder turns them into the
signature, constexprs and alignment attributes a launch would compile with, and ptxas -v reads
the PTX as Triton's compile does.
"""

import math
import subprocess
import sys
import tempfile

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from mlamem.kernels import triton_sparse_decode as kernels
from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN
from mlamem.kernels.triton_decode import sparse_mla_decode_triton

TARGET = GPUTarget("cuda", 90, 32)  # warp size 32, as the CUDA driver reports
S_Q, HEADS, TOPK, BLOCK_SIZE = 256, 64, 2048, 64  # s_q only needs to be > 1 and to fill the SMs
CONFIGS = [kernels.DEFAULT_CONFIG, kernels.LaunchConfig(block_n=64),
           *(kernels.LaunchConfig(block_n=n, d_v_split=2) for n in (32, 64)
             if "d_v_split" in kernels.LaunchConfig.__dataclass_fields__)]


def attention_call(config) -> tuple[tuple, dict]:
    """The positional and keyword arguments the wrapper launches the attention kernel with."""
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    pool = 4 * TOPK
    kv = torch.zeros(pool // BLOCK_SIZE, BLOCK_SIZE, 1, BYTES_PER_TOKEN, dtype=torch.uint8)
    q = torch.zeros(1, S_Q, HEADS, 576, dtype=torch.bfloat16)
    indices = torch.zeros(1, S_Q, TOPK, dtype=torch.int32)
    kernel, kernels._sparse_decode_attention = kernels._sparse_decode_attention, Recorder()
    try:
        sparse_mla_decode_triton(q, kv, indices, sm_scale=1 / math.sqrt(576), sm_count=1,
                                 config=config)
    finally:
        kernels._sparse_decode_attention = kernel
    return calls[0]


def compile_sm90(config):
    """The attention kernel compiled for SM90 as a launch with config would compile it."""
    fn = kernels._sparse_decode_attention
    args, kwargs = attention_call(config)
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization,
                                                          options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                          options=options.__dict__)


def ptxas_report(ptx: str) -> str:
    """ptxas -v's resource lines for the PTX, with the flags Triton's compile uses."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        done = subprocess.run([knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--gpu-name=sm_90a", source.name,
                               "-o", "/dev/null"], capture_output=True, text=True, check=True)
    return " ".join(line.split("info    : ", 1)[-1].strip() for line in done.stderr.splitlines()
                    if "registers" in line or "spill" in line or "stack" in line)


def main() -> None:
    print(f"triton {triton.__version__}, target {TARGET}")
    for config in CONFIGS:
        compiled = compile_sm90(config)
        print(f"{config}: {ptxas_report(compiled.asm['ptx'])}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
