"""Synthetic but valid decode inputs: never zeros. Each operation draws its own
(`Operation.make_inputs`, in its module of mlamem.operations); this is an engine's door to them.

Generated in the same order, with the same shapes, on a CUDA device or on the meta device, so
the allocator sees the same requests in both. Large tensors are drawn directly on the device
(no temporaries); the small KV cache is quantized on the CPU and copied over. On the meta device
there are no values to draw: the KV cache is an empty meta tensor of the copy's shape, which
asks the allocator for the same bytes at the same point.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlamem.operations import SPARSE_DECODE, operation
from mlamem.operations.dense_decode import random_fp8_  # noqa: F401  (imported from here before)
from mlamem.operations.sparse_decode import sparse_decode_inputs
from mlamem.spec.scenario import Scenario


@dataclass
class DecodeInputs:
    """One step's attention inputs for one rank."""

    q: torch.Tensor | None  # (T, heads_per_rank, 576) bfloat16; None if not asked for
    kv_cache: torch.Tensor  # (num_blocks, block_size, 1, 656) uint8, fp8_ds_mla
    indices: torch.Tensor  # (1, T, topk) int32, in range, -1 where invalid


def make_inputs(scenario: Scenario, tokens: int, device: torch.device, seed: int = 0,
                invalid_fraction: float = 0.0, with_query: bool = True) -> DecodeInputs:
    """An engine step's sparse decode inputs for `tokens` query tokens over the operation's
    pool; the same seed gives the same values.

    `with_query=False` leaves q to the caller (an engine allocates it as an activation and
    fills it with `fill_query`).
    """
    q, kv_cache, indices = sparse_decode_inputs(
        operation(SPARSE_DECODE).default_kv_tokens(scenario), scenario.serving.block_size,
        scenario.decode_topk, tokens, scenario.heads_per_rank if with_query else None,
        scenario.d_qk, device, seed, invalid_fraction)
    return DecodeInputs(q=q, kv_cache=kv_cache, indices=indices)


def make_op_inputs(problem, heads: int, device: torch.device, seed: int = 0):
    """Valid synthetic inputs for one call of `problem`: its operation's (q, OpInputs)."""
    return operation(problem.op).make_inputs(problem, heads, device, seed)


def fill_query(q: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Fill an allocated q in place with standard normal values (never zeros)."""
    if q.device.type == "meta":  # dispatched all the same: its first launch loads modules
        return q.normal_()
    return q.normal_(generator=torch.Generator(q.device).manual_seed(seed))
