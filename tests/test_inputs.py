"""Decode inputs (mlamem/runtime/inputs.py): on the meta device, the same tensors and the same allocator
requests as a real build, without drawing or quantizing any value."""

import subprocess
import sys

import pytest
import torch

from mlamem.runtime import inputs
from mlamem.runtime.memory import SimulatedMemory
from mlamem.spec import fp8_ds_mla, scenario

META = torch.device("meta")


def _build(name: str, tokens: int, device: torch.device, **options):
    return inputs.make_inputs(scenario.load(name), tokens, device, **options)


@pytest.mark.parametrize("name", ["glm5-fp8-tp8", "kimi-k2-fp8-tp4-dp"])
@pytest.mark.parametrize("options", [{}, {"invalid_fraction": 0.2}, {"with_query": False}])
def test_meta_inputs_match_real_ones(name, options):
    """Every tensor has the shape, dtype and strides of the CPU build, and the allocator model
    gets a request of each CPU tensor's bytes in the order the engine allocates them (kv_cache,
    indices, q), with only the drop mask's temporaries between."""
    real = _build(name, 1024, torch.device("cpu"), **options)
    memory = SimulatedMemory()
    memory.model.trace = []
    with memory:
        fake = _build(name, 1024, META, **options)
    for field in ("kv_cache", "indices", "q"):
        want, got = getattr(real, field), getattr(fake, field)
        if want is None:
            assert got is None
            continue
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
    allocs = [e["size"] for e in memory.model.trace if e["action"] == "alloc"]
    assert allocs[:2] == [real.kv_cache.nbytes, real.indices.nbytes]
    if real.q is not None:
        assert allocs[-1] == real.q.nbytes
    # between them only the drop mask's temporaries (invalid_fraction), all freed
    temporaries = allocs[2:-1] if real.q is not None else allocs[2:]
    assert bool(temporaries) == bool(options.get("invalid_fraction"))
    assert memory.model.allocated_bytes == sum(
        t.nbytes for t in (real.kv_cache, real.indices, real.q) if t is not None)

def test_meta_inputs_draw_no_values(monkeypatch):
    """On meta nothing is quantized: the KV cache is an empty tensor of the quantized shape."""
    def refuse(latent):
        raise AssertionError("quantize was called for a meta build")

    monkeypatch.setattr(fp8_ds_mla, "quantize", refuse)  # what the sparse decode draws with
    with SimulatedMemory():
        built = _build("glm5-fp8-tp8", 1024, META)
    assert built.kv_cache.device == META


def test_random_ops_on_meta_match_their_meta_kernels():
    """Under the allocator model a random op on meta is answered without its meta kernel, with
    the tensor the meta kernel would give (shape, dtype, strides); in place, the input itself.
    Each op is still shown to `on_op` first."""
    calls = [
        lambda: torch.randint(0, 7, (2, 3), dtype=torch.int32, device=META),
        lambda: torch.randint(7, (5,), device=META),  # default dtype: int64
        lambda: torch.randn((4, 2), dtype=torch.bfloat16, device=META),
        lambda: torch.rand((3,), device=META),
    ]
    memory, seen = SimulatedMemory(), []
    memory._mode.on_op = lambda op: seen.append(str(op.overloadpacket))
    for call in calls:
        want = call()  # outside the model: the real meta kernel
        with memory:
            got = call()
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
    q = torch.empty((2, 3), device=META)
    with memory:
        assert q.normal_() is q
    assert seen == ["aten.randint", "aten.randint", "aten.randn", "aten.rand", "aten.normal_"]


def test_predicted_run_imports_neither_dynamo_nor_sympy():
    """A predicted profile starts no torch._dynamo (the dispatch mode is not wrapped in
    torch._disable_dynamo) and no sympy (random meta kernels' torch._check)."""
    code = ("import sys; from mlamem.cli import main; "
            "code = main(['profile', '--predict', '--tokens', '1024', '--format', 'json']); "
            "print(code, 'torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.splitlines()[-1] == "0 False False", done.stderr
