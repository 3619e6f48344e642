"""sparse-decode: T, the query tokens of one call (`--tokens`, JSON key `tokens`), over the
scenario's fp8_ds_mla pool of 4 x topk tokens; its workspace holds max_num_batched_tokens.

Kernel layout: q (1, T, h_q, 576) bf16 over an fp8_ds_mla cache (num_blocks, block, 1, 656)
with indices (1, T, topk) int32 (-1 invalid); out (1, T, h_q, d_v) bf16, lse (1, h_q, T) fp32.
"""

from __future__ import annotations

from mlamem.operations.base import Operation, OpInputs, Problem, Scenario, generator

KV_POOL_TOPK_MULTIPLE = 4  # the synthetic KV pool (and a prefill's gathered KV) hold 4 x topk tokens


def kv_pool_tokens(scenario: Scenario) -> int:
    """Tokens in the synthetic KV pool: a whole number of blocks covering 4 x topk."""
    block = scenario.serving.block_size
    return -(-KV_POOL_TOPK_MULTIPLE * scenario.decode_topk // block) * block


def sparse_decode_inputs(pool: int, block: int, topk: int, tokens: int, heads: int | None,
                         d_qk: int, device, seed: int, invalid_fraction: float = 0.0):
    """(q or None, kv_cache, indices): a pool of `pool` tokens quantized on the CPU and copied
    over (an empty meta tensor of the copy's shape on the meta device), indices in range, -1
    at `invalid_fraction` of them (each query keeps one), then q (tokens, heads, d_qk) bf16."""
    import torch

    from mlamem.spec import fp8_ds_mla  # the cache format's quantizer: torch, as drawing inputs is
    cache_shape = (pool // block, block, 1, fp8_ds_mla.BYTES_PER_TOKEN)
    if device.type == "meta":  # no values: skip drawing and quantizing them on the CPU
        kv_cache = torch.empty(cache_shape, dtype=torch.uint8, device=device)
    else:
        latent = torch.randn((pool, d_qk), generator=torch.Generator().manual_seed(seed))
        kv_cache = fp8_ds_mla.quantize(latent).view(cache_shape).to(device)
    on_device = generator(device, seed)
    indices = torch.randint(0, pool, (1, tokens, topk), dtype=torch.int32, device=device,
                            **on_device)
    if invalid_fraction:
        drop = torch.rand(indices.shape, device=device, **on_device) < invalid_fraction
        drop[..., 0] = False  # every query keeps at least one valid key
        indices.masked_fill_(drop, -1)
    q = None
    if heads is not None:
        q = torch.randn((tokens, heads, d_qk), dtype=torch.bfloat16, device=device, **on_device)
    return q, kv_cache, indices


class SparseDecode(Operation):
    name = "sparse-decode"
    symbol = "T"
    quantity = "T, query tokens of one call"
    key, flag = "tokens", "--tokens"
    default_sweep = (1024, 8192, 16384, 32768)
    validate_sweep = (1024, 4096, 8192, 16384, 32768)
    default_scenario = "glm5-fp8-tp8"
    kv_formats = ("fp8_ds_mla",)  # whatever the scenario budgets its cache in
    reads_scenario_cache = True

    def default_kv_tokens(self, scenario: Scenario) -> int:
        return kv_pool_tokens(scenario)

    def serving_problem(self, scenario: Scenario) -> tuple[str, str] | None:
        """Its fp8_ds_mla cache. A context-reuse scenario (block reuse on, chunked prefill off)
        states TensorRT-LLM's cache in kv_cache_dtype; its sparse decode is the vLLM side, on
        vLLM's own fp8_ds_mla cache."""
        s, cache = scenario.serving, self.kv_formats[0]
        if s.kv_cache_dtype == cache or (s.block_reuse and not s.chunked_prefill):
            return None
        return ("kv_cache_dtype", f"is {s.kv_cache_dtype!r}; {self.name} reads the {cache} "
                f'cache: set kv_cache_dtype = "{cache}", or operations = ["dense-decode"] for a '
                "plain cache")

    def kernel_shape(self, rows_shape):
        return (1, *rows_shape)

    def from_kernel_layout(self, out, lse):
        return out[0], lse[0]

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        q, kv, indices = sparse_decode_inputs(problem.kv_tokens, problem.block_size, problem.topk,
                                              problem.rows, heads, problem.d_qk, device, seed)
        return q, OpInputs(kv=kv, indices=indices)

    def describe(self, scenario_summary: dict, kv_tokens: int | None) -> str:
        return f"topk {scenario_summary['topk']}, s_q = T"


OPERATION = SparseDecode()


def run_kernel(kernel, q, kv_cache, indices, *, sm_scale: float, d_v: int, **buffers):
    """`kernel.run` on a sparse decode's own tensors (q (1, T, h_q, d_qk), an fp8_ds_mla
    cache (blocks, block, 1, 656), indices (1, T, topk)), its problem read off their shapes;
    `buffers`: out=, lse=, accum_workspace= as the kernel takes them. Returns (out, lse)."""
    _, rows, heads, d_qk = q.shape
    problem = Problem(op=OPERATION.name, rows=rows, heads=heads, sm_scale=sm_scale,
                      kv_tokens=kv_cache.shape[0] * kv_cache.shape[1], topk=indices.shape[-1],
                      block_size=kv_cache.shape[1], d_qk=d_qk, d_v=d_v)
    return kernel.run(problem, q, OpInputs(kv=kv_cache, indices=indices), **buffers)
