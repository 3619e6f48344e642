"""`mlamem compare`: the same inputs through two kernels, output against output, and each
against the plain-torch reference.

For every (value, path) both kernels run the operation on identical inputs (one seed), through
the same wrapper path. A row says whether out and lse are bit-identical and, if not, the largest
difference; each kernel's error against the reference (run once per value, alloc path) is
reported beside it, so two builds that differ can each be held to the reference instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mlamem.operations import kv_format
from mlamem.runtime import environment
from mlamem.spec.errors import UserError

if TYPE_CHECKING:
    from mlamem.results.compare import CompareFile, ReferenceDifference
    from mlamem.runtime.measure import Failure
    from mlamem.spec.kernel_api import KernelContract
    from mlamem.spec.scenario import Scenario

SCHEMA = "mlamem.compare/1"


def check_kernels(kernels: Sequence[KernelContract], op: str) -> None:
    """One line when a kernel cannot run here or lacks the operation."""
    for kernel in kernels:
        if op not in kernel.operations:
            raise UserError(f"kernel {kernel.name} does not run {op}; compare kernels that "
                            "both run it (`mlamem kernels` lists who runs what)")
    for kernel in kernels:
        reason = kernel.unavailable_reason()
        if reason is not None:
            raise UserError(f"compare runs every kernel on this GPU; {kernel.name} cannot run "
                            f"here ({reason})")


def _run(memory, kernel, scenario, op, tokens, path, kv_tokens, seed):
    """One path's call on the GPU, measured (`measure.measure_one`): ((out (rows, heads, d_v),
    lse (heads, rows), kv_tokens), None), or (None, the out-of-memory that stopped it). Any
    other failure is raised."""
    from mlamem.runtime.measure import classify_failure, local_sm_count, measure_one, plan_call

    sm_count = local_sm_count()
    planned = plan_call(scenario, kernel, op, tokens, path, sm_count=sm_count,
                        kv_tokens=kv_tokens)
    ooms_before = memory.stats(device=False).num_ooms
    try:
        step = planned.prepare(memory, max_tokens=tokens, seed=seed)
    except Exception as exc:
        failure = classify_failure(exc, memory, ooms_before)
        if not failure.oom:
            raise
        return None, failure
    call = measure_one(memory, step, planned.expected, raise_errors=True)
    if call.failure is not None:
        return None, call.failure
    out, lse = call.value
    return (out.clone(), lse.clone(), planned.problem.kv_tokens), None


def reference_error(out, lse, ref_out, ref_lse) -> ReferenceDifference:
    import torch

    from mlamem.results.compare import ReferenceDifference

    diff = out.float() - ref_out.float()
    finite = torch.isfinite(ref_lse)
    lse_diff = (lse.float() - ref_lse.float())[finite]
    return ReferenceDifference(
        out_max_abs=diff.abs().max().item(),
        out_rel_l2=(diff.norm() / ref_out.float().norm()).item(),
        lse_max_abs=lse_diff.abs().max().item() if lse_diff.numel() else 0.0)


def run_compare(scenario: Scenario, op: str, values: Sequence[int], paths: Sequence[str],
                kernels: Sequence[KernelContract], *, command: str,
                kv_tokens: int | None = None, reference: KernelContract | None = None,
                seed: int = 0,
                on_case: Callable[[int, str], None] | None = None
                ) -> tuple[CompareFile, Failure | None]:
    """Compare two kernels (and each with `reference`, when given) over values x paths, each
    call measured: the result, and the out-of-memory that stopped the sweep (None when none
    did; the result's rows are then those before it)."""
    import torch

    from mlamem.results.compare import CompareFile, CompareRow
    from mlamem.runtime.memory import CudaMemory

    check_kernels(kernels, op)
    memory = CudaMemory()
    rows, kv_used, failure = [], kv_tokens, None
    for t in values:
        ref = None
        if reference is not None:
            ran, failure = _run(memory, reference, scenario, op, t, "alloc", kv_tokens, seed)
            if failure is not None:
                break
            ref = ran[:2]
        for path in paths:
            outs = {}
            for kernel in kernels:
                ran, failure = _run(memory, kernel, scenario, op, t, path, kv_tokens, seed)
                if failure is not None:
                    break
                out, lse, kv_used = ran
                outs[kernel.name] = (out, lse)
            if failure is not None:
                break
            (out_a, lse_a), (out_b, lse_b) = outs.values()
            rows.append(CompareRow(
                tokens=t, path=path, out_equal=torch.equal(out_a, out_b),
                lse_equal=torch.equal(lse_a, lse_b),
                out_max_diff=(out_a.float() - out_b.float()).abs().max().item(),
                lse_max_diff=(lse_a.float() - lse_b.float()).abs().max().item(),
                errors={name: None if ref is None else reference_error(*pair, *ref)
                        for name, pair in outs.items()}))
            del outs, out_a, out_b, lse_a, lse_b
            if on_case:
                on_case(t, path)
        del ref
        memory.empty_cache()
        if failure is not None:
            break
    return CompareFile(
        schema=SCHEMA, command=command, op=op, scenario=scenario.name,
        kernels=[{"name": k.name, "label": k.label, "version": k.version(),
                  "head_counts": list(k.capabilities(op, kv_format(scenario, op)).head_counts)}
                 for k in kernels],
        kv_tokens=kv_used, rows=rows, environment=environment.capture(),
        created=environment.now_utc(),
        notes=[] if reference is not None else ["no reference run (--no-reference)"]), failure


__all__ = ["SCHEMA", "run_compare"]
