"""A new operation is one module (tests/toy_operation.py) and one registry line: registered, it
is profiled through the library's profile path, predicted on simulated memory, to the byte."""

from __future__ import annotations

import dataclasses

import pytest
import toy_operation

from mlamem import operations
from mlamem.commands.profile import run_profile
from mlamem.kernels import REGISTRY, load_kernel
from mlamem.spec import scenario as scenarios

ROWS, HEADS = 1024, 64  # GLM-5's 8 heads per rank, padded to the toy kernel's 64
PADDED_Q = ROWS * HEADS * 576 * 2  # bf16 q padded by the wrapper (alloc path)
OUT = ROWS * HEADS * 512 * 2  # bf16, d_v 512
LSE = ROWS * HEADS * 4  # float32
SCRATCH = ROWS * HEADS * 2 * 4  # 2 int32 per (row, head)


@pytest.fixture
def toy():
    """The toy operation and its kernel registered, each by one line; removed after."""
    operations.register(toy_operation.OPERATION)
    REGISTRY[toy_operation.ToyAttendKernel.name] = toy_operation.ENTRY
    try:
        yield
    finally:
        operations.unregister(toy_operation.OPERATION.name)
        del REGISTRY[toy_operation.ToyAttendKernel.name]


def test_a_registered_operation_is_profiled_predicted_to_the_byte(toy):
    glm = scenarios.load("glm5-fp8-tp8")
    chosen = dataclasses.replace(glm, operations=(*glm.operations, "toy-attend"))
    kernel = load_kernel("toy-attend-kernel")()
    result = run_profile(chosen, [ROWS], ["alloc", "workspace"], command="test", kernel=kernel,
                         predict=True, op="toy-attend")
    assert not result.measured and result.op == "toy-attend"
    rows = {row.path: row for row in result.rows}
    assert {p: {b.name: b.requested_bytes for b in r.buffers} for p, r in rows.items()} == {
        "alloc": {"padded_q": PADDED_Q, "out": OUT, "lse": LSE, "toy_scratch": SCRATCH},
        "workspace": {"lse": LSE, "toy_scratch": SCRATCH}}
    assert {p: r.peak_allocated_bytes for p, r in rows.items()} == {
        "alloc": PADDED_Q + OUT + LSE + SCRATCH, "workspace": LSE + SCRATCH}
    assert all(r.failure is None and r.kv_tokens == 2 * glm.decode_topk for r in rows.values())


def test_an_operation_not_registered_is_refused_naming_the_registered_ones():
    with pytest.raises(Exception, match="unknown operation 'toy-attend'; expected one of: "
                                        "sparse-decode, dense-decode, sparse-prefill"):
        operations.operation("toy-attend")


def test_the_planner_and_the_cli_options_take_a_registered_operation_from_its_object(toy):
    """The planner sweeps the toy's values under its key and bound, and the CLI's --op, sweep
    flag and KV flag are the toy's own: nothing outside the Operation names it."""
    from mlamem.cli import options as o
    from mlamem.commands.sweep import Request, plan
    from mlamem.spec.errors import UserError

    glm = scenarios.load("glm5-fp8-tp8")
    chosen = [("glm5-toy", dataclasses.replace(glm, operations=(*glm.operations, "toy-attend")))]
    kernel = toy_operation.ToyAttendKernel.name
    [part] = plan(Request("profile", kernel, scenarios=chosen, ops=["toy-attend"],
                          values={"toy-attend": [ROWS]}, paths=["alloc", "workspace"]))
    assert (part.op, part.values, part.kernel.name) == ("toy-attend", [ROWS], kernel)
    too_many = glm.serving.max_num_batched_tokens + 1
    with pytest.raises(UserError, match=f"T={too_many} exceeds .*max_num_batched_tokens") as caught:
        plan(Request("profile", kernel, scenarios=chosen, ops=["toy-attend"],
                     values={"toy-attend": [too_many]}, paths=["workspace"]))
    assert caught.value.field == toy_operation.OPERATION.key
    assert o.check_op_name("toy-attend") == "toy-attend"
    assert o.parse_sweep("toy-attend", "8,16", None) == [8, 16]
    with pytest.raises(UserError, match="toy-attend sweeps R, query rows of one call; give "
                                        "--tokens instead"):
        o.parse_sweep("toy-attend", None, "16")
    assert o.kv_length("toy-attend", None, 4096) == 4096
    with pytest.raises(UserError, match="--context-len applies to --op dense-decode only; drop "
                                        "it for toy-attend"):
        o.kv_length("toy-attend", 4096, None)
