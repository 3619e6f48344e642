"""The DSA indexer's key cache, as vLLM and SGLang both keep it beside the MLA cache: per token
per layer, the indexer's key in fp8 (`index_head_dim` bytes) and one fp32 scale per 128 values.

- vLLM 0.33.0: model_executor/models/deepseek_v2.py, `Indexer.__init__`: `DeepseekV32IndexerCache(
  head_dim=self.head_dim + self.head_dim // self.quant_block_size * 4, dtype=torch.uint8)`,
  quant_block_size 128 (132 bytes at index_head_dim 128);
- SGLang 0.5.23: model_executor/pool_configurator.py, `_compute_dsa_indexer_cell_size` (the same
  bytes, divided over the index pool's `index_kpool` tokens where it pools keys).
"""

from __future__ import annotations

INDEXER_QUANT_BLOCK = 128  # indexer key values per fp32 scale (both engines)
SCALE_BYTES = 4  # one fp32 scale


def indexer_key_bytes(index_head_dim: int, index_kpool: int = 1) -> int:
    """Bytes one token's indexer key takes in one layer: the fp8 values and their fp32 scales,
    over `index_kpool` tokens (rounded up) where keys are pooled."""
    key = index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * SCALE_BYTES
    return -(-key // index_kpool)
