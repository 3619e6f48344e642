"""Plain-torch reference of the sparse fp8 MLA decode: dequantize, gather the topk, attend.

Runs on any device, meta included, and in float32. Slow and memory-hungry by design: it is the
yardstick for the real kernels at small sizes, not a fast path.
"""

from __future__ import annotations

import torch

from mlamem.kernels.base import Capabilities, SparseDecodeKernel
from mlamem.kernels.fp8_ds_mla import dequantize

QUERY_CHUNK = 256  # queries attended at once, to bound the gathered-KV temporary


def sparse_mla_decode_reference(q, kv_cache, indices, *, sm_scale: float, d_v: int):
    """out (b, s_q, h_q, d_v) bf16 and lse (b, h_q, s_q) fp32 for the sparse decode.

    Rows whose indices are all -1 get out = 0 and lse = -inf.
    """
    b, s_q, h_q, _ = q.shape
    kv = dequantize(kv_cache).reshape(-1, 576)  # (kv tokens, d_qk)
    out = torch.empty((b, s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    for batch in range(b):
        for start in range(0, s_q, QUERY_CHUNK):
            stop = min(start + QUERY_CHUNK, s_q)
            idx = indices[batch, start:stop].long()  # (n, topk)
            valid = idx >= 0
            keys = kv[idx.clamp(min=0)]  # (n, topk, 576)
            scores = torch.einsum("nhd,nkd->nhk", q[batch, start:stop].float(), keys) * sm_scale
            scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)  # (n, h)
            probs = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
            out[batch, start:stop] = torch.einsum("nhk,nkd->nhd", probs, keys[..., :d_v]).to(
                torch.bfloat16)
            lse[batch, :, start:stop] = row_lse.T
    return out, lse


class Reference(SparseDecodeKernel):
    """The plain-torch reference as a kernel adapter."""

    name = "reference"
    label = "torch reference"
    runs_on_meta = True

    def unavailable_reason(self) -> str | None:
        """Runs anywhere, but a measurement needs the CUDA allocator."""
        import torch

        return None if torch.cuda.is_available() else "no CUDA device"

    def capabilities(self) -> Capabilities:
        return Capabilities(takes_out=False, takes_lse=False, takes_accum_workspace=False,
                            head_counts=(64, 128), source="plain torch, mirrors FlashMLA's heads")

    def decode(self, q, kv_cache, indices, *, sm_scale: float, d_v: int, out=None):
        if out is not None:
            raise TypeError("the reference takes no out= argument")
        return sparse_mla_decode_reference(q, kv_cache, indices, sm_scale=sm_scale, d_v=d_v)

    def allocations(self, q_shape, d_v, sm_count):
        """No spec: the reference runs on the meta device itself, and its many temporaries
        show up in a breakdown as unattributed."""
        return []
