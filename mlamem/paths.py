"""The two ways an engine's attention wrapper feeds the sparse decode, written as engines write them.

- `alloc`: pad q to the kernel's head count with `new_zeros`, copy the real heads in, call the
  kernel (which allocates out, lse and its split-KV accumulators), slice the real heads out.
- `workspace`: q (and out, when the kernel takes `out=`) are staged in buffers the backend
  reserved at init for max_num_batched_tokens; only the padding heads are zeroed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlamem.kernels.base import BufferSpec, Capabilities

PATH_NAMES = ("alloc", "workspace")


@dataclass
class Workspace:
    """Buffers an attention backend reserves at init, sized for max_num_batched_tokens."""

    padded_q: torch.Tensor  # (max_tokens, padded_heads, d_qk) bfloat16
    out: torch.Tensor  # (max_tokens, padded_heads, d_v) bfloat16

    @classmethod
    def reserve(cls, max_tokens: int, padded_heads: int, d_qk: int, d_v: int,
                device: torch.device) -> Workspace:
        return cls(
            padded_q=torch.empty((max_tokens, padded_heads, d_qk), dtype=torch.bfloat16,
                                 device=device),
            out=torch.empty((max_tokens, padded_heads, d_v), dtype=torch.bfloat16,
                            device=device),
        )

    @property
    def max_tokens(self) -> int:
        return self.padded_q.shape[0]


@dataclass(frozen=True)
class DecodeCall:
    """Everything a path passes to the kernel besides q."""

    decode: Callable  # kernel.decode, or its allocation-spec stand-in on the meta device
    kv_cache: torch.Tensor
    indices: torch.Tensor  # (1, T, topk)
    sm_scale: float
    d_v: int
    padded_heads: int
    takes_out: bool

    def __call__(self, q_padded: torch.Tensor, out: torch.Tensor | None = None):
        return self.decode(q_padded.unsqueeze(0), self.kv_cache, self.indices,
                           sm_scale=self.sm_scale, d_v=self.d_v, out=out)


def alloc_path(q: torch.Tensor, call: DecodeCall, workspace: Workspace | None = None):
    """q (T, h, 576) -> out (T, h, 512), lse (h, T); allocates the padded q per call."""
    tokens, heads, d_qk = q.shape
    if heads < call.padded_heads:
        q_padded = q.new_zeros((tokens, call.padded_heads, d_qk))
        q_padded[:, :heads].copy_(q)
    else:
        q_padded = q
    out, lse = call(q_padded)
    return out[0, :, :heads], lse[0, :heads]


def workspace_path(q: torch.Tensor, call: DecodeCall, workspace: Workspace | None = None):
    """Like `alloc_path`, with padded q (and out, if the kernel takes it) in the workspace."""
    tokens, heads, _ = q.shape
    if workspace is None or tokens > workspace.max_tokens:
        raise ValueError("the workspace path needs a workspace of at least T tokens")
    if heads < call.padded_heads:
        q_padded = workspace.padded_q[:tokens]
        q_padded[:, :heads].copy_(q)
        q_padded[:, heads:].zero_()
    else:
        q_padded = q
    out = workspace.out[:tokens].unsqueeze(0) if call.takes_out else None
    out, lse = call(q_padded, out=out)
    return out[0, :, :heads], lse[0, :heads]


PATHS = {"alloc": alloc_path, "workspace": workspace_path}


def wrapper_allocations(path: str, tokens: int, heads: int, padded_heads: int,
                        d_qk: int) -> list[BufferSpec]:
    """What a path's wrapper allocates per call (the kernel's own buffers are its adapter's)."""
    if path == "alloc" and heads < padded_heads:
        return [BufferSpec("padded_q", (tokens, padded_heads, d_qk), torch.bfloat16, "temporary")]
    return []


@dataclass(frozen=True)
class PathPlan:
    """What a path stages in the workspace, and why the rest is not staged."""

    path: str
    staged: tuple[str, ...]  # buffer names taken from the workspace instead of allocated
    notes: tuple[str, ...]  # one sentence per buffer that could not be staged


def plan(path: str, heads: int, capabilities: Capabilities, kernel_label: str) -> PathPlan:
    """The staging decisions `workspace_path` makes, in words."""
    if path == "alloc":
        return PathPlan(path, (), ())
    staged, notes = [], []
    if heads < capabilities.padded_heads(heads):
        staged.append("padded_q")
    else:
        notes.append(f"q not staged: {heads} heads per rank need no padding")
    if capabilities.takes_out:
        staged.append("out")
    else:
        notes.append(f"out not staged: this {kernel_label} build has no out= argument")
    return PathPlan(path, tuple(staged), tuple(notes))
