"""SGLang 0.5.23's memory rules (mlamem/spec/engines/sglang.py) against derivations done by
hand from its source (sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings and
reserve_for_graph_mb; arg_groups/cuda_graph_hook.py; model_executor/pool_configurator.py)."""

import pytest

from mlamem.spec.engines import sglang as rules
from mlamem.spec.errors import UserError

H100_MIB = 81559  # nvidia-smi memory.total of an H100 SXM 80GB (the seed PR quotes it)
H200_MIB = 143771  # nvidia-smi memory.total of the H200 we measure on


def test_glm5_tp8_on_an_h100_at_sglangs_defaults():
    """H100 row (81559 < 90 x 1024): chunk 8192, max_bs 512 at TP >= 4. Reserve:
    512 + 1.5 x 8192 = 12800; + 8 x 1 / 8 GiB = 1024 -> 13824; graphs: 512 x 2 = 1024 decode +
    1536 MLA prefill = 2560 -> 16384; over the 10240 floor. (81559 - 16384) / 81559 = 0.79911."""
    got = rules.resolve(H100_MIB, tp_size=8)
    assert (got.chunked_prefill_size, got.decode_max_bs) == (8192, 512)
    assert (got.activation_mib, got.parallel_mib, got.graph_mib) == (12800, 1024, 2560)
    assert got.reserved_mib == 16384
    assert got.mem_fraction_static == 0.799 and not got.fraction_given


def test_kimi_k2_attention_dp_on_an_h200_with_its_own_limits():
    """H200 row (143771 < 160 x 1024), TP4 attention-DP 4, --chunked-prefill-size 4096,
    --max-running-requests 128: max_bs 512 capped to 128. Reserve: 512 + 1.5 x 4096 = 6656;
    + 4 / 8 GiB = 512 -> 7168; graphs: 128 x 2 = 256, DP 128 x 4 x 3 = 1536 (128 <= 300: no
    more), MLA prefill 1536 -> 3328; 10496 over the 10240 floor.
    (143771 - 10496) / 143771 = 0.92699."""
    got = rules.resolve(H200_MIB, tp_size=4, attn_dp_size=4, chunked_prefill_size=4096,
                        max_running_requests=128)
    assert (got.chunked_prefill_size, got.decode_max_bs) == (4096, 128)
    assert got.graph_mib == 3328 and got.reserved_mib == 10496
    assert got.mem_fraction_static == 0.927
    assert got.decode_batch_sizes[-3:] == (112, 120, 128)


def test_the_floor_and_deepep_on_a_b200_without_prefill_graphs():
    """B200 row (183359 MiB, over 160 x 1024): chunk 16384, max_bs 512 at any TP. TP2,
    --cuda-graph-backend-prefill disabled, DeepEP: 512 + 1.5 x 16384 = 25088; + 2 / 8 GiB = 256;
    decode graphs 1024 -> 26368 (over the floor); DeepEP 2048 on top -> 28416.
    (183359 - 28416) / 183359 = 0.84502."""
    got = rules.resolve(183359, tp_size=2, prefill_graphs=False, deepep=True)
    assert (got.chunked_prefill_size, got.decode_max_bs) == (16384, 512)
    assert got.reserved_mib == 28416 and got.mem_fraction_static == 0.845
    assert got.prefill_batch_sizes == ()


def test_deepep_with_prefill_graphs_adds_its_prefill_graph_term():
    """H200 TP8 at SGLang's defaults, breakable prefill graphs (CUDA's default) and
    --moe-a2a-backend deepep: reserve_for_graph_mb adds 1024 for the prefill graphs under DeepEP,
    reserve_for_deepep_a2a_mb 2048 over the floor. 512 + 1.5 x 8192 = 12800; + 8 / 8 GiB = 1024;
    graphs 512 x 2 = 1024 decode + 1536 MLA prefill + 1024 DeepEP prefill = 3584 -> 17408;
    + 2048 -> 19456. (143771 - 19456) / 143771 = 0.86468 (0.872 without the prefill term)."""
    got = rules.resolve(H200_MIB, tp_size=8, deepep=True)
    assert (got.graph_mib, got.deepep_mib, got.reserved_mib) == (3584, 2048, 19456)
    assert got.mem_fraction_static == 0.865


def test_a_small_reserve_is_floored_at_10_gib_over_60_gib():
    """TP1, chunk 2048, max_bs 8, no graphs: 512 + 3072 + 128 = 3712, floored to 10240."""
    got = rules.resolve(H100_MIB, tp_size=1, chunked_prefill_size=2048, cuda_graph_max_bs=8,
                        decode_graphs=False, prefill_graphs=False)
    assert got.reserved_mib == rules.FLOOR_MIB
    assert rules.resolve(24576, tp_size=1, chunked_prefill_size=2048, cuda_graph_max_bs=8,
                         decode_graphs=False, prefill_graphs=False).reserved_mib == 3712


def test_a_given_fraction_stands_and_a_given_max_bs_ignores_the_requests():
    got = rules.resolve(H200_MIB, tp_size=8, mem_fraction_static=0.8, cuda_graph_max_bs=256,
                        max_running_requests=64)
    assert got.mem_fraction_static == 0.8 and got.fraction_given
    assert got.decode_max_bs == 256
    with pytest.raises(UserError, match="mem_fraction_static"):
        rules.resolve(H200_MIB, tp_size=8, mem_fraction_static=1.5)


def test_the_graph_batch_lists():
    decode = rules.decode_graph_batch_sizes(512)
    assert decode[:6] == [1, 2, 4, 8, 12, 16] and decode[-3:] == [480, 496, 512]
    assert rules.decode_graph_batch_sizes(100)[-2:] == [96, 100]  # max_bs itself appended
    assert rules.decode_graph_batch_sizes(20, speculative=True) == [1, 2, 3, 4, 5, 6, 7, 8, 10,
                                                                    12, 14, 16, 18, 20]
    prefill = rules.prefill_graph_batch_sizes(8192)
    assert prefill[:3] == [4, 8, 12] and prefill[-2:] == [7680, 8192]
    assert rules.resolve(H100_MIB, tp_size=8).prefill_batch_sizes[-1] == 8192  # MLA: at most 8192


def test_the_dsa_fp8_cell_is_mlamems_fp8_ds_mla_token_plus_the_indexers():
    """512 fp8 + 4 scales x 4 B + 64 x 2 B RoPE = 656 B (the fp8_ds_mla token), indexer
    128 + 1 x 4 = 132 B; GLM-5's 78 layers: 788 x 78 = 61464 B."""
    assert rules.dsa_fp8_cell_bytes(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
                                    num_layers=78) == 61464
    with pytest.raises(UserError, match="kv_lora_rank"):
        rules.dsa_fp8_cell_bytes(kv_lora_rank=500, qk_rope_head_dim=64, index_head_dim=128,
                                 num_layers=1)


def test_the_kv_pool_and_the_fraction_that_gives_it():
    """80 GiB free before the model, 40 GiB after the weights, fraction 0.8:
    40 - 80 x 0.2 = 24 GiB."""
    gib = 1 << 30
    assert rules.kv_pool_bytes(40 * gib, 80 * gib, 0.8) == 24 * gib
    assert rules.kv_pool_bytes(10 * gib, 80 * gib, 0.8) < 0  # SGLang refuses to start
    fraction = rules.fraction_for_pool(24 * gib, 40 * gib, 80 * gib)
    assert fraction == 0.8
    assert rules.kv_pool_bytes(40 * gib, 80 * gib, fraction - 0.001) < 24 * gib
