"""The tiling both of mlamem's decode kernels and their planning share: query heads per
program and rows of its q tile, KV tokens per loop step, and the log constants of the online
softmax. Plain Python: the planning imports it without triton."""

HEAD_BLOCK = 64  # query heads per attention program, at 64 heads or more
MIN_DOT_ROWS = 16  # a tl.dot's least rows: fewer heads are padded to this in registers
DEFAULT_BLOCK_N = 128  # KV tokens per loop step: the Triton fallback's at 64 heads (triton_sparse_decode)
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


def head_blocks(h_q: int) -> int:
    """Attention programs per (batch, query, split): h_q / 64, or 1 below 64 heads."""
    return max(h_q // HEAD_BLOCK, 1)


def block_heads(h_q: int) -> int:
    """Rows of one program's q tile: 64, or h_q below it, at least MIN_DOT_ROWS."""
    return max(min(h_q, HEAD_BLOCK), MIN_DOT_ROWS)
