"""The ways an engine's attention wrapper feeds a kernel, written as engines write them.

Every operation is seen in rows: q (rows, heads, 576), out (rows, heads, d_v), lse (heads, rows),
rows being T, requests or s_q (`KernelCall` converts to the kernel's layout).
- `alloc`: pad q to the smallest head count the kernel runs for that operation with
  `new_zeros`, copy the real heads in (quantizing to fp8 where the kernel reads fp8 q), call the
  kernel (which allocates out, lse and its split-KV accumulators), slice the real heads out.
- `workspace`: q (and out, when the kernel takes `out=`) are staged in buffers the backend
  reserved at init for the operation's workspace rows; only the padding heads are zeroed.
- `workspace-full`: as `workspace`, and lse and the split-KV accumulators are staged too, so the
  call allocates nothing. Only for a kernel that takes out=, lse= and accum_workspace= (mlamem's
  Triton kernel); with any other, asking for it is a user error naming the kernels that can.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlamem.spec.errors import UserError
from mlamem.spec.kernel_api import (
    ACCUM_WORKSPACE,
    SPARSE_DECODE,
    BufferSpec,
    Capabilities,
    KernelContract,
    Problem,
    from_kernel_layout,
    to_kernel_layout,
)
from mlamem.spec.kernel_registry import REGISTRY, load_kernel

if TYPE_CHECKING:  # checking paths needs no torch; allocating does, and imports it there
    import torch

PATH_NAMES = ("alloc", "workspace", "workspace-full")
STAGING_PATHS = ("workspace", "workspace-full")  # the paths that reserve a workspace
FULL_STAGING = ("takes_out", "takes_lse", "takes_accum_workspace")  # what workspace-full needs


@dataclass
class Workspace:
    """Buffers an attention backend reserves at init, sized for max_num_batched_tokens."""

    padded_q: torch.Tensor  # (max_tokens, padded_heads, d_qk), the kernel's q dtype
    out: torch.Tensor  # (max_tokens, padded_heads, d_v) bfloat16
    lse: torch.Tensor | None = None  # (padded_heads * max_tokens,) float32; workspace-full only
    accum_workspace: torch.Tensor | None = None  # flat float32 accumulators; workspace-full only

    @classmethod
    def reserve(cls, max_tokens: int, padded_heads: int, d_qk: int, d_v: int,
                device: torch.device, *, accum_workspace_numel: int | None = None,
                q_dtype: str = "bfloat16") -> Workspace:
        """q and out; with `accum_workspace_numel` (workspace-full) also lse and the
        accumulators, lse as a flat buffer viewed per call in the kernel's (1, h_q, T) layout."""
        import torch

        full = accum_workspace_numel is not None
        return cls(
            padded_q=torch.empty((max_tokens, padded_heads, d_qk), dtype=getattr(torch, q_dtype),
                                 device=device),
            out=torch.empty((max_tokens, padded_heads, d_v), dtype=torch.bfloat16,
                            device=device),
            lse=(torch.empty((padded_heads * max_tokens,), dtype=torch.float32, device=device)
                 if full else None),
            accum_workspace=(torch.empty((accum_workspace_numel,), dtype=torch.float32,
                                         device=device) if full else None),
        )

    @property
    def max_tokens(self) -> int:
        return self.padded_q.shape[0]

    def lse_for(self, tokens: int) -> torch.Tensor:
        """The staged lse of a T-token call: (1, padded_heads, T) float32, contiguous."""
        heads = self.padded_q.shape[1]
        return self.lse[:heads * tokens].view(1, heads, tokens)


def reserve_workspace(path: str, kernel: KernelContract, *, max_tokens: int,
                      padded_heads: int, d_qk: int, d_v: int, topk: int | None, sm_count: int,
                      device: torch.device, q_dtype: str = "bfloat16",
                      op: str = SPARSE_DECODE) -> Workspace | None:
    """What the backend reserves at init for `path` (None for alloc), sized for max_tokens
    rows (tokens, or requests for the dense decode)."""
    if path not in STAGING_PATHS:
        return None
    accum = None
    if path == "workspace-full":  # the kernel sizes it for every call of up to max_tokens rows
        rows = Problem(op=op, rows=max_tokens, heads=padded_heads, sm_scale=1.0, kv_tokens=0,
                       topk=topk, d_qk=d_qk, d_v=d_v)
        accum = kernel.accum_numel(rows, sm_count)
    return Workspace.reserve(max_tokens, padded_heads, d_qk, d_v, device,
                             accum_workspace_numel=accum, q_dtype=q_dtype)


@dataclass(frozen=True)
class KernelCall:
    """Everything a path passes to the kernel besides q, for one operation."""

    run: Callable  # (q, out=None, **staged) -> (out, lse), all in the kernel's layout
    op: str  # a registered operation (operation_names())
    padded_heads: int
    takes_out: bool
    q_dtype: str = "bfloat16"  # the q the kernel reads: bfloat16, or float8_e4m3fn

    def __call__(self, q_padded: torch.Tensor, out: torch.Tensor | None = None, **staged):
        """q (rows, padded_heads, d_qk), out (rows, padded_heads, d_v) or None -> out
        (rows, padded_heads, d_v) and lse (padded_heads, rows), views of the kernel's.
        `staged`: lse= and accum_workspace=, passed on only to a kernel that takes them."""
        kernel_out = None if out is None else to_kernel_layout(self.op, out)
        result = self.run(to_kernel_layout(self.op, q_padded), out=kernel_out, **staged)
        return from_kernel_layout(self.op, *result)


def alloc_path(q: torch.Tensor, call: KernelCall, workspace: Workspace | None = None):
    """q (rows, h, 576) -> out (rows, h, 512), lse (h, rows); allocates the padded (or
    quantized) q per call."""
    import torch

    tokens, heads, d_qk = q.shape
    dtype = getattr(torch, call.q_dtype)
    if heads < call.padded_heads:
        q_padded = q.new_zeros((tokens, call.padded_heads, d_qk), dtype=dtype)
        q_padded[:, :heads].copy_(q)
    else:
        q_padded = q.to(dtype)  # q itself when no conversion is needed
    out, lse = call(q_padded)
    return out[:, :heads], lse[:heads]


def workspace_path(q: torch.Tensor, call: KernelCall, workspace: Workspace | None = None):
    """Like `alloc_path`, with padded q (and out, if the kernel takes it) in the workspace."""
    return _staged_call(q, call, workspace, {})


def workspace_full_path(q: torch.Tensor, call: KernelCall, workspace: Workspace | None = None):
    """Like `workspace_path`, with lse and the accumulators staged too: nothing allocated."""
    if workspace is None or workspace.lse is None:
        raise ValueError("the workspace-full path needs a workspace with lse and accumulators")
    tokens = q.shape[0]
    return _staged_call(q, call, workspace, {"lse": workspace.lse_for(tokens),
                                             "accum_workspace": workspace.accum_workspace})


def _staged_call(q: torch.Tensor, call: KernelCall, workspace: Workspace | None, staged: dict):
    tokens, heads, _ = q.shape
    if workspace is None or tokens > workspace.max_tokens:
        raise ValueError("the workspace paths need a workspace of at least T tokens")
    if heads < call.padded_heads or q.dtype != workspace.padded_q.dtype:
        q_padded = workspace.padded_q[:tokens]
        q_padded[:, :heads].copy_(q)  # quantizes, where the kernel reads fp8 q
        if heads < call.padded_heads:
            q_padded[:, heads:].zero_()
    else:
        q_padded = q
    out = workspace.out[:tokens] if call.takes_out else None
    out, lse = call(q_padded, out=out, **staged)
    return out[:, :heads], lse[:heads]


PATHS = {"alloc": alloc_path, "workspace": workspace_path, "workspace-full": workspace_full_path}


def wrapper_allocations(path: str, tokens: int, heads: int, padded_heads: int,
                        d_qk: int, q_dtype: str = "bfloat16") -> list[BufferSpec]:
    """What a path's wrapper allocates per call (the kernel's own buffers are its adapter's):
    the alloc path's padded q, or its fp8 copy of q where the kernel reads fp8 q."""
    if path != "alloc" or (heads == padded_heads and q_dtype == "bfloat16"):
        return []
    import torch

    name = "padded_q" if heads < padded_heads else "quantized_q"
    return [BufferSpec(name, (tokens, padded_heads, d_qk), getattr(torch, q_dtype), "temporary")]


@dataclass(frozen=True)
class PathPlan:
    """What a path stages in the workspace, and why the rest is not staged."""

    path: str
    staged: tuple[str, ...]  # buffer names taken from the workspace instead of allocated
    notes: tuple[str, ...]  # one sentence per buffer that could not be staged


def plan(path: str, heads: int, capabilities: Capabilities, kernel_label: str,
         q_dtype: str = "bfloat16") -> PathPlan:
    """The staging decisions the workspace paths make, in words."""
    if path == "alloc":
        return PathPlan(path, (), ())
    staged, notes = [], []
    if heads < capabilities.padded_heads(heads):
        staged.append("padded_q")
    elif q_dtype != "bfloat16":
        staged.append("quantized_q")
    else:
        notes.append(f"q not staged: {heads} heads per rank need no padding")
    if capabilities.takes_out:
        staged.append("out")
    else:
        notes.append(f"out not staged: this {kernel_label} build has no out= argument")
    if path == "workspace-full":
        check_paths([path], capabilities, kernel_label)
        staged += ["lse", ACCUM_WORKSPACE]
    return PathPlan(path, tuple(staged), tuple(notes))


def missing_for_full_staging(capabilities: Capabilities) -> list[str]:
    """The keyword arguments a kernel lacks for workspace-full, e.g. ['out=', 'lse=']."""
    arguments = {"takes_out": "out=", "takes_lse": "lse=",
                 "takes_accum_workspace": "accum_workspace="}
    return [arguments[c] for c in FULL_STAGING if not getattr(capabilities, c)]


def available_paths(capabilities: Capabilities) -> list[str]:
    """Every path the kernel supports, in PATH_NAMES order: the default sweep."""
    return [p for p in PATH_NAMES if p != "workspace-full" or not missing_for_full_staging(
        capabilities)]


def full_staging_kernels(op: str = SPARSE_DECODE) -> list[str]:
    """The registered kernels that take everything workspace-full stages (FULL_STAGING) for
    `op`, in registry order. It loads every adapter that runs `op` (an adapter that fails to
    is left out), so only the error path of `check_paths` asks."""
    names = []
    for name, entry in list(REGISTRY.items()):
        if op not in entry.operations:
            continue
        try:
            capabilities = load_kernel(name)().capabilities(op)
        except Exception:  # not loadable here, or not answering for op: not a suggestion
            continue
        if not missing_for_full_staging(capabilities):
            names.append(name)
    return names


def _full_staging_fix(op: str) -> str:
    names = full_staging_kernels(op)
    if not names:
        return "no registered kernel takes all three (`mlamem kernels` lists what each takes)"
    return "use kernel " + " or ".join(names)


def check_path_names(paths) -> None:
    """UserError for a path that is not one of PATH_NAMES (no kernel needed)."""
    for path in paths:
        if path not in PATH_NAMES:
            raise UserError(f"unknown path {path!r}; expected one of: {', '.join(PATH_NAMES)}")


def check_paths(paths, capabilities: Capabilities, kernel_label: str,
                op: str = SPARSE_DECODE) -> None:
    """UserError (exit 2) for an unknown path, or workspace-full with a kernel that cannot
    (naming the registered kernels that can run `op` with it)."""
    check_path_names(paths)
    missing = missing_for_full_staging(capabilities)
    if "workspace-full" in paths and missing:
        raise UserError(f"path workspace-full needs a kernel that takes out=, lse= and "
                        f"accum_workspace=; {kernel_label} takes no {', '.join(missing)} "
                        f"({capabilities.source}); {_full_staging_fix(op)}")
