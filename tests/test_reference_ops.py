"""The plain-torch references of the dense paged MLA decode and the sparse MLA prefill, against
per-query, per-head float64 loops written from the definitions, on the CPU and the meta device."""

import math

import pytest
import torch

from mlamem.kernels import reference
from mlamem.kernels.reference import dense_mla_decode_reference, sparse_mla_prefill_reference

D_QK, D_V = 576, 512
SM_SCALE = 1 / math.sqrt(192)
FP8 = torch.float8_e4m3fn
# (QUERY_CHUNK, KEY_CHUNK): one chunk of each at these sizes, and one query and one 16-token
# block at a time, so the running (out, lse) merge of the dense decode is exercised too.
CHUNKINGS = [pytest.param(256, 4096, id="one-chunk"), pytest.param(1, 16, id="tiny-chunks")]


def naive_attention(queries, keys, sm_scale):
    """out (h, 512), max score (h,) and lse (h,) of one query (h, 576) over keys (t, 576), in
    float64 with torch.softmax, one head at a time; no key gives 0, -inf, -inf."""
    h_q = queries.shape[0]
    out = torch.zeros(h_q, D_V, dtype=torch.float64)
    top = torch.full((h_q,), float("-inf"), dtype=torch.float64)
    lse = torch.full((h_q,), float("-inf"), dtype=torch.float64)
    if keys.shape[0] == 0:
        return out, top, lse
    k = keys.double()
    for h in range(h_q):
        scores = (k @ queries[h].double()) * sm_scale
        top[h] = scores.max()
        lse[h] = torch.logsumexp(scores, 0)
        out[h] = torch.softmax(scores, 0) @ k[:, :D_V]
    return out, top, lse


def naive_dense_decode(q, kv_cache, block_table, seqlens, sm_scale):
    """out (b, s_q, h_q, 512) and lse (b, h_q, s_q) in float64: each request's tokens looked up
    one by one through its block table, every query attending all of them."""
    b, s_q, h_q, _ = q.shape
    block_size = kv_cache.shape[1]
    out = torch.zeros(b, s_q, h_q, D_V, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), float("-inf"), dtype=torch.float64)
    for i in range(b):
        tokens = [kv_cache[int(block_table[i, j // block_size]), j % block_size, 0]
                  for j in range(int(seqlens[i]))]
        keys = torch.stack(tokens).double() if tokens else torch.zeros(0, D_QK)
        for t in range(s_q):
            out[i, t], _, lse[i, :, t] = naive_attention(q[i, t].double(), keys, sm_scale)
    return out, lse


def naive_sparse_prefill(q, kv, indices, sm_scale):
    """out (s_q, h_q, 512), max_logits and lse (s_q, h_q) in float64: each query attends the
    tokens its indices name, -1 and indices >= s_kv skipped."""
    s_q, h_q, _ = q.shape
    s_kv = kv.shape[0]
    out = torch.zeros(s_q, h_q, D_V, dtype=torch.float64)
    top = torch.full((s_q, h_q), float("-inf"), dtype=torch.float64)
    lse = torch.full((s_q, h_q), float("-inf"), dtype=torch.float64)
    for t in range(s_q):
        chosen = [kv[i, 0] for i in indices[t, 0].tolist() if 0 <= i < s_kv]
        keys = torch.stack(chosen) if chosen else torch.zeros(0, D_QK)
        out[t], top[t], lse[t] = naive_attention(q[t], keys, sm_scale)
    return out, top, lse


def paged_inputs(seed, seqlens, *, block_size=16, max_blocks=4, num_blocks=16, b_s_q_h=(2, 4)):
    """q (b, s_q, h_q, 576) and kv_cache (num_blocks, block_size, 1, 576) standard normal bf16,
    a block table of distinct shuffled block ids, and the int32 seqlens."""
    gen = torch.Generator().manual_seed(seed)
    s_q, h_q = b_s_q_h
    b = len(seqlens)
    q = torch.randn(b, s_q, h_q, D_QK, generator=gen).to(torch.bfloat16)
    kv_cache = torch.randn(num_blocks, block_size, 1, D_QK, generator=gen).to(torch.bfloat16)
    block_table = torch.randperm(num_blocks, generator=gen)[:b * max_blocks].reshape(
        b, max_blocks).to(torch.int32)
    return q, kv_cache, block_table, torch.tensor(seqlens, dtype=torch.int32)


def close(actual, expected, seed, tol):
    """assert_close in float64 with the seed in the message."""
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol,
                               msg=lambda detail: f"{detail} (seed {seed})")


@pytest.mark.parametrize(("query_chunk", "key_chunk"), CHUNKINGS)
def test_dense_decode_matches_the_definition(seed, monkeypatch, query_chunk, key_chunk):
    """Dense decode out and lse equal the naive loop's, whatever the query and key chunking."""
    monkeypatch.setattr(reference, "QUERY_CHUNK", query_chunk)
    monkeypatch.setattr(reference, "KEY_CHUNK", key_chunk)
    q, kv_cache, block_table, seqlens = paged_inputs(seed, [37, 64, 1])
    out, lse = dense_mla_decode_reference(q, kv_cache, block_table, seqlens, sm_scale=SM_SCALE,
                                          d_v=D_V)
    assert out.shape == (3, 2, 4, D_V) and out.dtype == torch.bfloat16
    assert lse.shape == (3, 4, 2) and lse.dtype == torch.float32
    ref_out, ref_lse = naive_dense_decode(q, kv_cache, block_table, seqlens, SM_SCALE)
    close(out, ref_out, seed, 1e-2)
    close(lse, ref_lse, seed, 1e-4)


def test_dense_decode_follows_the_block_table(seed):
    """Permuting the cache's blocks and renaming them in the table alike changes nothing; permuting
    the cache alone does."""
    q, kv_cache, block_table, seqlens = paged_inputs(seed, [50, 23])
    args = {"sm_scale": SM_SCALE, "d_v": D_V}
    out, lse = dense_mla_decode_reference(q, kv_cache, block_table, seqlens, **args)
    perm = torch.randperm(kv_cache.shape[0], generator=torch.Generator().manual_seed(seed + 1))
    moved = torch.empty_like(kv_cache)
    moved[perm] = kv_cache  # block k now lives at perm[k]
    out2, lse2 = dense_mla_decode_reference(q, moved, perm[block_table.long()].to(torch.int32),
                                            seqlens, **args)
    assert torch.equal(out2, out) and torch.equal(lse2, lse), f"seed {seed}"
    out3, _ = dense_mla_decode_reference(q, moved, block_table, seqlens, **args)
    assert not torch.equal(out3, out), f"the table was not followed (seed {seed})"


def test_dense_decode_ignores_tokens_past_seqlen(seed):
    """Tokens past seqlens (NaN in the last block, or unused table entries naming no block) do not
    count; a request of length 0 gets out 0 and lse -inf."""
    q, kv_cache, block_table, seqlens = paged_inputs(seed, [21, 0, 16])
    args = {"sm_scale": SM_SCALE, "d_v": D_V}
    # only the used blocks in a table of exactly that capacity: the answer to match
    out, lse = dense_mla_decode_reference(q, kv_cache, block_table[:, :2], seqlens, **args)
    poisoned = kv_cache.clone()
    poisoned[block_table[0, 1], 21 - 16:] = float("nan")  # rest of request 0's last block
    poisoned[block_table[:, 2:].long()] = float("nan")  # blocks past every request's end
    poisoned[block_table[1].long()] = float("nan")  # the empty request's blocks
    poisoned[block_table[2, 1]] = float("nan")  # request 2 ends exactly at a block boundary
    table = block_table.clone()
    table[:, 2] = -1
    table[:, 3] = 10**6
    out2, lse2 = dense_mla_decode_reference(q, poisoned, table, seqlens, **args)
    assert not out2.isnan().any() and not lse2.isnan().any(), f"seed {seed}"
    close(out2, out, seed, 1e-6)  # a wider table only changes the float summation order
    close(lse2, lse, seed, 1e-6)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(lse[1], torch.full_like(lse[1], float("-inf")))
    ref_out, ref_lse = naive_dense_decode(q, kv_cache, block_table, seqlens, SM_SCALE)
    close(out, ref_out, seed, 1e-2)
    close(lse, ref_lse, seed, 1e-4)


def test_dense_decode_fp8_is_the_bf16_path_on_exactly_dequantized_values(seed):
    """With power-of-two descales, fp8 q and cache give exactly what bf16 q * descale_q and
    cache * descale_k give (fp8 times a power of two is exact in bf16)."""
    q, kv_cache, block_table, seqlens = paged_inputs(seed, [40, 7])
    q8, kv8 = (q * 8).to(FP8), (kv_cache * 4).to(FP8)
    descale_q, descale_k = torch.tensor([0.125]), torch.tensor([0.25])
    args = {"sm_scale": SM_SCALE, "d_v": D_V}
    out, lse = dense_mla_decode_reference(q8, kv8, block_table, seqlens, descale_q=descale_q,
                                          descale_k=descale_k, **args)
    q_bf16 = (q8.float() * 0.125).to(torch.bfloat16)
    kv_bf16 = (kv8.float() * 0.25).to(torch.bfloat16)
    assert torch.equal(q_bf16.float(), q8.float() * 0.125)  # the premise: no rounding
    out2, lse2 = dense_mla_decode_reference(q_bf16, kv_bf16, block_table, seqlens, **args)
    assert torch.equal(out, out2) and torch.equal(lse, lse2), f"seed {seed}"
    _, lse_undescaled = dense_mla_decode_reference(q8, kv8, block_table, seqlens,
                                                   descale_q=torch.ones(1),
                                                   descale_k=torch.ones(1), **args)
    assert not torch.allclose(lse_undescaled, lse), "the descales changed nothing"


def test_dense_decode_fp8_descales_fold_into_scale_and_values(seed):
    """With any descales sq and sk, fp8 out equals sk x the bf16 path's out at sm_scale * sq * sk on
    the raw fp8 values, and lse equals its lse, within float rounding."""
    q, kv_cache, block_table, seqlens = paged_inputs(seed, [40, 7])
    q8, kv8 = (q * 20).to(FP8), (kv_cache * 30).to(FP8)
    sq, sk = 0.0517, 0.0331
    out, lse = dense_mla_decode_reference(q8, kv8, block_table, seqlens, sm_scale=SM_SCALE,
                                          d_v=D_V, descale_q=torch.tensor([sq]),
                                          descale_k=torch.tensor([sk]))
    raw_out, raw_lse = dense_mla_decode_reference(
        q8.to(torch.bfloat16), kv8.to(torch.bfloat16), block_table, seqlens,
        sm_scale=SM_SCALE * sq * sk, d_v=D_V)
    close(out, raw_out.double() * sk, seed, 1e-2)
    close(lse, raw_lse, seed, 1e-4)
    ref_out, ref_lse = naive_dense_decode(q8.double() * sq, kv8.double() * sk, block_table,
                                          seqlens, SM_SCALE)
    close(out, ref_out, seed, 1e-2)
    close(lse, ref_lse, seed, 1e-4)


def test_dense_decode_fp8_without_descale_is_refused():
    """An fp8 input without its descale is an error, not a silent scale of 1."""
    q, kv_cache, block_table, seqlens = paged_inputs(0, [5])
    with pytest.raises(ValueError, match="descale"):
        dense_mla_decode_reference(q, kv_cache.to(FP8), block_table, seqlens, sm_scale=SM_SCALE,
                                   d_v=D_V)


def test_dense_decode_runs_on_meta():
    """On the meta device, bf16 and fp8 alike, the dense decode gives out and lse of the right
    shapes, dtypes and device."""
    meta = torch.device("meta")
    b, s_q, h_q, blocks, block_size = 3, 2, 128, 8, 64
    for dtype, descale in ((torch.bfloat16, None), (FP8, torch.ones(1, device=meta))):
        q = torch.empty(b, s_q, h_q, D_QK, dtype=dtype, device=meta)
        kv_cache = torch.empty(20, block_size, 1, D_QK, dtype=dtype, device=meta)
        table = torch.empty(b, blocks, dtype=torch.int32, device=meta)
        seqlens = torch.empty(b, dtype=torch.int32, device=meta)
        out, lse = dense_mla_decode_reference(q, kv_cache, table, seqlens, sm_scale=SM_SCALE,
                                              d_v=D_V, descale_q=descale, descale_k=descale)
        assert out.device == meta and out.shape == (b, s_q, h_q, D_V)
        assert out.dtype == torch.bfloat16
        assert lse.device == meta and lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32


def prefill_inputs(seed, s_q=6, h_q=8, s_kv=50, topk=16):
    """q (s_q, h_q, 576) and kv (s_kv, 1, 576) standard normal bf16, and indices (s_q, 1, topk)
    int32 with a quarter invalid (-1, s_kv or beyond), row 2 all invalid."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h_q, D_QK, generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, D_QK, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32, generator=gen)
    indices[:, :, 1::4] = -1
    indices[:, :, 2::8] = s_kv
    indices[:, :, 6::8] = s_kv + 1000
    indices[2] = torch.tensor([-1, s_kv, s_kv + 3, 2**31 - 1] * (topk // 4))
    return q, kv, indices


@pytest.mark.parametrize("query_chunk", [256, 1])
def test_sparse_prefill_matches_the_definition(seed, monkeypatch, query_chunk):
    """Sparse prefill out, max_logits and lse equal the naive loop's, invalid indices skipped."""
    monkeypatch.setattr(reference, "QUERY_CHUNK", query_chunk)
    q, kv, indices = prefill_inputs(seed)
    out, max_logits, lse = sparse_mla_prefill_reference(q, kv, indices, sm_scale=SM_SCALE,
                                                        d_v=D_V)
    assert out.shape == (6, 8, D_V) and out.dtype == torch.bfloat16
    assert max_logits.shape == (6, 8) and max_logits.dtype == torch.float32
    assert lse.shape == (6, 8) and lse.dtype == torch.float32
    ref_out, ref_max, ref_lse = naive_sparse_prefill(q, kv, indices, SM_SCALE)
    close(out, ref_out, seed, 1e-2)
    close(max_logits, ref_max, seed, 1e-4)
    close(lse, ref_lse, seed, 1e-4)


def test_sparse_prefill_invalid_indices_count_for_nothing(seed):
    """Turning valid indices into -1 or >= s_kv equals dropping those tokens; a row with no valid
    index gets out 0 and max_logits = lse = -inf, with no NaN anywhere."""
    q, kv, indices = prefill_inputs(seed)
    s_kv = kv.shape[0]
    args = {"sm_scale": SM_SCALE, "d_v": D_V}
    out, max_logits, lse = sparse_mla_prefill_reference(q, kv, indices, **args)
    assert not out.isnan().any() and not lse.isnan().any() and not max_logits.isnan().any()
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.equal(lse[2], torch.full_like(lse[2], float("-inf")))
    assert torch.equal(max_logits[2], torch.full_like(max_logits[2], float("-inf")))
    # every invalid index spelled as -1 instead: the same answer
    as_minus_one = indices.masked_fill((indices < 0) | (indices >= s_kv), -1)
    again = sparse_mla_prefill_reference(q, kv, as_minus_one, **args)
    assert all(torch.equal(a, b) for a, b in zip(again, (out, max_logits, lse), strict=True))
    # the valid ones alone, as a shorter topk, where every row has one: the same answer
    rows = [r for r in range(q.shape[0]) if r != 2]
    valid = [[i for i in indices[r, 0].tolist() if 0 <= i < s_kv] for r in rows]
    width = min(map(len, valid))
    assert width > 0
    for r, kept in zip(rows, valid, strict=True):
        short = torch.tensor(kept, dtype=torch.int32).reshape(1, 1, -1)
        one_out, one_max, one_lse = sparse_mla_prefill_reference(q[r:r + 1], kv, short, **args)
        # another topk width sums in another order: bf16 out may round one ulp (2^-7) apart
        torch.testing.assert_close(one_out[0].double(), out[r].double(), rtol=2 ** -7, atol=1e-6,
                                   msg=lambda detail: f"{detail} (seed {seed})")
        close(one_max[0], max_logits[r], seed, 1e-6)
        close(one_lse[0], lse[r], seed, 1e-5)


def test_sparse_prefill_runs_on_meta():
    """On the meta device the sparse prefill gives out, max_logits and lse of the right shapes,
    dtypes and device."""
    meta = torch.device("meta")
    s_q, h_q, s_kv, topk = 300, 128, 4096, 2048
    q = torch.empty(s_q, h_q, D_QK, dtype=torch.bfloat16, device=meta)
    kv = torch.empty(s_kv, 1, D_QK, dtype=torch.bfloat16, device=meta)
    indices = torch.empty(s_q, 1, topk, dtype=torch.int32, device=meta)
    out, max_logits, lse = sparse_mla_prefill_reference(q, kv, indices, sm_scale=SM_SCALE,
                                                        d_v=D_V)
    assert out.device == meta and out.shape == (s_q, h_q, D_V) and out.dtype == torch.bfloat16
    for t in (max_logits, lse):
        assert t.device == meta and t.shape == (s_q, h_q) and t.dtype == torch.float32
