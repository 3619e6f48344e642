"""Synthetic but valid decode inputs: never zeros.

Generated in the same order, with the same shapes, on a CUDA device or on the meta device, so
the allocator sees the same requests in both. Large tensors are drawn directly on the device
(no temporaries); the small KV cache is quantized on the CPU and copied over. On the meta device
there are no values to draw: the KV cache is an empty meta tensor of the copy's shape, which
asks the allocator for the same bytes at the same point.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlamem.fp8_ds_mla import BYTES_PER_TOKEN, quantize
from mlamem.kernel_api import DENSE_DECODE, SPARSE_DECODE, OpInputs, Problem
from mlamem.operations import kv_pool_tokens
from mlamem.scenario import Scenario


@dataclass
class DecodeInputs:
    """One step's attention inputs for one rank."""

    q: torch.Tensor | None  # (T, heads_per_rank, 576) bfloat16; None if not asked for
    kv_cache: torch.Tensor  # (num_blocks, block_size, 1, 656) uint8, fp8_ds_mla
    indices: torch.Tensor  # (1, T, topk) int32, in range, -1 where invalid


def make_inputs(scenario: Scenario, tokens: int, device: torch.device, seed: int = 0,
                invalid_fraction: float = 0.0, with_query: bool = True) -> DecodeInputs:
    """Sparse decode inputs for a step of `tokens` query tokens; the same seed gives the same
    values.

    `with_query=False` leaves q to the caller (an engine allocates it as an activation and
    fills it with `fill_query`).
    """
    return _sparse_decode_inputs(
        kv_pool_tokens(scenario), scenario.serving.block_size, scenario.decode_topk, tokens,
        scenario.heads_per_rank if with_query else None, scenario.d_qk, device, seed,
        invalid_fraction)


def _generator(device: torch.device, seed: int) -> dict:
    """`generator=` for drawing on `device`; none on the meta device (no values there)."""
    return {} if device.type == "meta" else {"generator": torch.Generator(device).manual_seed(seed)}


def _sparse_decode_inputs(pool: int, block: int, topk: int, tokens: int, heads: int | None,
                          d_qk: int, device: torch.device, seed: int,
                          invalid_fraction: float = 0.0) -> DecodeInputs:
    cache_shape = (pool // block, block, 1, BYTES_PER_TOKEN)
    if device.type == "meta":  # no values: skip drawing and quantizing them on the CPU
        kv_cache = torch.empty(cache_shape, dtype=torch.uint8, device=device)
    else:
        latent = torch.randn((pool, d_qk), generator=torch.Generator().manual_seed(seed))
        kv_cache = quantize(latent).view(cache_shape).to(device)
    on_device = _generator(device, seed)
    indices = torch.randint(0, pool, (1, tokens, topk), dtype=torch.int32, device=device,
                            **on_device)
    if invalid_fraction:
        drop = torch.rand(indices.shape, device=device, **on_device) < invalid_fraction
        drop[..., 0] = False  # every query keeps at least one valid key
        indices.masked_fill_(drop, -1)
    q = None
    if heads is not None:
        q = torch.randn((tokens, heads, d_qk), dtype=torch.bfloat16, device=device, **on_device)
    return DecodeInputs(q=q, kv_cache=kv_cache, indices=indices)


def random_fp8_(cache: torch.Tensor, generator: dict) -> torch.Tensor:
    """Fill a uint8 tensor in place with finite fp8 e4m3 bit patterns of magnitude 1/4 to
    15/8, either sign (no temporaries: the cache is drawn at its full size); returns it."""
    cache.random_(0, 256, **generator)
    return cache.bitwise_and_(0x9F).bitwise_or_(0x28)  # exponent bits 0b01?1: 2^-2 or 2^0


def make_op_inputs(problem: Problem, heads: int, device: torch.device, seed: int = 0):
    """Valid synthetic inputs for one call of `problem`: (q, OpInputs).

    q is the wrapper's (rows, heads, 576) bfloat16 activation at the rank's own head count
    (paths pad and, for an fp8 cache, quantize it). Tensors come in the order kv, indices or
    block table, q, drawn on the device itself (no temporaries), so the meta device sees the
    same allocations. Sparse decode's are `make_inputs`'.
    """
    g = _generator(device, seed)
    if problem.op == SPARSE_DECODE:
        made = _sparse_decode_inputs(problem.kv_tokens, problem.block_size, problem.topk,
                                     problem.rows, heads, problem.d_qk, device, seed)
        return made.q, OpInputs(kv=made.kv_cache, indices=made.indices)
    if problem.op == DENSE_DECODE:
        blocks = -(-problem.kv_tokens // problem.block_size)  # per request
        shape = (problem.rows * blocks, problem.block_size, 1, problem.d_qk)
        if problem.kv_format == "fp8":
            kv = random_fp8_(torch.empty(shape, dtype=torch.uint8, device=device), g).view(
                torch.float8_e4m3fn)
        else:
            kv = torch.randn(shape, dtype=torch.bfloat16, device=device, **g)
        table = torch.randperm(problem.rows * blocks, dtype=torch.int32, device=device, **g)
        inputs = OpInputs(kv=kv, block_table=table.view(problem.rows, blocks),
                          seqlens=torch.full((problem.rows,), problem.kv_tokens,
                                             dtype=torch.int32, device=device))
        if problem.kv_format == "fp8":  # per-tensor scales: 1, so the fp8 values are the data
            inputs.descale_q = torch.ones((1,), dtype=torch.float32, device=device)
            inputs.descale_k = torch.ones((1,), dtype=torch.float32, device=device)
    else:  # sparse prefill over a gathered bf16 kv
        kv = torch.randn((problem.kv_tokens, 1, problem.d_qk), dtype=torch.bfloat16,
                         device=device, **g)
        indices = torch.randint(0, problem.kv_tokens, (problem.rows, 1, problem.topk),
                                dtype=torch.int32, device=device, **g)
        inputs = OpInputs(kv=kv, indices=indices)
    q = torch.randn((problem.rows, heads, problem.d_qk), dtype=torch.bfloat16, device=device,
                    **g)
    return q, inputs


def fill_query(q: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Fill an allocated q in place with standard normal values (never zeros)."""
    if q.device.type == "meta":  # dispatched all the same: its first launch loads modules
        return q.normal_()
    return q.normal_(generator=torch.Generator(q.device).manual_seed(seed))
