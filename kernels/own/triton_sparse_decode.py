"""Triton kernels of the sparse fp8 MLA decode over an fp8_ds_mla cache (d_qk 576, d_v 512), the
launch configs and designs (`LaunchConfig`), and the choice between them and the Gluon kernel
(`runnable_config`).

Imports triton; `mlamem.kernels.own.triton_decode` imports this module only when a call runs, so
the package works without triton. These functions allocate nothing: every buffer is passed in.

One attention program handles one (batch, query position, block of heads, KV split): 64
heads, or all of a rank's 8, 16 or 32 heads for the native-head kernel. A block of fewer than 16
heads is padded to 16 rows in registers (a tl.dot needs 16), never in memory. It walks
its share of the topk indices BLOCK_N tokens at a time: gathers the 656-byte rows; dequantizes
the NoPE latent to bf16 (each fp8 value times its 128-group's fp32 scale, in fp32, rounded once
to bf16); computes the scores q·kᵀ as one 512-wide NoPE dot plus the RoPE dot; runs the online
softmax in base 2; and adds p·V into one (64, 512) fp32 accumulator, V being the same
dequantized NoPE tile (the "scaled" design; the "folded-f16" one converts the fp8 values exactly
and moves the scales onto the scores and p, one dot per 128-group). Whole-tile dots (3 per step,
where one per 128-group took 9) made the scaled call 1.8x faster at block_n 64 on an H200 and
let bigger tiles pay (reports/triton-h200).

Without a split the program writes out (bf16) and lse (natural log) itself. With a split it
writes its normalised partial out and base-2 lse into the accumulators, and the combine kernel
merges the splits of each (batch, position).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mlamem.kernels.fp8_ds_mla import GROUP, NOPE_DIM, ROPE_BYTE, ROPE_DIM, SCALES_BYTE
from mlamem.kernels.own.tiles import DEFAULT_BLOCK_N, HEAD_BLOCK, LN2, LOG2E, block_heads, head_blocks  # noqa: F401

COMBINE_HEADS = 16  # heads per combine program
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter runs the kernels


GLUON_DESIGNS = {  # design -> launch_gluon's keyword arguments
    "gluon-bf16-scale": {"prefetch_indices": True, "bf16_scale": True},
    "gluon": {},
}
DESIGNS = ("scaled", "folded-f16", *GLUON_DESIGNS)


@dataclass(frozen=True)
class LaunchConfig:
    """Design, tile and launch parameters of the attention kernel.

    design: where the per-128 fp8 scales are applied, and which kernel runs.
      scaled       each fp8 value times its scale, rounded to bf16 (FlashMLA's way): one 512-wide
                   q·kᵀ dot and one p·V dot per step on the dequantized tile.
      folded-f16   the fp8 values converted exactly to f16 (one instruction per pair), unscaled;
                   the scales go to the scores' columns (one q·kᵀ dot per 128-group) and into p
                   (one p·V dot per group): p times the scale times 2^8 rounded to f16 (the
                   accumulator divided by 2^8 at the end). q is read again each step (L1 hits)
                   rather than held in registers, converted to f16 (exact within f16's range,
                   |q| < 65504).
      gluon-bf16-scale  the warp-specialized Gluon kernel (kernels/own/gluon_sparse_decode.py):
                   producer warps gather and dequantize into a shared-memory ring while two
                   consumer warpgroups run the wgmmas and the softmax; SM90 only, no split,
                   block_n 64. Each step's indices are loaded one step ahead (a gather waits on
                   one memory round trip, not two), and the dequantization is FlashMLA's: the
                   scale rounded to bf16, the product in bf16, 4 producer instructions per pair
                   of values; K equals FlashMLA's dequantized K. The default.
      gluon        the same kernel as first written, the default before gluon-bf16-scale: the
                   indices loaded in the step, the scaled design's rounding.
    """

    block_n: int = DEFAULT_BLOCK_N  # KV tokens per loop step (a multiple of 16)
    num_warps: int = 8
    num_stages: int = 1
    design: str = "scaled"
    max_registers: int | None = None  # per thread (ptxas maxnreg): 168 lets 3 4-warp programs share an SM

    def __post_init__(self):
        if self.design not in DESIGNS:
            raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {self.design!r}")

    @property
    def label(self) -> str:
        return (f"{self.design} block_n={self.block_n} warps={self.num_warps} "
                f"stages={self.num_stages}"
                + (f" maxnreg={self.max_registers}" if self.max_registers else ""))


# What a call asks for, at every head count: on the H200 it ran at 0.889-0.896x FlashMLA's
# padded call at 16 native heads, where gluon ran at 0.845-0.851x, its out within 4.6e-5
# relative L2 of FlashMLA's (benchmarks/triton_vs_flashmla.py --lse).
DEFAULT_CONFIG = LaunchConfig(block_n=64, num_warps=8, design="gluon-bf16-scale")
# Triton fallbacks, where the Gluon kernel cannot run (no SM90, no Gluon, or a call that splits
# the topk): each the fastest of its head count in the H200 sweep
# (benchmarks/triton_vs_flashmla.py --sweep, reports/native-h200).
FALLBACK_CONFIG = LaunchConfig()  # 64 heads and more: 12.9 ms at T=8192, L2 pool
NATIVE_FALLBACK_CONFIG = LaunchConfig(block_n=32, num_warps=4, num_stages=2, design="folded-f16",
                                      max_registers=168)  # 8 and 16 heads: 11.0 ms
F16_P_SCALE = 256.0  # folded-f16: p * scale * 2^8 keeps p's small values out of f16 subnormals


def fallback_config(heads: int) -> LaunchConfig:
    """The Triton config a call at `heads` query heads runs where the Gluon kernel cannot."""
    return FALLBACK_CONFIG if heads >= HEAD_BLOCK else NATIVE_FALLBACK_CONFIG


def gluon_unavailable_reason(device: torch.device) -> str | None:
    """None where the Gluon kernel runs on device; else why not, in one line."""
    if INTERPRETED or device.type != "cuda":
        return "the Gluon kernel runs only on a CUDA GPU (not in Triton's interpreter)"
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        return (f"the Gluon kernel is written for SM90 (wgmma, setmaxnreg); this GPU is "
                f"SM{capability[0]}{capability[1]}")
    try:
        from mlamem.kernels.own import gluon_sparse_decode
    except Exception as exc:  # a triton without Gluon's Hopper API
        return (f"triton {triton.__version__} has no usable Gluon "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    offered = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin",
                      None)
    if offered is not None and offered < gluon_sparse_decode.SHARED_LIMIT:
        return (f"the Gluon kernel needs {gluon_sparse_decode.SHARED_LIMIT // 1024} KiB of shared "
                f"memory per program; this GPU offers {offered // 1024} KiB")
    return None


def runnable_config(config: LaunchConfig, heads: int, device: torch.device,
                    splits: bool) -> tuple[LaunchConfig, str | None]:
    """(the config the call runs, why it is not `config`, or None). A Gluon design falls back
    to the Triton kernel where Gluon cannot run or the call splits the topk (the Gluon kernel
    has no split: a call whose programs do not fill the SMs)."""
    if config.design not in GLUON_DESIGNS:
        return config, None
    reason = gluon_unavailable_reason(device)
    if reason is None and splits:
        reason = ("the call's programs do not fill the SMs, so it splits the topk, and the Gluon "
                  "kernel has no split")
    return (config, None) if reason is None else (fallback_config(heads), reason)


def shared_bytes(config: LaunchConfig, heads: int = HEAD_BLOCK) -> int:
    """Shared memory per attention program: the q tile and one dequantized K tile, in bf16
    (what Triton 3.6 allocates for SM90: 221,184 B at block_n 128 and 64 heads)."""
    return (block_heads(heads) + config.block_n) * (NOPE_DIM + ROPE_DIM) * 2


@triton.jit
def _mma(x, UPCAST: tl.constexpr):
    """x as a tl.dot operand: bf16 on the GPU; fp32 (same values) in Triton's interpreter,
    whose tl.dot multiplies bf16 as raw uint16 bits."""
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _round_bf16(x, UPCAST: tl.constexpr):
    """fp32 x rounded to bf16 (to nearest, ties to even) as a tl.dot operand. In Triton's
    interpreter, whose casts to bf16 truncate, the same values held in fp32."""
    if UPCAST:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _fp8_as_f16(raw, UPCAST: tl.constexpr):
    """fp8 e4m3 bytes as f16 dot operands, exactly (no scale); fp32 in the interpreter."""
    values = raw.to(tl.float8e4nv, bitcast=True)
    if UPCAST:
        return values.to(tl.float32)
    return values.to(tl.float16)


@triton.jit
def _tile_tokens(idx_row, offs, stop, block_size, kv_stride_block, kv_stride_slot):
    """(valid, byte offset of each token's row) for the topk positions offs."""
    idx = tl.load(idx_row + offs, mask=offs < stop, other=-1)
    valid = idx >= 0
    token = tl.where(valid, idx, 0).to(tl.int64)
    return valid, (token // block_size) * kv_stride_block + (token % block_size) * kv_stride_slot


@triton.jit
def _load_rope(kv_bf16_ptr, token_bytes, valid, ROPE_BYTE: tl.constexpr, ROPE_DIM: tl.constexpr):
    return tl.load(kv_bf16_ptr + ((token_bytes + ROPE_BYTE) // 2)[:, None]
                   + tl.arange(0, ROPE_DIM)[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def _load_group(kv_bytes_ptr, kv_f32_ptr, token_bytes, valid, g: tl.constexpr,
                GROUP: tl.constexpr, SCALES_BYTE: tl.constexpr):
    """(block_n, GROUP) fp8 bytes of 128-group g and their (block_n,) fp32 scales."""
    raw = tl.load(kv_bytes_ptr + token_bytes[:, None] + g * GROUP + tl.arange(0, GROUP)[None, :],
                  mask=valid[:, None], other=0)
    scale = tl.load(kv_f32_ptr + (token_bytes + SCALES_BYTE) // 4 + g, mask=valid, other=0.0)
    return raw, scale


@triton.jit
def _load_scaled_tile(kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, token_bytes, valid,
                      NOPE_DIM: tl.constexpr, GROUP: tl.constexpr, SCALES_BYTE: tl.constexpr,
                      ROPE_BYTE: tl.constexpr, ROPE_DIM: tl.constexpr):
    """The scaled design's tile: (block_n, NOPE_DIM) fp8 bytes, (block_n, 4) scales, RoPE."""
    raw = tl.load(kv_bytes_ptr + token_bytes[:, None] + tl.arange(0, NOPE_DIM)[None, :],
                  mask=valid[:, None], other=0)
    scales = tl.load(kv_f32_ptr + ((token_bytes + SCALES_BYTE) // 4)[:, None]
                     + tl.arange(0, NOPE_DIM // GROUP)[None, :], mask=valid[:, None], other=0.0)
    return raw, scales, _load_rope(kv_bf16_ptr, token_bytes, valid, ROPE_BYTE, ROPE_DIM)


@triton.jit
def _dequantized(raw, scales, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
                 NOPE_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """(BLOCK_N, NOPE_DIM) bf16 dot operand: each fp8 value times its group's fp32 scale."""
    values = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32),
                        (BLOCK_N, NOPE_DIM // GROUP, GROUP))
    return _round_bf16(tl.reshape(values * scales[:, :, None], (BLOCK_N, NOPE_DIM)), UPCAST)


@triton.jit
def _online_softmax(scores, valid, m_i, l_i, sm_scale_log2):
    """One step of the base-2 online softmax: (p, alpha, new max, new sum)."""
    scores = tl.where(valid[None, :], scores * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: no NaN
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _program(head_blocks, s_q, BLOCK_H: tl.constexpr):
    """(batch, query position, head rows, which rows are real heads) of this program."""
    pid = tl.program_id(0).to(tl.int64)
    head_block = pid % head_blocks
    pos = (pid // head_blocks) % s_q
    batch = pid // (head_blocks * s_q)
    h = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    return batch, pos, h


@triton.jit
def _store_lse(m_i, l_i, batch, pos, h, head, split, s_q, heads, num_splits,
               lse_ptr, lse_accum_ptr, lse_stride_b, lse_stride_h, lse_stride_s,
               SPLIT: tl.constexpr, LN2: tl.constexpr):
    """Stores lse (natural log), or the split's base-2 lse; returns the divisor of out (l_i,
    or 1 for a query with no valid key)."""
    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse_log2 = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
    if SPLIT:
        row = ((batch * num_splits + split) * s_q + pos) * heads + h
        tl.store(lse_accum_ptr + row, lse_log2, mask=head)
    else:
        tl.store(lse_ptr + batch * lse_stride_b + h * lse_stride_h + pos * lse_stride_s,
                 lse_log2 * LN2, mask=head)
    return l_safe


@triton.jit
def _out_rows(batch, pos, h, split, s_q, heads, num_splits, out_ptr, o_accum_ptr,
              out_stride_b, out_stride_s, out_stride_h, NOPE_DIM: tl.constexpr,
              SPLIT: tl.constexpr):
    """Pointer to the first element of each head's output row (out, or the split's o_accum)."""
    if SPLIT:
        rows = o_accum_ptr + (((batch * num_splits + split) * s_q + pos) * heads + h) * NOPE_DIM
    else:
        rows = out_ptr + batch * out_stride_b + pos * out_stride_s + h * out_stride_h
    return rows


@triton.jit
def _sparse_decode_attention(
    q_ptr, kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, indices_ptr,
    out_ptr, lse_ptr, o_accum_ptr, lse_accum_ptr,
    sm_scale_log2, s_q, heads, head_blocks, topk, tokens_per_split, num_splits, block_size,
    q_stride_b, q_stride_s, q_stride_h,
    kv_stride_block, kv_stride_slot,
    idx_stride_b, idx_stride_s,
    out_stride_b, out_stride_s, out_stride_h,
    lse_stride_b, lse_stride_h, lse_stride_s,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, NOPE_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    SCALES_BYTE: tl.constexpr, ROPE_BYTE: tl.constexpr, LN2: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The scaled design: one dequantized (BLOCK_N, 512) bf16 tile per step."""
    batch, pos, h = _program(head_blocks, s_q, BLOCK_H)
    split = tl.program_id(1).to(tl.int64)
    head = h < heads  # rows past the rank's heads: zero q in registers, never stored

    q_rows = q_ptr + batch * q_stride_b + pos * q_stride_s + h[:, None] * q_stride_h
    q_nope = _mma(tl.load(q_rows + tl.arange(0, NOPE_DIM)[None, :], mask=head[:, None],
                          other=0.0), UPCAST)
    q_rope = _mma(tl.load(q_rows + NOPE_DIM + tl.arange(0, ROPE_DIM)[None, :], mask=head[:, None],
                          other=0.0), UPCAST)

    acc = tl.zeros((BLOCK_H, NOPE_DIM), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)  # running max, base 2
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)  # running sum of exp2(score - m_i)

    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, topk)
    idx_row = indices_ptr + batch * idx_stride_b + pos * idx_stride_s
    for step_start in range(0, tokens_per_split, BLOCK_N):  # same trip count in every split
        valid, token_bytes = _tile_tokens(idx_row, start + step_start + tl.arange(0, BLOCK_N),
                                          stop, block_size, kv_stride_block, kv_stride_slot)
        raw, scales, rope = _load_scaled_tile(kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, token_bytes,
                                              valid, NOPE_DIM, GROUP, SCALES_BYTE, ROPE_BYTE,
                                              ROPE_DIM)
        k_nope = _dequantized(raw, scales, BLOCK_N, GROUP, NOPE_DIM, UPCAST)
        scores = tl.dot(q_rope, tl.trans(_mma(rope, UPCAST)), tl.dot(q_nope, tl.trans(k_nope)))
        p, alpha, m_i, l_i = _online_softmax(scores, valid, m_i, l_i, sm_scale_log2)
        acc = tl.dot(_round_bf16(p, UPCAST), k_nope, acc * alpha[:, None])

    l_safe = _store_lse(m_i, l_i, batch, pos, h, head, split, s_q, heads, num_splits, lse_ptr,
                        lse_accum_ptr, lse_stride_b, lse_stride_h, lse_stride_s, SPLIT, LN2)
    o_rows = _out_rows(batch, pos, h, split, s_q, heads, num_splits, out_ptr, o_accum_ptr,
                       out_stride_b, out_stride_s, out_stride_h, NOPE_DIM, SPLIT)
    tl.store(o_rows[:, None] + tl.arange(0, NOPE_DIM)[None, :],
             (acc / l_safe[:, None]).to(o_rows.dtype.element_ty), mask=head[:, None])


@triton.jit
def _folded_group_q(q_rows, head, g: tl.constexpr, GROUP: tl.constexpr, UPCAST: tl.constexpr):
    """q's 128-group g as an f16 dot operand (exact within f16's range)."""
    q = tl.load(q_rows + g * GROUP + tl.arange(0, GROUP)[None, :], mask=head[:, None], other=0.0)
    return _mma(q.to(tl.float16), UPCAST)


@triton.jit
def _store_group(o_rows, acc, l_safe, head, g: tl.constexpr, GROUP: tl.constexpr,
                 P_SCALE: tl.constexpr):
    tl.store(o_rows[:, None] + g * GROUP + tl.arange(0, GROUP)[None, :],
             (acc / (l_safe[:, None] * P_SCALE)).to(o_rows.dtype.element_ty), mask=head[:, None])


@triton.jit
def _folded_decode_attention(
    q_ptr, kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, indices_ptr,
    out_ptr, lse_ptr, o_accum_ptr, lse_accum_ptr,
    sm_scale_log2, s_q, heads, head_blocks, topk, tokens_per_split, num_splits, block_size,
    q_stride_b, q_stride_s, q_stride_h,
    kv_stride_block, kv_stride_slot,
    idx_stride_b, idx_stride_s,
    out_stride_b, out_stride_s, out_stride_h,
    lse_stride_b, lse_stride_h, lse_stride_s,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, NOPE_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    SCALES_BYTE: tl.constexpr, ROPE_BYTE: tl.constexpr, LN2: tl.constexpr,
    UPCAST: tl.constexpr, P_SCALE: tl.constexpr,
):
    """The folded-f16 design: the four 128-groups of fp8 values converted exactly to f16, their
    scales on the scores' columns and in p; one accumulator of (BLOCK_H, 128) per group."""
    batch, pos, h = _program(head_blocks, s_q, BLOCK_H)
    split = tl.program_id(1).to(tl.int64)
    head = h < heads

    q_rows = q_ptr + batch * q_stride_b + pos * q_stride_s + h[:, None] * q_stride_h
    acc0 = tl.zeros((BLOCK_H, GROUP), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_H, GROUP), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_H, GROUP), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_H, GROUP), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, topk)
    idx_row = indices_ptr + batch * idx_stride_b + pos * idx_stride_s
    for step_start in range(0, tokens_per_split, BLOCK_N):
        valid, token_bytes = _tile_tokens(idx_row, start + step_start + tl.arange(0, BLOCK_N),
                                          stop, block_size, kv_stride_block, kv_stride_slot)
        raw0, sc0 = _load_group(kv_bytes_ptr, kv_f32_ptr, token_bytes, valid, 0, GROUP,
                                SCALES_BYTE)
        raw1, sc1 = _load_group(kv_bytes_ptr, kv_f32_ptr, token_bytes, valid, 1, GROUP,
                                SCALES_BYTE)
        raw2, sc2 = _load_group(kv_bytes_ptr, kv_f32_ptr, token_bytes, valid, 2, GROUP,
                                SCALES_BYTE)
        raw3, sc3 = _load_group(kv_bytes_ptr, kv_f32_ptr, token_bytes, valid, 3, GROUP,
                                SCALES_BYTE)
        rope = _load_rope(kv_bf16_ptr, token_bytes, valid, ROPE_BYTE, ROPE_DIM)
        k0 = _fp8_as_f16(raw0, UPCAST)
        k1 = _fp8_as_f16(raw1, UPCAST)
        k2 = _fp8_as_f16(raw2, UPCAST)
        k3 = _fp8_as_f16(raw3, UPCAST)
        # q read again each step (L1 hits), not held in registers across the loop
        q0 = _folded_group_q(q_rows, head, 0, GROUP, UPCAST)
        q1 = _folded_group_q(q_rows, head, 1, GROUP, UPCAST)
        q2 = _folded_group_q(q_rows, head, 2, GROUP, UPCAST)
        q3 = _folded_group_q(q_rows, head, 3, GROUP, UPCAST)
        q_rope = _mma(tl.load(q_rows + NOPE_DIM + tl.arange(0, ROPE_DIM)[None, :],
                              mask=head[:, None], other=0.0), UPCAST)
        scores = tl.dot(q_rope, tl.trans(_mma(rope, UPCAST)))
        scores += tl.dot(q0, tl.trans(k0)) * sc0[None, :]
        scores += tl.dot(q1, tl.trans(k1)) * sc1[None, :]
        scores += tl.dot(q2, tl.trans(k2)) * sc2[None, :]
        scores += tl.dot(q3, tl.trans(k3)) * sc3[None, :]
        p, alpha, m_i, l_i = _online_softmax(scores, valid, m_i, l_i, sm_scale_log2)
        p = p * P_SCALE
        acc0 = tl.dot(_mma((p * sc0[None, :]).to(tl.float16), UPCAST), k0, acc0 * alpha[:, None])
        acc1 = tl.dot(_mma((p * sc1[None, :]).to(tl.float16), UPCAST), k1, acc1 * alpha[:, None])
        acc2 = tl.dot(_mma((p * sc2[None, :]).to(tl.float16), UPCAST), k2, acc2 * alpha[:, None])
        acc3 = tl.dot(_mma((p * sc3[None, :]).to(tl.float16), UPCAST), k3, acc3 * alpha[:, None])

    l_safe = _store_lse(m_i, l_i, batch, pos, h, head, split, s_q, heads, num_splits, lse_ptr,
                        lse_accum_ptr, lse_stride_b, lse_stride_h, lse_stride_s, SPLIT, LN2)
    o_rows = _out_rows(batch, pos, h, split, s_q, heads, num_splits, out_ptr, o_accum_ptr,
                       out_stride_b, out_stride_s, out_stride_h, NOPE_DIM, SPLIT)
    _store_group(o_rows, acc0, l_safe, head, 0, GROUP, P_SCALE)
    _store_group(o_rows, acc1, l_safe, head, 1, GROUP, P_SCALE)
    _store_group(o_rows, acc2, l_safe, head, 2, GROUP, P_SCALE)
    _store_group(o_rows, acc3, l_safe, head, 3, GROUP, P_SCALE)


@triton.jit
def _combine_splits(
    o_accum_ptr, lse_accum_ptr, out_ptr, lse_ptr,
    s_q, heads, num_splits,
    out_stride_b, out_stride_s, out_stride_h,
    lse_stride_b, lse_stride_h, lse_stride_s,
    BLOCK_H: tl.constexpr, D_V: tl.constexpr, LN2: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    pos = pid % s_q
    batch = pid // s_q
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)

    m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    for split in range(num_splits):
        row = ((batch * num_splits + split) * s_q + pos) * heads + h
        m = tl.maximum(m, tl.load(lse_accum_ptr + row))
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D_V), dtype=tl.float32)
    cols = tl.arange(0, D_V)[None, :]
    for split in range(num_splits):
        row = ((batch * num_splits + split) * s_q + pos) * heads + h
        weight = tl.exp2(tl.load(lse_accum_ptr + row) - m_safe)  # 0 for an empty split
        total += weight
        acc += weight[:, None] * tl.load(o_accum_ptr + row[:, None] * D_V + cols)

    has_keys = total > 0
    total_safe = tl.where(has_keys, total, 1.0)
    out_rows = out_ptr + batch * out_stride_b + pos * out_stride_s + h[:, None] * out_stride_h
    tl.store(out_rows + cols, (acc / total_safe[:, None]).to(tl.bfloat16))
    lse = tl.where(has_keys, (m_safe + tl.log2(total_safe)) * LN2, float("-inf"))
    tl.store(lse_ptr + batch * lse_stride_b + h * lse_stride_h + pos * lse_stride_s, lse)


def launch(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
           lse: torch.Tensor, lse_accum: torch.Tensor | None, o_accum: torch.Tensor | None, *,
           sm_scale: float, num_splits: int, tokens_per_split: int,
           config: LaunchConfig | None = None) -> None:
    """Run the decode into the given buffers; allocates nothing.

    q (b, s_q, h_q, 576) bf16; kv_cache (blocks, block_size, 1, 656) uint8; indices
    (b, s_q, topk) int32; out (b, s_q, h_q, 512) bf16; lse (b, h_q, s_q) fp32 (natural log).
    With num_splits > 1: lse_accum and o_accum are contiguous fp32 with at least
    b * num_splits entries of (s_q, h_q) and (s_q, h_q, 512); split i of batch j covers topk
    positions [i * tokens_per_split, (i + 1) * tokens_per_split) and lands in entry
    j * num_splits + i.
    """
    b, s_q, heads, _ = q.shape
    config = config or DEFAULT_CONFIG
    if config.design in GLUON_DESIGNS:
        if num_splits > 1:
            raise ValueError("the Gluon kernel has no split; runnable_config falls back to the "
                             "Triton kernel for a call that splits")
        from mlamem.kernels.own.gluon_sparse_decode import launch_gluon

        launch_gluon(q, kv_cache, indices, out, lse, sm_scale=sm_scale,
                     tokens_per_split=tokens_per_split, **GLUON_DESIGNS[config.design])
        return
    topk = indices.shape[-1]
    kv_bytes = kv_cache.view(torch.uint8)
    split = num_splits > 1
    accum_lse = lse_accum if split else lse  # unused without a split
    accum_o = o_accum if split else out
    grid = (b * s_q * head_blocks(heads), num_splits)
    folded = {} if config.design == "scaled" else {"P_SCALE": F16_P_SCALE}
    kernel = _sparse_decode_attention if config.design == "scaled" else _folded_decode_attention
    kernel[grid](
        q, kv_bytes, kv_bytes.view(torch.float32), kv_bytes.view(torch.bfloat16), indices,
        out, lse, accum_o, accum_lse,
        sm_scale * LOG2E, s_q, heads, head_blocks(heads), topk, tokens_per_split, num_splits,
        kv_cache.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        kv_bytes.stride(0), kv_bytes.stride(1),
        indices.stride(0), indices.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        SPLIT=split, BLOCK_H=block_heads(heads), BLOCK_N=config.block_n,
        GROUP=GROUP, NOPE_DIM=NOPE_DIM, ROPE_DIM=ROPE_DIM,
        SCALES_BYTE=SCALES_BYTE, ROPE_BYTE=ROPE_BYTE, LN2=LN2, UPCAST=INTERPRETED,
        num_warps=config.num_warps, num_stages=config.num_stages, maxnreg=config.max_registers,
        **folded,
    )
    if split:
        combine_heads = min(COMBINE_HEADS, heads)  # 8 heads: one program of 8
        _combine_splits[(b * s_q, heads // combine_heads)](
            o_accum, lse_accum, out, lse, s_q, heads, num_splits,
            out.stride(0), out.stride(1), out.stride(2),
            lse.stride(0), lse.stride(1), lse.stride(2),
            BLOCK_H=combine_heads, D_V=NOPE_DIM, LN2=LN2, num_warps=4,
        )
