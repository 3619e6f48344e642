"""mlamem's own sparse fp8 MLA decode: the Gluon warp-specialized kernel, the Triton kernels it
falls back to, and their adapters (`triton`, `triton-native`).

Apart from the core: no mlamem module and no other adapter imports this package (pyproject.toml's
import-linter contract checks it); the kernel registry reaches the adapters by module name,
`mlamem.kernels.own.triton_decode`, when a kernel is loaded.

- `triton_decode`: the adapters and the planning (split plan, allocations); imports no triton.
- `triton_sparse_decode`: the Triton kernels, the launch configs and designs, and the choice of
  the kernel a call runs (`runnable_config`).
- `gluon_sparse_decode`: the Gluon kernel (SM90).
- `e4m3_bf16`: the PTX of the Gluon kernel's FlashMLA-rounded dequantization, importable
  without triton (tests/test_fp8_ds_mla.py runs its bit steps on the CPU).
"""
