"""Plain-torch references of FlashMLA's MLA operations: the sparse fp8 decode (dequantize, gather
the topk, attend), the dense paged decode (bf16 or fp8 with per-tensor descales) and the sparse
bf16 prefill.

Each runs on any device, meta included (no `.item()`, no branch on tensor values), and in float32.
Slow and memory-hungry by design: they are the yardsticks for the real kernels at small sizes,
not fast paths. Every lse is a natural log.
"""

from __future__ import annotations

import torch

from mlamem.kernels.base import (
    DENSE_DECODE,
    KV_FORMATS,
    SPARSE_DECODE,
    SPARSE_PREFILL,
    Capabilities,
    KernelContract,
    OpInputs,
    Problem,
    operation_names,
)
from mlamem.kernels.fp8_ds_mla import dequantize

QUERY_CHUNK = 256  # queries attended at once, to bound the gathered-KV temporary
KEY_CHUNK = 4096  # context tokens of the dense decode attended at once, to bound the scores


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


def _dequantized(x, descale):
    """`x` in float32, times `descale` ((1,) float32) when given; an fp8 `x` needs one."""
    if x.dtype == torch.float8_e4m3fn and descale is None:
        raise ValueError("a float8_e4m3fn input needs its descale, a (1,) float32 tensor")
    return x.float() if descale is None else x.float() * descale.float()


def dense_mla_decode_reference(q, kv_cache, block_table, seqlens, *, sm_scale: float, d_v: int,
                               descale_q=None, descale_k=None):
    """out (b, s_q, h_q, d_v) bf16 and lse (b, h_q, s_q) fp32 for the dense paged MLA decode.

    - q: (b, s_q, h_q, d_qk = 576), bfloat16, or float8_e4m3fn multiplied by `descale_q`, a (1,)
      float32 tensor;
    - kv_cache: (num_blocks, block_size, 1, 576), bfloat16, or float8_e4m3fn multiplied by
      `descale_k` (1,); token j of request i is at block `block_table[i, j // block_size]`,
      offset `j % block_size`. K is all 576 dims, V the first `d_v` of the same latent;
    - block_table: (b, max_blocks) int32 block ids; entries past a request's last used block are
      never read, whatever they hold;
    - seqlens: (b,) int32 context lengths in tokens, each at most max_blocks * block_size.

    Not causal: every query of request i attends all of its seqlens[i] tokens, and tokens past
    seqlens[i] (the rest of its last block, NaN or not) count for nothing. A request of length 0
    gets out = 0 and lse = -inf. The context is attended KEY_CHUNK tokens at a time, each chunk
    merged into a running (out, lse), so the scores stay (QUERY_CHUNK, h_q, KEY_CHUNK) at most.
    """
    b, s_q, h_q, d_qk = q.shape
    block_size = kv_cache.shape[1]
    max_blocks = block_table.shape[1]
    step = max(1, KEY_CHUNK // block_size)  # blocks per key chunk
    out = torch.empty((b, s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    for batch in range(b):
        seqlen = seqlens[batch].long()  # a 0-dim tensor: compared, never read on the host
        acc = torch.zeros((s_q, h_q, d_v), dtype=torch.float32, device=q.device)
        run_lse = torch.full((s_q, h_q), float("-inf"), dtype=torch.float32, device=q.device)
        for first in range(0, max_blocks, step):
            last = min(first + step, max_blocks)
            used = torch.arange(first, last, device=q.device) * block_size < seqlen
            blocks = block_table[batch, first:last].long().masked_fill(~used, 0)
            valid = torch.arange(first * block_size, last * block_size, device=q.device) < seqlen
            keys = _dequantized(kv_cache[blocks].reshape(-1, d_qk), descale_k)  # (t, 576)
            keys = keys.masked_fill(~valid[:, None], 0.0)
            for start in range(0, s_q, QUERY_CHUNK):
                stop = min(start + QUERY_CHUNK, s_q)
                queries = _dequantized(q[batch, start:stop], descale_q)  # (n, h, 576)
                scores = torch.einsum("nhd,td->nht", queries, keys) * sm_scale
                scores = scores.masked_fill(~valid, float("-inf"))
                chunk_lse = torch.logsumexp(scores, dim=-1)  # (n, h)
                probs = torch.exp(scores - chunk_lse.unsqueeze(-1)).nan_to_num(0.0)
                chunk_out = torch.einsum("nht,td->nhd", probs, keys[:, :d_v])
                old_lse = run_lse[start:stop]
                new_lse = torch.logaddexp(old_lse, chunk_lse)
                keep = torch.exp(old_lse - new_lse).nan_to_num(0.0).unsqueeze(-1)
                take = torch.exp(chunk_lse - new_lse).nan_to_num(0.0).unsqueeze(-1)
                acc[start:stop] = acc[start:stop] * keep + chunk_out * take
                run_lse[start:stop] = new_lse
        out[batch] = acc.to(torch.bfloat16)
        lse[batch] = run_lse.T
    return out, lse


def sparse_mla_prefill_reference(q, kv, indices, *, sm_scale: float, d_v: int):
    """out (s_q, h_q, d_v) bf16, max_logits (s_q, h_q) fp32 and lse (s_q, h_q) fp32 for the
    sparse bf16 MLA prefill.

    - q: (s_q, h_q, d_qk = 576) bfloat16;
    - kv: (s_kv, 1, 576) bfloat16; K is all 576 dims, V the first `d_v`;
    - indices: (s_q, 1, topk) int32 into kv's tokens. As in FlashMLA's prefill, an index is
      invalid when it is -1 or >= s_kv (any negative one is treated the same) and is skipped.

    max_logits is the largest scaled score (q . k * sm_scale) over a query's valid indices, lse
    the natural-log log-sum-exp of those scores. A row with no valid index gets out = 0 and
    max_logits = lse = -inf.
    """
    s_q, h_q, d_qk = q.shape
    s_kv = kv.shape[0]
    tokens = kv.reshape(s_kv, d_qk)  # h_kv must be 1
    picks = indices.reshape(s_q, indices.shape[-1])  # (s_q, topk); h_kv must be 1
    out = torch.empty((s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    for start in range(0, s_q, QUERY_CHUNK):
        stop = min(start + QUERY_CHUNK, s_q)
        idx = picks[start:stop].long()  # (n, topk)
        valid = (idx >= 0) & (idx < s_kv)
        keys = tokens[idx.masked_fill(~valid, 0)].float()  # (n, topk, 576)
        keys = keys.masked_fill(~valid.unsqueeze(-1), 0.0)
        scores = torch.einsum("nhd,nkd->nhk", q[start:stop].float(), keys) * sm_scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # (n, h)
        probs = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
        out[start:stop] = torch.einsum("nhk,nkd->nhd", probs, keys[..., :d_v]).to(torch.bfloat16)
        max_logits[start:stop] = scores.amax(dim=-1)
        lse[start:stop] = row_lse
    return out, max_logits, lse


class Reference(KernelContract):
    """The plain-torch reference as a kernel adapter, for every operation."""

    name = "reference"
    label = "torch reference"
    runs_on_meta = True
    operations = operation_names()  # every shipped operation

    def unavailable_reason(self) -> str | None:
        """Runs anywhere, but a measurement needs the CUDA allocator."""
        import torch

        return None if torch.cuda.is_available() else "no CUDA device"

    def capabilities(self, op: str = SPARSE_DECODE, kv_format: str | None = None) -> Capabilities:
        if op not in self.operations:
            raise ValueError(f"{self.label} does not run {op}")
        heads = (64, 128) if op == SPARSE_DECODE else (8, 16, 32, 64, 128)
        return Capabilities(takes_out=False, takes_lse=False, takes_accum_workspace=False,
                            head_counts=heads, source="plain torch, mirrors FlashMLA's heads",
                            kv_formats=(kv_format,) if kv_format else KV_FORMATS[op])

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None, **staged):
        if out is not None or staged:
            raise TypeError("the reference takes no out= argument")
        if problem.op == DENSE_DECODE:
            return dense_mla_decode_reference(
                q, inputs.kv, inputs.block_table, inputs.seqlens, sm_scale=problem.sm_scale,
                d_v=problem.d_v, descale_q=inputs.descale_q, descale_k=inputs.descale_k)
        if problem.op == SPARSE_PREFILL:
            out, _, lse = sparse_mla_prefill_reference(q, inputs.kv, inputs.indices,
                                                       sm_scale=problem.sm_scale, d_v=problem.d_v)
            return out, lse
        return sparse_mla_decode_reference(q, inputs.kv, inputs.indices, sm_scale=problem.sm_scale,
                                           d_v=problem.d_v)

    def allocations(self, problem: Problem, sm_count: int) -> list:
        """No spec: the reference runs on the meta device itself, and its many temporaries
        show up in a breakdown as unattributed."""
        return []
