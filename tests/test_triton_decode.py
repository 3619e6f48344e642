"""The Triton decode's wrapper on CPU, without triton: split plan, allocations, capabilities.

The kernels are replaced by a recording fake and the tensors live on the meta device, so what
is checked is exactly what the wrapper allocates and hands to the kernels.
"""

import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mlamem.kernels.own
from mlamem.kernels import KERNELS, FlashMLA, TritonDecode
from mlamem.kernels.base import Problem
from mlamem.kernels.flashmla import flashmla_allocations
from mlamem.kernels.own import triton_decode
from mlamem.kernels.own.triton_decode import (
    accum_workspace_numel,
    max_accum_workspace_numel,
    sparse_mla_decode_triton,
    split_plan,
)

META = torch.device("meta")
ALLOCATING_OPS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
                  torch.ops.aten.full.default, torch.ops.aten.zeros.default}


class RecordAllocations(TorchDispatchMode):
    """Collects (shape, dtype) of every tensor created from nothing inside the block."""

    def __init__(self):
        super().__init__()
        self.allocations = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in ALLOCATING_OPS:
            self.allocations.append((tuple(result.shape), result.dtype))
        return result


@pytest.fixture
def launches(monkeypatch):
    """Replace the Triton kernels with a fake that records its calls' arguments. As on a CPU,
    the default (Gluon, block_n 64) falls back to the Triton config of the call's heads."""
    calls = []
    fake = types.ModuleType("mlamem.kernels.own.triton_sparse_decode")
    fake.DEFAULT_CONFIG = types.SimpleNamespace(block_n=64)
    fake.runnable_config = lambda config, heads, device, splits: (
        types.SimpleNamespace(block_n=triton_decode.default_block_n(heads)), "no Gluon here")
    fake.launch = lambda *args, **kwargs: calls.append((args, kwargs))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(mlamem.kernels.own, "triton_sparse_decode", fake, raising=False)
    return calls


def meta_inputs(s_q, h_q=64, topk=2048, b=1):
    q = torch.empty((b, s_q, h_q, 576), dtype=torch.bfloat16, device=META)
    kv = torch.empty((128, 64, 1, 656), dtype=torch.uint8, device=META)
    indices = torch.empty((b, s_q, topk), dtype=torch.int32, device=META)
    return q, kv, indices


@pytest.mark.parametrize("sm_count", [132, 78])
@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("b", [1, 2, 3])
def test_split_plan_fits_flashmla_accumulators(sm_count, h_q, b):
    """Splits only when the calls' programs do not fill the SMs; fits b + num_sm_parts; no empty split."""
    for s_q in [*range(1, 140), 1024, 32768]:
        for topk in (64, 100, 128, 2048):
            plan = split_plan(b, s_q, h_q, topk, sm_count)
            programs = b * s_q * (h_q // 64)
            num_sm_parts = max(sm_count // s_q // (h_q // 64), 1)
            assert plan.split == (programs < sm_count and topk > triton_decode.DEFAULT_BLOCK_N)
            assert b * plan.num_splits <= b + num_sm_parts
            assert plan.tokens_per_split % triton_decode.DEFAULT_BLOCK_N == 0
            assert (plan.num_splits - 1) * plan.tokens_per_split < topk
            assert plan.num_splits * plan.tokens_per_split >= topk


@pytest.mark.parametrize(("b", "s_q", "h_q", "topk", "splits", "tokens_per_split"), [
    # H200 (132 SMs), topk 2048 = 16 steps of 128 tokens. A call wants ceil(132 / programs)
    # splits, at most 1 + num_sm_parts / b (FlashMLA's accumulators: num_sm_parts =
    # 132 // s_q // (h_q / 64)) and at most 16; then whole steps per split.
    (1, 1, 64, 2048, 16, 128),    # wants 132, fits 133: 16 splits of one step
    (1, 5, 64, 2048, 16, 128),    # wants 27, fits 1 + 26 = 27: 16
    (1, 9, 64, 2048, 8, 256),     # wants 15, fits 15: 2 steps each (ceil(16 / 15)), 8 splits
    (1, 44, 64, 2048, 3, 768),    # wants 3, fits 4: 6 steps each, ceil(2048 / 768) = 3 splits
    (1, 66, 64, 2048, 2, 1024),   # wants 2, fits 1 + 2 = 3
    (1, 131, 64, 2048, 2, 1024),  # wants 2 (ceil(132 / 131)), fits 1 + 1 = 2
    (1, 132, 64, 2048, 1, 2048),  # 132 programs fill the SMs: no split
    (1, 1, 64, 128, 1, 128),      # one step only: nothing to split
    (2, 33, 64, 2048, 2, 1024),   # 66 programs want 2; num_sm_parts 4 fits 1 + 4 / 2 = 3
    (1, 1, 128, 2048, 16, 128),   # 2 programs (2 head blocks) want 66; num_sm_parts 66
])
def test_split_plan_by_hand(b, s_q, h_q, topk, splits, tokens_per_split):
    """Worked cases of the split plan on an H200 (132 SMs)."""
    plan = split_plan(b, s_q, h_q, topk, 132)
    assert (plan.num_splits, plan.tokens_per_split) == (splits, tokens_per_split)


@pytest.mark.parametrize("s_q", [1, 5, 64, 4096])
def test_allocating_mode_allocates_what_flashmla_does(launches, s_q):
    """Without buffers: FlashMLA's buffers, same order, shapes and dtypes; the kernel gets views."""
    q, kv, indices = meta_inputs(s_q)
    with RecordAllocations() as record:
        out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, sm_count=132)
    spec = flashmla_allocations(tuple(q.shape), 512, 132)
    assert record.allocations == [(s.shape, s.dtype) for s in spec]
    assert out.shape == (1, s_q, 64, 512) and lse.shape == (1, 64, s_q)
    (args, kwargs), = launches
    lse_accum, o_accum = args[5], args[6]
    plan = split_plan(1, s_q, 64, 2048, 132)
    assert kwargs["num_splits"] == plan.num_splits
    if plan.split:
        assert lse_accum.shape == (plan.num_splits, s_q, 64)
        assert o_accum.shape == (plan.num_splits, s_q, 64, 512)
    else:
        assert lse_accum is None and o_accum is None


@pytest.mark.parametrize("s_q", [1, 5, 64, 4096])
def test_caller_buffers_mean_no_allocation(launches, s_q):
    """With out=, lse= and accum_workspace= the call allocates nothing at all."""
    q, kv, indices = meta_inputs(s_q)
    out = torch.empty((1, s_q, 64, 512), dtype=torch.bfloat16, device=META)
    lse = torch.empty((1, 64, s_q), device=META)
    workspace = torch.empty(max_accum_workspace_numel(1, 64, 512, 2048, 132, 32768), device=META)
    with RecordAllocations() as record:
        got = sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, out=out, lse=lse,
                                       accum_workspace=workspace, sm_count=132)
    assert record.allocations == []
    assert got[0] is out and got[1] is lse


def test_out_alone_leaves_the_rest_to_flashmla_shapes(launches):
    """With only out=, the other five FlashMLA buffers are allocated, in order."""
    q, kv, indices = meta_inputs(8192)
    out = torch.empty((1, 8192, 64, 512), dtype=torch.bfloat16, device=META)
    with RecordAllocations() as record:
        sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, out=out, sm_count=132)
    spec = flashmla_allocations(tuple(q.shape), 512, 132)[1:]
    assert record.allocations == [(s.shape, s.dtype) for s in spec]


def test_small_workspace_is_an_error(launches):
    """A workspace too small for the split is refused, naming the size it needs."""
    q, kv, indices = meta_inputs(1)
    needed = accum_workspace_numel(1, 1, 64, 512, split_plan(1, 1, 64, 2048, 132))
    with pytest.raises(ValueError, match=str(needed)):
        sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, sm_count=132,
                                 accum_workspace=torch.empty(needed - 1, device=META))


def test_max_workspace_covers_every_size_and_stays_small():
    """One reservation covers every s_q; at h_q = 64 on an H200 it is under 40 MB."""
    reserved = max_accum_workspace_numel(1, 64, 512, 2048, 132, 32768)
    for s_q in range(1, 300):
        assert accum_workspace_numel(1, s_q, 64, 512, split_plan(1, s_q, 64, 2048, 132)) <= reserved
    assert reserved * 4 < 40e6


def test_adapter_declares_what_it_takes():
    """Takes out, lse and a workspace; pads heads as FlashMLA; its spec is FlashMLA's; listed."""
    kernel = KERNELS["triton"]()
    caps = kernel.capabilities()
    assert isinstance(kernel, TritonDecode)
    assert caps.takes_out and caps.takes_lse and caps.takes_accum_workspace
    assert caps.padded_heads(8) == FlashMLA().capabilities().padded_heads(8) == 64
    for s_q in (1, 1024, 32768):
        problem = Problem("sparse-decode", rows=s_q, heads=64, sm_scale=0.1, kv_tokens=8192,
                          topk=2048)
        assert kernel.allocations(problem, 132) == flashmla_allocations((1, s_q, 64, 576), 512, 132)


def test_missing_triton_is_named(monkeypatch):
    """Without triton the adapter says so and how to install it."""
    monkeypatch.setattr(triton_decode, "_import_triton",
                        lambda: (None, "ModuleNotFoundError: No module named 'triton'"))
    assert TritonDecode().unavailable_reason() == "triton is not installed; pip install triton"


@pytest.mark.parametrize(("change", "message"), [
    ({"h_q": 8}, "multiple of 64"),
    ({"d_v": 256}, "d_v must be 512"),
])
def test_bad_shapes_are_refused(launches, change, message):
    """Unpadded heads and a d_v other than 512 are refused with the fix."""
    q, kv, indices = meta_inputs(4, h_q=change.get("h_q", 64))
    with pytest.raises(ValueError, match=message):
        sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, d_v=change.get("d_v", 512))


# The native-head kernel (`triton-native`): the rank's own heads, its own allocation spec.

@pytest.mark.parametrize("sm_count", [132, 78])
@pytest.mark.parametrize("h_q", [8, 16, 32])
@pytest.mark.parametrize("b", [1, 3])
def test_native_split_plan_fits_its_accumulators(sm_count, h_q, b):
    """Below 64 heads one program takes all heads: splits only when b * s_q programs leave SMs
    idle, never more than max_splits (what native_allocations reserves), no empty split."""
    for s_q in [*range(1, 140), 1024, 32768]:
        for topk in (64, 256, 2048):
            plan = split_plan(b, s_q, h_q, topk, sm_count)
            assert plan.split == (b * s_q < sm_count and topk > triton_decode.NATIVE_BLOCK_N)
            assert plan.num_splits <= triton_decode.max_splits(b, s_q, h_q, sm_count)
            assert (plan.num_splits - 1) * plan.tokens_per_split < topk


@pytest.mark.parametrize(("s_q", "h_q", "buffers"), [
    # 1024 and 32768 queries fill an H200's 132 SMs: out and lse, nothing else
    (1024, 8, [((1, 1024, 8, 512), torch.bfloat16), ((1, 8, 1024), torch.float32)]),
    (32768, 16, [((1, 32768, 16, 512), torch.bfloat16), ((1, 16, 32768), torch.float32)]),
    # 5 queries: max_splits = min(ceil(132 / 5), 1 + 132 // 5) = 27 partial results
    (5, 8, [((1, 5, 8, 512), torch.bfloat16), ((1, 8, 5), torch.float32),
            ((27, 5, 8), torch.float32), ((27, 5, 8, 512), torch.float32)]),
    (5, 128, [((1, 5, 128, 512), torch.bfloat16), ((1, 128, 5), torch.float32),
              ((14, 5, 128), torch.float32), ((14, 5, 128, 512), torch.float32)]),
])
def test_native_allocating_mode_allocates_its_own_spec(launches, s_q, h_q, buffers):
    """No padded q, no scheduler metadata: out and lse at h_q heads, and accumulators only for a
    call that can split; the kernel gets the plan's share of them."""
    q, kv, indices = meta_inputs(s_q, h_q=h_q)
    kernel = KERNELS["triton-native"]()
    with RecordAllocations() as record:
        out, lse = sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, sm_count=132,
                                            native=True)
    assert record.allocations == buffers
    problem = Problem("sparse-decode", rows=s_q, heads=h_q, sm_scale=0.1, kv_tokens=8192, topk=2048)
    assert [(s.shape, s.dtype) for s in kernel.allocations(problem, 132)] == buffers
    assert out.shape == (1, s_q, h_q, 512) and lse.shape == (1, h_q, s_q)
    (args, kwargs), = launches
    plan = split_plan(1, s_q, h_q, 2048, 132)
    assert kwargs["num_splits"] == plan.num_splits
    assert (args[6] is None) == (not plan.split)
    if plan.split:
        assert args[6].shape == (plan.num_splits, s_q, h_q, 512)


@pytest.mark.parametrize("s_q", [1, 5, 4096])
def test_native_caller_buffers_mean_no_allocation(launches, s_q):
    """With out=, lse= and accum_workspace= the native call allocates nothing either."""
    q, kv, indices = meta_inputs(s_q, h_q=8)
    out = torch.empty((1, s_q, 8, 512), dtype=torch.bfloat16, device=META)
    lse = torch.empty((1, 8, s_q), device=META)
    numel = KERNELS["triton-native"]().accum_numel(
        Problem("sparse-decode", rows=32768, heads=8, sm_scale=0.1, kv_tokens=8192, topk=2048), 132)
    workspace = torch.empty(numel, device=META)
    with RecordAllocations() as record:
        sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, out=out, lse=lse,
                                 accum_workspace=workspace, sm_count=132, native=True)
    assert record.allocations == []


def test_native_adapter_declares_the_rank_head_counts():
    """triton-native runs 8 to 128 heads unpadded; triton keeps FlashMLA's 64 and 128."""
    native, padded = KERNELS["triton-native"](), KERNELS["triton"]()
    assert native.capabilities().head_counts == (8, 16, 32, 64, 128)
    assert [native.capabilities().padded_heads(h) for h in (8, 16, 32)] == [8, 16, 32]
    assert padded.capabilities().padded_heads(8) == 64
    assert native.capabilities().takes_accum_workspace


@pytest.mark.parametrize(("h_q", "native", "message"), [
    (24, True, "h_q must be one of 8, 16, 32 or a multiple of 64, got 24"),
    (8, False, "pad q to 64 heads"),
])
def test_head_counts_each_kernel_refuses(launches, h_q, native, message):
    q, kv, indices = meta_inputs(4, h_q=h_q)
    with pytest.raises(ValueError, match=message):
        sparse_mla_decode_triton(q, kv, indices, sm_scale=0.1, native=native)
