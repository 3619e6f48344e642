"""A toy operation, and a toy kernel that runs it, in one module: what a new operation costs.

"toy-attend": R query rows, each attending all of a gathered bf16 KV of `--kv-len` tokens
(default 2 x topk); q, out (rows, heads, d) as the wrapper sees them, lse (rows, heads). The toy
kernel runs nowhere: mlamem predicts it from its allocation spec, out and lse, and a scratch of
2 int32 per (row, head) it frees before returning.
"""

from __future__ import annotations

import torch

from mlamem.operations import Operation, OpInputs, Problem
from mlamem.operations.base import generator
from mlamem.spec.kernel_api import BufferSpec, Capabilities, KernelContract, KernelEntry

SCRATCH_INT32_PER_ROW = 2


class ToyAttend(Operation):
    name = "toy-attend"
    symbol = "R"
    quantity = "R, query rows of one call"
    key, flag = "tokens", "--tokens"
    kv_key, kv_flag = "kv_len", "--kv-len"
    default_sweep = (1024,)
    default_scenario = "glm5-fp8-tp8"
    kv_formats = ("bf16",)

    def default_kv_tokens(self, scenario) -> int:
        return 2 * scenario.decode_topk

    def make_inputs(self, problem: Problem, heads: int, device, seed: int = 0):
        g = generator(device, seed)
        kv = torch.randn((problem.kv_tokens, problem.d_qk), dtype=torch.bfloat16, device=device,
                         **g)
        q = torch.randn((problem.rows, heads, problem.d_qk), dtype=torch.bfloat16, device=device,
                        **g)
        return q, OpInputs(kv=kv)


OPERATION = ToyAttend()


class ToyAttendKernel(KernelContract):
    """Runs toy-attend only, nowhere: takes out, pads q to 64 heads."""

    name = "toy-attend-kernel"
    label = "Toy attend"
    operations = (OPERATION.name,)

    def unavailable_reason(self) -> str:
        return "a toy runs nowhere; it predicts"

    def capabilities(self, op: str = OPERATION.name, kv_format: str | None = None) -> Capabilities:
        if op != OPERATION.name:
            raise ValueError(f"{self.label} does not run {op}")
        return Capabilities(takes_out=True, takes_lse=False, takes_accum_workspace=False,
                            head_counts=(64,), source="the toy's own declaration",
                            kv_formats=OPERATION.kv_formats)

    def run(self, problem: Problem, q, inputs: OpInputs, *, out=None):
        raise NotImplementedError("a toy runs nowhere")

    def allocations(self, problem: Problem, sm_count: int) -> list[BufferSpec]:
        r, h = problem.rows, problem.heads
        return [BufferSpec("out", (r, h, problem.d_v), torch.bfloat16, "returned"),
                BufferSpec("lse", (r, h), torch.float32, "returned"),
                BufferSpec("toy_scratch", (r, h, SCRATCH_INT32_PER_ROW), torch.int32, "temporary")]


ENTRY = KernelEntry(__name__, "ToyAttendKernel", "a toy kernel for the toy operation",
                    (OPERATION.name,))
