"""Warp-specialised Hopper (SM90) sparse fp8 MLA decode in Gluon: the gathers and the
dequantization overlap the MMAs.

It computes what `triton_sparse_decode._sparse_decode_attention` computes without a split (the
"scaled" design): per (batch, query position, block of 64 query rows) one program walks the
whole topk, BLOCK_N tokens a step; each token's 656-byte fp8_ds_mla row is gathered, its 512
NoPE values dequantized to bf16 (fp8 times the fp32 scale of its 128-group, rounded once to
bf16), the scores are q_nope·Kᵀ + q_rope·ropeᵀ, the softmax is the base-2 online one, and
acc += bf16(p)·K (V is the dequantized NoPE tile). The program writes out (bf16) and lse
(natural log; -inf and 0 rows for a query with no valid index).

Head counts: h_q a multiple of 64 (h_q / 64 programs per query position, as before), or 8, 16
or 32 natively (MASK_HEADS): one program of 64 rows (wgmma's M), the rows h >= h_q zero in the
q tile (masked loads, other=0, nothing padded in memory) and never stored (masked out and lse
stores). Those rows run a harmless softmax over zero scores (finite, no NaN). Grid:
b * s_q * max(h_q // 64, 1). Any other h_q: ValueError from launch_args.

Design (FlashMLA's Hopper sparse-fp8 decode shape), one CTA of 12 warps:
  consumer (default partition, 8 warps = 2 warpgroups): stages q in shared memory once, then per
      step waits full[slot]; wgmma q_nope (64x512) x Kᵀ + q_rope (64x64) x ropeᵀ into a (64,
      BLOCK_N) fp32 tile (each warpgroup BLOCK_N / 2 columns); masks and runs the online softmax
      in registers (row max and sum cross the two warpgroups); p -> bf16 as a register A
      operand; wgmma p x K into the (64, 512) fp32 accumulator (each warpgroup 256 columns);
      arrives empty[slot] once both warpgroups' MMAs are done.
  producer (worker partition, 4 warps): per step loads the BLOCK_N indices and gathers the fp8
      bytes (16-byte vectors along each row), the scales and the RoPE values into registers
      *before* waiting for a free slot, so the gather is in flight while the consumer works;
      then waits empty[slot], dequantizes one 128-group at a time into the slot's bf16 K tile,
      stores RoPE and a 0 / -inf key mask, fences (generic -> async proxy) and arrives
      full[slot].
  mbarrier parity as in Gluon's tutorials: step i uses slot i % NUM_BUF and phase
  (i // NUM_BUF) & 1; the producer waits empty with phase ^ 1, which a fresh barrier passes.

Two designs (triton_sparse_decode.GLUON_DESIGNS), both the shape above:
  gluon-bf16-scale (the default; launch_gluon(..., prefetch_indices=True, bf16_scale=True)):
      PREFETCH_INDICES: the producer loads the next step's indices during this step, so a
      gather waits on one memory round trip, not two. BF16_SCALE: FlashMLA's dequantization,
      bf16(bf16(fp8) * bf16(scale)), in 4 instructions per pair of values (_dequantized_bf16);
      the K tile is stored times KEY_SCALE = 2^-32, so q_rope is staged times KEY_SCALE,
      sm_scale_log2 is divided by it and out is divided by it (exact powers of two). On the
      H200 it ran at 0.889-0.896x FlashMLA's padded call at 16 native heads, its out within
      4.6e-5 relative L2 of FlashMLA's.
  gluon (as first written; the default before): the indices loaded in the step, the scaled
      design's rounding, bf16(fp8 * scale); 0.845-0.851x there.

Shared memory per CTA (BLOCK_N 64, NUM_BUF 2; SM90 allows 232,448 B):
  q_nope 64x512 bf16 65,536 + q_rope 64x64 bf16 8,192                        =  73,728
  K ring 2 x 64x512 bf16 131,072 + RoPE ring 2 x 64x64 bf16 16,384            = 147,456
  key masks 2 x 64 fp32 512 + 4 mbarriers 32                                  =     544
  + the compiler's scratch for the p layout change and the cross-warpgroup row reductions.
Registers: 65,536 per SM for 12 warps, so maxnreg 168 (12 x 32 x 168 = 64,512). Triton's
setmaxnreg gives the producer PRODUCER_REGS and the consumer the rest, rounded down to 8:
8 x C + 4 x P <= 12 x 168, so P = 136 -> C = 184. The consumer holds the (64, 512) fp32
accumulator (128 registers per thread), the scores, p and the softmax state: ptxas uses up to
182 of its 184. The producer holds a gathered tile (64 x 656 bytes over 128 threads: 82
registers of data) plus its addresses: up to 134 of 136; at 128 or fewer it spills.
scripts/gluon_compile.py (triton 3.6.0, sm_90a, every h_q the same code but the masks): both
designs at h_q 8, 16, 64: 0 bytes spilled, 226,084 B shared, no wgmma serialisation. (The
prefetched indices alone, without BF16_SCALE's cheaper dequantization, spill 16 B in the
producer.)

Not covered: splits (and the combine), h_q other than 8, 16, 32 or multiples of 64, fp8 MMAs
(the dots are bf16), Triton's interpreter. It cannot run on the CPU;
scripts/gluon_compile.py compiles it ahead of time for sm_90a, and its --check runs every
design against the Triton kernel on an SM90 GPU.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mlamem.kernels.fp8_ds_mla import (
    GROUP,
    NOPE_DIM,
    ROPE_BYTE,
    ROPE_DIM,
    SCALES_BYTE,
)
from mlamem.kernels.own.e4m3_bf16 import E4M3_BITS_AS_BF16, E4M3_TO_BF16_PTX
from mlamem.kernels.own.tiles import LN2, LOG2E

BLOCK_H = 64  # query rows per program: one wgmma M of 64 (heads, or fewer heads and zero rows)
NATIVE_HEADS = (8, 16, 32)  # h_q below BLOCK_H that a program takes, its other rows zero
BLOCK_N = 64  # KV tokens per step
NUM_BUF = 2  # slots in the shared-memory ring
NUM_WARPS = 8  # consumer (default partition): 2 warpgroups
PRODUCER_WARPS = 4
PRODUCER_REGS = 136  # per producer thread (setmaxnreg): the gathered tile in flight without spills
MAX_REGISTERS = 168  # maxnreg of the kernel: 12 warps x 32 lanes x 168 <= 65,536
SHARED_LIMIT = 232_448  # SM90's opt-in shared memory per block
E4M3_TO_BF16 = gl.constexpr(E4M3_TO_BF16_PTX)  # a global a jit function may read
BF16_KEY_SCALE = 2.0**-32  # BF16_SCALE: the power of two K is stored at (see _dequantized_bf16)


@gluon.jit
def _program(head_blocks, s_q):
    """(batch, query position, head block) of this program."""
    pid = gl.program_id(0).to(gl.int64)
    head_block = pid % head_blocks
    pos = (pid // head_blocks) % s_q
    batch = pid // (head_blocks * s_q)
    return batch, pos, head_block


@gluon.jit
def _stage_q(q_ptr, q_nope_smem, q_rope_smem, batch, pos, head_block, heads,
             q_stride_b, q_stride_s, q_stride_h,
             BLOCK_H: gl.constexpr, GROUP: gl.constexpr, NOPE_DIM: gl.constexpr,
             ROPE_DIM: gl.constexpr, MASK_HEADS: gl.constexpr, KEY_SCALE: gl.constexpr = 1.0):
    """q -> shared memory, once: q_nope in bf16, q_rope bf16 times KEY_SCALE (the power of two
    the K tile is stored at, so q_rope·ropeᵀ is on the scale of q_nope·Kᵀ); rows past the
    rank's heads zero (MASK_HEADS)."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    # Plain loads, 8 bf16 = 16 bytes per thread per row piece.
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    q_heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))
    q_rows = (q_ptr + batch * q_stride_b + pos * q_stride_s + q_heads * q_stride_h)[:, None]
    nope_cols = gl.arange(0, NOPE_DIM, layout=gl.SliceLayout(0, q_layout))[None, :]
    rope_cols = NOPE_DIM + gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, q_layout))[None, :]
    if MASK_HEADS:
        head = (q_heads < heads)[:, None]
        q_nope_smem.store(gl.load(q_rows + nope_cols, mask=head, other=0.0).to(q_nope_smem.dtype))
        q_rope = gl.load(q_rows + rope_cols, mask=head, other=0.0)
    else:
        q_nope_smem.store(gl.load(q_rows + nope_cols).to(q_nope_smem.dtype))
        q_rope = gl.load(q_rows + rope_cols)
    if KEY_SCALE != 1.0:
        q_rope = (q_rope.to(gl.float32) * KEY_SCALE).to(gl.bfloat16)  # a power of two: exact
    q_rope_smem.store(q_rope)
    fence_async_shared()  # generic stores -> wgmma (async proxy) reads
    gl.thread_barrier()


@gluon.jit
def _store_lse(lse_ptr, m_i, l_i, batch, pos, head_block, heads, lse_stride_b, lse_stride_h,
               lse_stride_s, layout: gl.constexpr, BLOCK_H: gl.constexpr, LN2: gl.constexpr,
               MASK_HEADS: gl.constexpr):
    """Stores lse (natural log; -inf for a query with no valid key); returns the divisor of
    the accumulator (l_i, or 1 for such a query)."""
    has_keys = l_i > 0
    l_safe = gl.where(has_keys, l_i, 1.0)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    lse_heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=layout)
    lse_rows = lse_ptr + batch * lse_stride_b + lse_heads * lse_stride_h + pos * lse_stride_s
    if MASK_HEADS:
        gl.store(lse_rows, lse, mask=lse_heads < heads)
    else:
        gl.store(lse_rows, lse)
    return l_safe


@gluon.jit
def _store_out(out_ptr, out, col0, batch, pos, head_block, heads,
               out_stride_b, out_stride_s, out_stride_h,
               BLOCK_H: gl.constexpr, MASK_HEADS: gl.constexpr):
    """Stores the bf16 (BLOCK_H, width) tile out at output columns [col0, col0 + width)."""
    layout: gl.constexpr = out.type.layout
    WIDTH: gl.constexpr = out.shape[1]
    out_heads = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
    out_cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    rows = out_ptr + batch * out_stride_b + pos * out_stride_s + out_heads * out_stride_h
    if MASK_HEADS:
        gl.store(rows[:, None] + out_cols[None, :], out, mask=(out_heads < heads)[:, None])
    else:
        gl.store(rows[:, None] + out_cols[None, :], out)


@gluon.jit
def _consumer(q_ptr, out_ptr, lse_ptr, q_nope_smem, q_rope_smem, k_ring, rope_ring, mask_ring,
              full_bars, empty_bars, sm_scale_log2, s_q, heads, head_blocks, num_steps,
              q_stride_b, q_stride_s, q_stride_h,
              out_stride_b, out_stride_s, out_stride_h,
              lse_stride_b, lse_stride_h, lse_stride_s,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, GROUP: gl.constexpr,
              NOPE_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, NUM_BUF: gl.constexpr,
              LN2: gl.constexpr, MASK_HEADS: gl.constexpr, KEY_SCALE: gl.constexpr):
    """The consumer: K is the dequantized bf16 tile times KEY_SCALE (a power of
    two: 1, or BF16_KEY_SCALE with BF16_SCALE), which q_rope is staged at and out divided by;
    launch_args divides sm_scale_log2 by it."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    batch, pos, head_block = _program(head_blocks, s_q)
    _stage_q(q_ptr, q_nope_smem, q_rope_smem, batch, pos, head_block, heads,
             q_stride_b, q_stride_s, q_stride_h, BLOCK_H, GROUP, NOPE_DIM, ROPE_DIM, MASK_HEADS,
             KEY_SCALE)

    # Scores: (BLOCK_H, BLOCK_N), each warpgroup BLOCK_N / 2 columns. Accumulator: (BLOCK_H,
    # NOPE_DIM), each warpgroup NOPE_DIM / 2 columns; p is its A operand, in registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, NUM_WARPS // 4], instr_shape=[16, BLOCK_N * 4 // NUM_WARPS, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, NUM_WARPS // 4], instr_shape=[16, NOPE_DIM * 4 // NUM_WARPS, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_H, NOPE_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, s_rows)  # running max, base 2
    l_i = gl.zeros([BLOCK_H], gl.float32, s_rows)  # running sum of exp2(score - m_i)

    for step in range(num_steps):
        slot = step % NUM_BUF
        mbarrier.wait(full_bars.index(slot), (step // NUM_BUF) & 1)
        k_tile = k_ring.index(slot)  # (BLOCK_N, NOPE_DIM) bf16: K, and V
        rope_tile = rope_ring.index(slot)  # (BLOCK_N, ROPE_DIM) bf16

        s = warpgroup_mma(q_nope_smem, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(q_rope_smem, rope_tile.permute((1, 0)), s, is_async=True)
        key_mask = mask_ring.index(slot).load(gl.SliceLayout(0, s_layout))  # 0, or -inf: invalid
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))

        # The base-2 online softmax of _online_softmax (no valid key yet: m stays -inf, no NaN).
        scores = s * sm_scale_log2 + key_mask[None, :]
        m_new = gl.maximum(m_i, gl.max(scores, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new

        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = warpgroup_mma(p_op, k_tile, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        gl.thread_barrier()  # both warpgroups' MMAs have read the slot
        mbarrier.arrive(empty_bars.index(slot))

    l_safe = _store_lse(lse_ptr, m_i, l_i, batch, pos, head_block, heads, lse_stride_b,
                        lse_stride_h, lse_stride_s, s_rows, BLOCK_H, LN2, MASK_HEADS)
    out = (acc / gl.convert_layout(l_safe * KEY_SCALE, o_rows)[:, None]).to(gl.bfloat16)
    _store_out(out_ptr, out, 0, batch, pos, head_block, heads, out_stride_b, out_stride_s,
               out_stride_h, BLOCK_H, MASK_HEADS)


@gluon.jit
def _dequantized(raw, scale, BF16_SCALE: gl.constexpr, BF16_FACTOR: gl.constexpr):
    """bf16(fp32(fp8 raw) * scale), one scale per row; BF16_SCALE: FlashMLA's rounding, times
    KEY_SCALE (_dequantized_bf16)."""
    if BF16_SCALE:
        return _dequantized_bf16(raw, scale, BF16_FACTOR)
    return (raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, None]).to(gl.bfloat16)


@gluon.jit
def _dequantized_bf16(raw, scale, BF16_FACTOR: gl.constexpr):
    """BF16_SCALE: FlashMLA's dequantization, bf16(bf16(fp8 raw) * bf16(scale)), times the
    power of two KEY_SCALE, in 4 instructions per pair of values instead of 6.

    The e4m3 byte's 7 exponent-and-mantissa bits placed at bf16 bits 10..4 (its sign at 15)
    are the bf16 of fp8 * 2^-120, exactly, subnormals included (prmt replicating the sign,
    shl, and). One bf16x2 multiply by bf16(scale * BF16_FACTOR), BF16_FACTOR = 2^120 *
    KEY_SCALE, then gives bf16(fp8 * bf16(scale)) * KEY_SCALE: FlashMLA's rounding, as powers
    of two are exact (KEY_SCALE = 2^-32 keeps scale * BF16_FACTOR finite for any scale below
    2^39; 2^120 alone would overflow bf16 from scale 2^8 on). The consumer takes KEY_SCALE
    back out."""
    factor = (scale * BF16_FACTOR).to(gl.bfloat16)
    return gl.inline_asm_elementwise(E4M3_TO_BF16, "=r,=r,r,r,r", [raw, factor[:, None]],
                                     dtype=gl.bfloat16, is_pure=True, pack=4)


@gluon.jit
def _load_indices(idx_row, step, stop, rows: gl.constexpr, BLOCK_N: gl.constexpr):
    """Step `step`'s BLOCK_N token indices (-1 past the program's range)."""
    offs = step * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows)
    return gl.load(idx_row + offs, mask=offs < stop, other=-1)


@gluon.jit
def _gather_nope(kv_bytes_ptr, idx, block_size, kv_stride_block, kv_stride_slot, nope_cols,
                 GROUP: gl.constexpr):
    """The tokens `idx` (valid, byte offset of each row) and their fp8 bytes, one
    (BLOCK_N, GROUP) tile per 128-group, loaded in 16-byte vectors."""
    valid = idx >= 0
    token = gl.where(valid, idx, 0).to(gl.int64)
    token_bytes = (token // block_size) * kv_stride_block + (token % block_size) * kv_stride_slot
    token_bytes = gl.multiple_of(token_bytes, 16)  # launch_gluon checks the strides
    row_bytes = kv_bytes_ptr + token_bytes[:, None] + nope_cols[None, :]
    raw0 = gl.load(row_bytes + 0 * GROUP, mask=valid[:, None], other=0)
    raw1 = gl.load(row_bytes + 1 * GROUP, mask=valid[:, None], other=0)
    raw2 = gl.load(row_bytes + 2 * GROUP, mask=valid[:, None], other=0)
    raw3 = gl.load(row_bytes + 3 * GROUP, mask=valid[:, None], other=0)
    return valid, token_bytes, raw0, raw1, raw2, raw3


@gluon.jit
def _gather_rope(kv_bf16_ptr, token_bytes, valid, rope_layout: gl.constexpr, rope_cols,
                 ROPE_BYTE: gl.constexpr):
    """The tokens' (BLOCK_N, ROPE_DIM) bf16 RoPE values."""
    rope_bytes = gl.convert_layout(token_bytes, gl.SliceLayout(1, rope_layout))
    rope_valid = gl.convert_layout(valid, gl.SliceLayout(1, rope_layout))
    return gl.load(kv_bf16_ptr + ((rope_bytes + ROPE_BYTE) // 2)[:, None] + rope_cols[None, :],
                   mask=rope_valid[:, None], other=0.0)


@gluon.jit
def _producer(kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, indices_ptr, k_ring, rope_ring, mask_ring,
              full_bars, empty_bars, s_q, head_blocks, stop, num_steps, block_size,
              kv_stride_block, kv_stride_slot, idx_stride_b, idx_stride_s,
              BLOCK_N: gl.constexpr, GROUP: gl.constexpr, NOPE_DIM: gl.constexpr,
              ROPE_DIM: gl.constexpr, SCALES_BYTE: gl.constexpr, ROPE_BYTE: gl.constexpr,
              NUM_BUF: gl.constexpr, PREFETCH_INDICES: gl.constexpr, BF16_SCALE: gl.constexpr,
              BF16_FACTOR: gl.constexpr):
    """The producer: K dequantized to bf16 (BF16_SCALE: FlashMLA's way, times
    KEY_SCALE; see _dequantized_bf16)."""
    WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(NOPE_DIM == 4 * GROUP)
    batch, pos, head_block = _program(head_blocks, s_q)
    idx_row = indices_ptr + batch * idx_stride_b + pos * idx_stride_s

    # One 128-group of the tile: 16 fp8 bytes (one 16-byte load) per thread along a row.
    nope_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [WARPS, 1], [1, 0])
    # RoPE: 8 bf16 (16 bytes) per thread along a row.
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, nope_layout)
    nope_cols = gl.arange(0, GROUP, layout=gl.SliceLayout(0, nope_layout))
    rope_cols = gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, rope_layout))
    mask_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])

    if PREFETCH_INDICES:
        next_idx = _load_indices(idx_row, 0, stop, rows, BLOCK_N)
    for step in range(num_steps):
        slot = step % NUM_BUF
        # Gather the whole tile into registers before waiting for the slot; with
        # PREFETCH_INDICES the indices were loaded a step earlier, so the gather waits on one
        # memory round trip instead of two.
        if PREFETCH_INDICES:
            idx = next_idx
            next_idx = _load_indices(idx_row, step + 1, stop, rows, BLOCK_N)
        else:
            idx = _load_indices(idx_row, step, stop, rows, BLOCK_N)
        valid, token_bytes, raw0, raw1, raw2, raw3 = _gather_nope(
            kv_bytes_ptr, idx, block_size, kv_stride_block, kv_stride_slot, nope_cols, GROUP)
        scale_rows = kv_f32_ptr + (token_bytes + SCALES_BYTE) // 4
        scale0 = gl.load(scale_rows + 0, mask=valid, other=0.0)
        scale1 = gl.load(scale_rows + 1, mask=valid, other=0.0)
        scale2 = gl.load(scale_rows + 2, mask=valid, other=0.0)
        scale3 = gl.load(scale_rows + 3, mask=valid, other=0.0)
        rope = _gather_rope(kv_bf16_ptr, token_bytes, valid, rope_layout, rope_cols, ROPE_BYTE)
        key_mask = gl.convert_layout(gl.where(valid, 0.0, float("-inf")), mask_layout)

        mbarrier.wait(empty_bars.index(slot), ((step // NUM_BUF) & 1) ^ 1)
        k_tile = k_ring.index(slot)
        k_tile.slice(0 * GROUP, GROUP, dim=1).store(_dequantized(raw0, scale0, BF16_SCALE, BF16_FACTOR))
        k_tile.slice(1 * GROUP, GROUP, dim=1).store(_dequantized(raw1, scale1, BF16_SCALE, BF16_FACTOR))
        k_tile.slice(2 * GROUP, GROUP, dim=1).store(_dequantized(raw2, scale2, BF16_SCALE, BF16_FACTOR))
        k_tile.slice(3 * GROUP, GROUP, dim=1).store(_dequantized(raw3, scale3, BF16_SCALE, BF16_FACTOR))
        rope_ring.index(slot).store(rope)
        mask_ring.index(slot).store(key_mask)
        fence_async_shared()  # generic stores -> the consumer's wgmma (async proxy) reads
        gl.thread_barrier()  # every producer warp has stored before the arrive
        mbarrier.arrive(full_bars.index(slot))


@gluon.jit
def _gluon_sparse_decode_attention(
    q_ptr, kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, indices_ptr, out_ptr, lse_ptr,
    sm_scale_log2, s_q, heads, head_blocks, topk, tokens_per_split, block_size,
    q_stride_b, q_stride_s, q_stride_h,
    kv_stride_block, kv_stride_slot,
    idx_stride_b, idx_stride_s,
    out_stride_b, out_stride_s, out_stride_h,
    lse_stride_b, lse_stride_h, lse_stride_s,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, GROUP: gl.constexpr, NOPE_DIM: gl.constexpr,
    ROPE_DIM: gl.constexpr, SCALES_BYTE: gl.constexpr, ROPE_BYTE: gl.constexpr,
    LN2: gl.constexpr, NUM_BUF: gl.constexpr, PRODUCER_WARPS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, MASK_HEADS: gl.constexpr = False,
    PREFETCH_INDICES: gl.constexpr = False, BF16_SCALE: gl.constexpr = False,
    KEY_SCALE: gl.constexpr = 1.0, BF16_FACTOR: gl.constexpr = 1.0,
):
    """One program per (batch, query position, 64 query rows), the whole topk (no split).
    MASK_HEADS: h_q < 64, the rows past h_q zero in q and never stored. PREFETCH_INDICES,
    BF16_SCALE: the gluon-bf16-scale design (see the module docstring)."""
    gl.static_assert(BLOCK_H == 64)
    # 128-byte swizzled tiles, as wgmma reads them (q and K rows are 1,024 bytes, RoPE 128).
    # (A ring of NUM_BUF tiles takes the rank-2 layout of one tile.)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_rope_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, ROPE_DIM], tile_layout)
    rope_ring = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, ROPE_DIM], tile_layout)
    mask_ring = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_N],
                                          gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    full_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(full_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=1)

    stop = gl.minimum(tokens_per_split, topk)  # no split: the program's range is [0, topk)
    num_steps = gl.cdiv(stop, BLOCK_N)

    q_nope_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, NOPE_DIM], tile_layout)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, NOPE_DIM], tile_layout)
    gl.warp_specialize([
        (_consumer, (q_ptr, out_ptr, lse_ptr, q_nope_smem, q_rope_smem, k_ring, rope_ring,
                     mask_ring, full_bars, empty_bars, sm_scale_log2, s_q, heads, head_blocks,
                     num_steps,
                     q_stride_b, q_stride_s, q_stride_h,
                     out_stride_b, out_stride_s, out_stride_h,
                     lse_stride_b, lse_stride_h, lse_stride_s,
                     BLOCK_H, BLOCK_N, GROUP, NOPE_DIM, ROPE_DIM, NUM_BUF, LN2, MASK_HEADS,
                     KEY_SCALE)),
        (_producer, (kv_bytes_ptr, kv_f32_ptr, kv_bf16_ptr, indices_ptr, k_ring, rope_ring,
                     mask_ring, full_bars, empty_bars, s_q, head_blocks, stop, num_steps,
                     block_size, kv_stride_block, kv_stride_slot, idx_stride_b, idx_stride_s,
                     BLOCK_N, GROUP, NOPE_DIM, ROPE_DIM, SCALES_BYTE, ROPE_BYTE, NUM_BUF,
                     PREFETCH_INDICES, BF16_SCALE, BF16_FACTOR)),
    ], [PRODUCER_WARPS], [PRODUCER_REGS])

    for i in gl.static_range(NUM_BUF):
        mbarrier.invalidate(full_bars.index(i))
        mbarrier.invalidate(empty_bars.index(i))


def shared_bytes() -> int:
    """Shared memory the kernel allocates explicitly (without the compiler's scratch), the same
    in both designs: the q tile, the K and RoPE rings, the key masks and the mbarriers."""
    tiles = (BLOCK_H + NUM_BUF * BLOCK_N) * (NOPE_DIM + ROPE_DIM) * 2
    return tiles + NUM_BUF * BLOCK_N * 4 + 2 * NUM_BUF * 8


def head_layout(heads: int) -> tuple[int, bool]:
    """(programs per query position, whether rows past h_q are masked) for h_q query heads;
    ValueError for a head count the kernel does not take."""
    if heads in NATIVE_HEADS:
        return 1, True
    if heads > 0 and heads % BLOCK_H == 0:
        return heads // BLOCK_H, False
    raise ValueError(f"the Gluon decode takes h_q in {NATIVE_HEADS} or a multiple of {BLOCK_H}, "
                     f"got {heads}")


def launch_args(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, *, sm_scale: float, tokens_per_split: int,
                bf16_scale: bool = False, prefetch_indices: bool = False):
    """(grid, positional arguments, keyword arguments) of the kernel for this call."""
    key_scale = BF16_KEY_SCALE if bf16_scale else 1.0
    b, s_q, heads, _ = q.shape
    head_blocks, mask_heads = head_layout(heads)
    kv_bytes = kv_cache.view(torch.uint8)
    if kv_bytes.stride(0) % 16 or kv_bytes.stride(1) % 16:
        raise ValueError("the Gluon decode gathers 16-byte vectors: kv_cache's block and slot "
                         f"strides must be multiples of 16 bytes, got {kv_bytes.stride()[:2]}")
    grid = (b * s_q * head_blocks, )
    args = (
        q, kv_bytes, kv_bytes.view(torch.float32), kv_bytes.view(torch.bfloat16), indices, out, lse,
        sm_scale * LOG2E / key_scale, s_q, heads, head_blocks, indices.shape[-1], tokens_per_split,
        kv_cache.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        kv_bytes.stride(0), kv_bytes.stride(1),
        indices.stride(0), indices.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
    )
    kwargs = dict(
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, GROUP=GROUP, NOPE_DIM=NOPE_DIM, ROPE_DIM=ROPE_DIM,
        SCALES_BYTE=SCALES_BYTE, ROPE_BYTE=ROPE_BYTE, LN2=LN2, NUM_BUF=NUM_BUF,
        PRODUCER_WARPS=PRODUCER_WARPS,
        PRODUCER_REGS=PRODUCER_REGS, MASK_HEADS=mask_heads,
        PREFETCH_INDICES=bool(prefetch_indices), BF16_SCALE=bool(bf16_scale), KEY_SCALE=key_scale,
        BF16_FACTOR=key_scale / E4M3_BITS_AS_BF16,
        num_warps=NUM_WARPS, maxnreg=MAX_REGISTERS,
    )
    return grid, args, kwargs


def launch_gluon(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, *, sm_scale: float, tokens_per_split: int,
                 bf16_scale: bool = False, prefetch_indices: bool = False) -> None:
    """Run the decode into out and lse without a split; allocates nothing.

    q (b, s_q, h_q, 576) bf16, h_q 8, 16, 32 or a multiple of 64; kv_cache (blocks, block_size,
    1, 656) uint8 with 16-byte aligned block and slot strides; indices (b, s_q, topk) int32
    (-1 = invalid); out (b, s_q, h_q, 512) bf16; lse (b, h_q, s_q) fp32 (natural log). Each
    program covers topk positions [0, min(tokens_per_split, topk)), as `launch` with
    num_splits = 1. The design's options (triton_sparse_decode.GLUON_DESIGNS): bf16_scale,
    FlashMLA's dequantization (BF16_SCALE); prefetch_indices, the producer loads a step's
    indices one step ahead (PREFETCH_INDICES).
    """
    grid, args, kwargs = launch_args(q, kv_cache, indices, out, lse, sm_scale=sm_scale,
                                     tokens_per_split=tokens_per_split, bf16_scale=bf16_scale,
                                     prefetch_indices=prefetch_indices)
    _gluon_sparse_decode_attention[grid](*args, **kwargs)
