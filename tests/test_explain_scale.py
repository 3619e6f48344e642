"""`mlamem explain` and `diff` take work linear in a snapshot's events: counted in Python lines
run, so the check is exact and cheap (the 2M-event timing is benchmarks/explain_scale.py's)."""

import pickle
import sys
from pathlib import Path

import mlamem
from mlamem.commands.explain import explain
from mlamem.spec import scenario
from mlamem.testing import synthetic_snapshot

PACKAGE = str(Path(mlamem.__file__).parent)
KERNELS = str(Path(__file__).resolve().parents[1] / "kernels")


def lines_run(events: int, tmp_path) -> int:
    """The Python lines of mlamem (its kernel adapters included) that `explain` runs on a
    synthetic snapshot of `events` events, each allocation of a size of its own (as many
    distinct sizes as allocations: the work per size is work per event), reading included."""
    path = tmp_path / f"s{events}.pickle"
    path.write_bytes(pickle.dumps(synthetic_snapshot(events, size_count=events)))
    at = scenario.load("glm5-fp8-tp8")
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename.startswith((PACKAGE, KERNELS)):
            count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        explain(path, at, "glm5-fp8-tp8", scenario_given=True, command="explain",
                kernel_names=["flashmla"])
    finally:
        sys.settrace(None)
    return count


def test_explain_work_grows_linearly_with_the_events(tmp_path):
    """From 1000 to 2000 to 4000 events, the lines run for the events added grow as the
    events do (at most 2.5x for twice as many added), and each added event costs a bounded
    number of lines: no work per event that grows with the trace, and none per distinct size
    beyond a few spec lookups (a bisection of the kernel's spec per size, once)."""
    work = [lines_run(n, tmp_path) for n in (1000, 2000, 4000)]
    first, second = work[1] - work[0], work[2] - work[1]
    assert second <= 2.5 * first, work
    assert second / 2000 < 150, work  # about 70 now; 1200 when each size cost 1024 lookups
