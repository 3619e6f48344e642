"""Adapter for vLLM's own FlashMLA build: the kernels vLLM users run, which take `out_`.

The `vllm` wheel carries FlashMLA as two libraries, built for sm_90a and sm_100f:
- `vllm/_flashmla_C.abi3.so`: `torch.ops._flashmla_C.sparse_decode_fwd`, `dense_decode_fwd`
  and `sparse_prefill_fwd`, each with a trailing `out_`: given a buffer, the op writes its
  output there instead of allocating it;
- `vllm/_flashmla_extension_C.abi3.so`: the dense fp8 decode (`fwd_kvcache_mla_fp8`), no `out_`.
They load on their own with `torch.ops.load_library`, needing only libtorch, libcudart and
libcuda, so vllm itself is never imported. They are found
- in the folder named by $MLAMEM_VLLM_FLASHMLA (the .so files taken out of the wheel, see the
  README),
- else inside an installed vllm package.
Everything a call allocates besides out is what sgl-flash-mla allocates (`kernels/flashmla.py`
says what was recorded and how), which `mlamem validate --kernel flashmla-vllm` checks against
the allocator's trace. On SM90 its sparse prefill runs 8, 16, 32, 64 or 128 heads natively
(sgl-flash-mla's only 64 or 128), probed on an H200 by scripts/kernel_trace.py.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path

import torch

from mlamem.kernels.base import DENSE_DECODE, SPARSE_DECODE, SPARSE_PREFILL
from mlamem.kernels.flashmla import ALL_HEADS, HEAD_COUNTS, FlashMLABuild

FOLDER_VARIABLE = "MLAMEM_VLLM_FLASHMLA"
LIBRARY = "_flashmla_C.abi3.so"
EXTENSION = "_flashmla_extension_C.abi3.so"  # the dense fp8 decode
WHEEL = "vllm==0.33.0"
INSTALL_HINT = (f"pip install --no-deps {WHEEL}, or set {FOLDER_VARIABLE} to a folder holding "
                f"{LIBRARY} and {EXTENSION} taken out of the vllm wheel (see the README)")
# vllm 0.33.0's schemas as the H200 registered them, for where the libraries are not loaded.
VLLM_SCHEMAS = {
    "sparse_decode_fwd": "_flashmla_C::sparse_decode_fwd(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, Tensor? attn_sink, Tensor(a)? tile_scheduler_metadata, Tensor(b)? num_splits, Tensor? extra_kv, Tensor? extra_indices, Tensor? extra_topk_length, int d_v, float sm_scale, Tensor(c!)? out_=None, bool enable_batch_invariant=False) -> (Tensor(c!), Tensor, Tensor(a)?, Tensor(b)?)",  # noqa: E501
    "dense_decode_fwd": "_flashmla_C::dense_decode_fwd(Tensor q, Tensor kcache, int head_size_v, Tensor seqlens_k, Tensor block_table, float softmax_scale, bool is_causal, Tensor(a)? tile_scheduler_metadata, Tensor(b)? num_splits, Tensor(c!)? out_) -> (Tensor(c!), Tensor, Tensor(a)?, Tensor(b)?)",  # noqa: E501
    "sparse_prefill_fwd": "_flashmla_C::sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, Tensor? topk_length, Tensor(a!)? out_) -> Tensor[]",  # noqa: E501
    "fwd_kvcache_mla_fp8": "_flashmla_extension_C::fwd_kvcache_mla_fp8(Tensor q, Tensor kcache, int head_size_v, Tensor seqlens_k, Tensor block_table, float softmax_scale, bool is_causal, Tensor tile_scheduler_metadata, Tensor num_splits, Tensor? descale_q, Tensor? descale_k) -> Tensor[]",  # noqa: E501
}
VLLM_HEADS = {SPARSE_DECODE: HEAD_COUNTS, DENSE_DECODE: ALL_HEADS, SPARSE_PREFILL: ALL_HEADS}
MAX_LIBRARY_BYTES = 512 << 20  # vllm 0.33.0's _flashmla_C is about 4 MB; past this, no library


def library_path(name: str = LIBRARY) -> Path | None:
    """Where a vLLM FlashMLA library is: $MLAMEM_VLLM_FLASHMLA, else an installed vllm."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder:
        candidate = Path(folder) / name
        return candidate if candidate.is_file() else None
    try:
        spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / name
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _load(path: Path) -> str | None:
    """Load a library once; None when it loaded, else why not."""
    try:
        torch.ops.load_library(str(path))
    except Exception as exc:  # OSError from a missing dependency, RuntimeError, ...
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _wheel_version(path: Path) -> str:
    """vllm's version: from the wheel's METADATA kept beside the libraries (see the README),
    else from an installed vllm; "vllm ?" when neither says."""
    metadata = path.parent / "METADATA"
    if metadata.is_file():
        with open(metadata, errors="replace") as handle:
            head = handle.read(1 << 16)  # Version is among the first lines
        for line in head.splitlines():
            if line.startswith("Version:"):
                return f"vllm {line.split(':', 1)[1].strip()}"
    try:
        return f"vllm {importlib.metadata.version('vllm')}"
    except importlib.metadata.PackageNotFoundError:
        return "vllm ?"


def _too_large(path: Path) -> str | None:
    """Why the library is not one (past MAX_LIBRARY_BYTES), in a line naming the variable."""
    size = path.stat().st_size
    if size <= MAX_LIBRARY_BYTES:
        return None
    return (f"{path} is {size} bytes, no FlashMLA library (about 4 MB; at most "
            f"{MAX_LIBRARY_BYTES} read); point {FOLDER_VARIABLE} at the folder of the .so files "
            "taken out of the vllm wheel")


@functools.cache
def _sha256(path: Path) -> str:
    """The library's sha256, read in chunks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class FlashMLAVLLM(FlashMLABuild):
    """vLLM's FlashMLA: out staged through `out_` where the op has it, the rest as FlashMLA."""

    name = "flashmla-vllm"
    label = "FlashMLA (vLLM build)"
    assumed_schemas = VLLM_SCHEMAS
    assumed_source = "vllm 0.33.0 _flashmla_C schema"
    head_table = VLLM_HEADS

    def unavailable_reason(self) -> str | None:
        path = library_path()
        if path is None:
            where = os.environ.get(FOLDER_VARIABLE)
            found = f"no {LIBRARY} in {where}" if where else "vLLM's FlashMLA build not found"
            return f"{found}; {INSTALL_HINT}"
        if (too_large := _too_large(path)) is not None:
            return too_large
        if not torch.cuda.is_available():
            return "no CUDA device"
        major, minor = torch.cuda.get_device_capability(self.device)
        if major not in (9, 10):
            return f"vLLM's FlashMLA needs SM90 or SM100; this GPU is SM{major}{minor}"
        error = _load(path)
        return None if error is None else f"{path} does not load ({error}); {INSTALL_HINT}"

    def version(self) -> str | None:
        """The vllm version (when installed) and the library's sha256, so two builds differ."""
        path = library_path()
        if path is None or _too_large(path) is not None:
            return None
        return f"{_wheel_version(path)} sha256:{_sha256(path)[:16]}"

    def namespace(self, op_name: str):
        if op_name == "fwd_kvcache_mla_fp8":
            path = library_path(EXTENSION)
            error = "not found" if path is None else _load(path)
            if error is not None:
                raise RuntimeError(f"{EXTENSION} {error}; {INSTALL_HINT}")
            return torch.ops._flashmla_extension_C
        return torch.ops._flashmla_C

    def _out_argument(self, out) -> tuple:
        return (out,)

    def _prefill(self, q, inputs, problem, out):
        return torch.ops._flashmla_C.sparse_prefill_fwd(
            q, inputs.kv, inputs.indices, problem.sm_scale, problem.d_v, None, None, out)

    def _sparse_decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        result = torch.ops._flashmla_C.sparse_decode_fwd(
            q, kv_cache, indices, None, None, None, None, None, None, None, d_v, sm_scale,
            out_=out)
        return result[0], result[1]
