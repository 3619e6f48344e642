"""Shared fixtures: a fixed seed per test, and the deliberately regressed wrapper of
tests/fixtures. Helpers and skip markers are in `mlamem.testing`."""

import importlib.util
from pathlib import Path

import pytest

from mlamem.testing import seed_for

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def seed(request) -> int:
    """A seed fixed by the test's node id (parameters included): every run draws the same inputs.
    Tests put it in their failure messages."""
    return seed_for(request.node.nodeid)


@pytest.fixture(scope="session")
def regressed_alloc_path():
    """The alloc path keeping an extra padded copy of q; patch it into `mlamem.runtime.paths.PATHS`."""
    spec = importlib.util.spec_from_file_location("regressed_paths",
                                                  FIXTURES / "regressed_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.alloc_path_keeping_a_padded_copy


@pytest.fixture
def vllm_cache_as_measured(monkeypatch):
    """vLLM's KV cache as mlamem's rank sized it when the committed GPU runs were measured
    (2026-12-02 to 12-05): the 656-B fp8_ds_mla cell alone, before the DSA indexer's keys
    (132 B per token per layer, spec.engines.vllm.kv_bytes_per_token_per_layer) joined it. A
    prediction of one of those runs predicts the rank as it ran; new runs measure the rank
    with the indexer's keys (scripts/gpu_check.py)."""
    from mlamem.spec.engines import vllm

    monkeypatch.setattr(vllm, "kv_bytes_per_token_per_layer",
                        lambda scenario: scenario.kv_cache_bytes_per_token_per_layer)


@pytest.fixture
def rank_before_stages(monkeypatch):
    """vLLM's and SGLang's ranks as mlamem ran them before their stages beyond attention joined
    (2026-12-06: spec/engines/vllm_moe.py, vllm_pass.py, sglang_pass.py): no stage in the step
    or in vLLM's profile pass, and no buffer vLLM keeps at init beyond the path's own workspace
    (its shared workspace, the drafter's buffers: vllm_pass.resident_buffers). A prediction of a
    GPU run made before then predicts the rank as it ran; nothing else is stripped (the KV
    cache's cell is `vllm_cache_as_measured`'s)."""
    from mlamem.engines import decode_rank, sglang, vllm

    def no_stages(self, tokens):
        return []

    for rank in (decode_rank.DecodeRank, vllm.VLLM, sglang.SGLang):
        monkeypatch.setattr(rank, "stages", no_stages)
    monkeypatch.setattr(vllm.VLLM, "profile_stages", no_stages)
    monkeypatch.setattr(vllm.VLLM, "attention_live", no_stages)
    monkeypatch.setattr(vllm, "resident_buffers", lambda *args, **kwargs: None)
    monkeypatch.setattr(vllm, "after_kv_buffers", lambda *args, **kwargs: None)


@pytest.fixture
def rank_before_attention_locals(monkeypatch):
    """vLLM's rank with its stages beyond attention but without a DSA layer's attention locals
    (spec/engines/vllm_pass.py attention_locals, step_attention_buffers, after_kv_buffers):
    nothing held through the attention call, the profile's stages alone, nothing allocated
    after the KV cache. A test of one stage holds the locals out of its way with it."""
    from mlamem.engines import vllm

    monkeypatch.setattr(vllm.VLLM, "attention_live", lambda self, tokens: [])
    monkeypatch.setattr(vllm.VLLM, "with_attention_locals", lambda self, stages, tokens: stages)
    monkeypatch.setattr(vllm, "after_kv_buffers", lambda *args, **kwargs: None)
