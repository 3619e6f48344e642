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

from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, quantize
from mlamem.scenario import Scenario

KV_POOL_TOPK_MULTIPLE = 4  # the synthetic KV pool holds 4 x topk tokens


@dataclass
class DecodeInputs:
    """One step's attention inputs for one rank."""

    q: torch.Tensor | None  # (T, heads_per_rank, 576) bfloat16; None if not asked for
    kv_cache: torch.Tensor  # (num_blocks, block_size, 1, 656) uint8, fp8_ds_mla
    indices: torch.Tensor  # (1, T, topk) int32, in range, -1 where invalid


def kv_pool_tokens(scenario: Scenario) -> int:
    """Tokens in the synthetic KV pool: a whole number of blocks covering 4 x topk."""
    block = scenario.serving.block_size
    return -(-KV_POOL_TOPK_MULTIPLE * scenario.decode_topk // block) * block


def make_inputs(scenario: Scenario, tokens: int, device: torch.device, seed: int = 0,
                invalid_fraction: float = 0.0, with_query: bool = True) -> DecodeInputs:
    """Inputs for a step of `tokens` query tokens; the same seed gives the same values.

    `with_query=False` leaves q to the caller (an engine allocates it as an activation and
    fills it with `fill_query`).
    """
    pool = kv_pool_tokens(scenario)
    cache_shape = (pool // scenario.serving.block_size, scenario.serving.block_size, 1,
                   BYTES_PER_TOKEN)
    if device.type == "meta":  # no values: skip drawing and quantizing them on the CPU
        kv_cache = torch.empty(cache_shape, dtype=torch.uint8, device=device)
    else:
        latent = torch.randn((pool, scenario.d_qk), generator=torch.Generator().manual_seed(seed))
        kv_cache = quantize(latent).view(cache_shape).to(device)
    on_device = {} if device.type == "meta" else {
        "generator": torch.Generator(device).manual_seed(seed)}
    indices = torch.randint(0, pool, (1, tokens, scenario.decode_topk), dtype=torch.int32,
                            device=device, **on_device)
    if invalid_fraction:
        drop = torch.rand(indices.shape, device=device, **on_device) < invalid_fraction
        drop[..., 0] = False  # every query keeps at least one valid key
        indices.masked_fill_(drop, -1)
    q = None
    if with_query:
        q = torch.randn((tokens, scenario.heads_per_rank, scenario.d_qk), dtype=torch.bfloat16,
                        device=device, **on_device)
    return DecodeInputs(q=q, kv_cache=kv_cache, indices=indices)


def fill_query(q: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Fill an allocated q in place with standard normal values (never zeros)."""
    if q.device.type == "meta":  # dispatched all the same: its first launch loads modules
        return q.normal_()
    return q.normal_(generator=torch.Generator(q.device).manual_seed(seed))
