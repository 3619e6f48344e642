"""mlamem's pytest plugin (entry point pytest11): GPU memory limits on tests.

- `@pytest.mark.limit_gpu_memory("2GiB")` fails the test when the GPU peak allocated inside its
  body exceeds the limit; the failure carries the breakdown table (`Tracker.table`).
- `@pytest.mark.max_gpu_allocations(0)` fails the test when its body allocates more than that
  many times: 0 is the CUDA-graph-safety check. The failure lists what was allocated.
- Both take `expect=` (name -> bytes, (shape, dtype), ...; see `mlamem.track`) to name the
  buffers, and `device="meta"` to predict on the meta device instead of measuring.
- The `gpu_memory` fixture gives `track` and `profile_call`, for a test that measures one call.

The measurement window is the test function's body: fixtures run in setup, before it, so inputs
and workspaces built in fixtures are not counted. Without CUDA, a marked test (without
device="meta") is skipped, with the reason. A bad argument, an unknown keyword, a device other
than CUDA or meta, and a mark misspelt (limit_gpu_memroy) fail the test in one line.

The plugin loads in every pytest session where mlamem is installed, so importing it imports
neither torch nor rich nor any kernel: they load when a marked test or the fixture runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from mlamem.spec.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mlamem.api import Tracker

LIMIT = "limit_gpu_memory"
MAX_ALLOCATIONS = "max_gpu_allocations"
MARKERS = {
    LIMIT: "limit_gpu_memory(limit, *, expect=None, device=None): fail when the GPU peak "
           "allocated inside the test body exceeds limit ('2GiB', or bytes); mlamem",
    MAX_ALLOCATIONS: "max_gpu_allocations(count, *, expect=None, device=None): fail when the "
                     "test body allocates GPU memory more than count times (0: CUDA-graph "
                     "safe); mlamem",
}
LIMITS = pytest.StashKey["Limits"]()  # a marked test's limits, checked in setup
TRACKED = pytest.StashKey["Tracker"]()  # its body's figures
SUMMARY = pytest.StashKey[list]()  # the terminal summary's lines


@dataclass(frozen=True)
class Limits:
    """What a test's marks ask of its body."""

    limit_bytes: int | None  # limit_gpu_memory, in bytes
    max_allocations: int | None  # max_gpu_allocations
    expect: dict = field(default_factory=dict)  # buffer names, both marks' merged
    device: str | None = None  # None: CUDA; "meta": predicted


def limits_of(item: pytest.Item) -> Limits | None:
    """The marks' arguments, checked; None for a test without them. A bad argument fails the
    test (in setup) with one line naming the fix."""
    marks = {name: item.get_closest_marker(name) for name in MARKERS}
    if not any(marks.values()):
        return None
    limit = count = None
    expect, devices = {}, set()
    for name, mark in marks.items():
        if mark is None:
            continue
        unknown = sorted(set(mark.kwargs) - {"expect", "device"})
        if len(mark.args) != 1 or unknown:
            what = f"unknown keyword {', '.join(map(repr, unknown))}; " if unknown else ""
            pytest.fail(f"{item.nodeid}: {name}: {what}write "
                        f"@pytest.mark.{MARKERS[name].split(':')[0]}", pytrace=False)
        expect.update(_expect(item, name, mark.kwargs.get("expect")))
        devices.add(_device(item, name, mark.kwargs.get("device")))
        if name == LIMIT:
            limit = _limit_bytes(item, mark.args[0])
        else:
            count = mark.args[0]
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                pytest.fail(f"{item.nodeid}: max_gpu_allocations({count!r}): give a count >= 0",
                            pytrace=False)
    if len(devices) > 1:
        pytest.fail(f"{item.nodeid}: the marks name different devices {sorted(map(str, devices))};"
                    " give one", pytrace=False)
    device = devices.pop()
    return Limits(limit, count, expect, None if device is None else str(device))


def _expect(item: pytest.Item, name: str, expect: Any) -> dict:
    """The mark's expect= (name -> bytes, (shape, dtype), ...), checked as `track` checks it;
    anything else fails the test in one line."""
    if expect is None:
        return {}
    from mlamem.api import expected_from  # torch: only for a test that asks for it

    try:
        expected_from(expect)
    except TypeError as exc:
        problem = str(exc)  # failed outside the handler: no chained traceback in the report
    else:
        return dict(expect)
    pytest.fail(f"{item.nodeid}: {name}: {problem}", pytrace=False)


def _device(item: pytest.Item, name: str, device: Any) -> Any:
    """The mark's device: None (CUDA), a CUDA device or meta; anything else (a typo such as
    "mta") fails the test instead of skipping it as a CUDA test."""
    if device is None or re.fullmatch(r"(cuda|meta)(:[0-9]+)?", str(device)):
        return device
    pytest.fail(f"{item.nodeid}: {name}(device={device!r}): give device=\"meta\" to predict, or "
                "leave it out (or a CUDA device) to measure", pytrace=False)


def _limit_bytes(item: pytest.Item, limit: Any) -> int:
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return limit
    try:
        parsed = parse_bytes(limit) if isinstance(limit, str) else 0
    except ValueError as exc:
        problem = str(exc)  # failed outside the handler: no chained traceback in the report
    else:
        problem = None
    if problem is not None:
        pytest.fail(f"{item.nodeid}: limit_gpu_memory: {problem}", pytrace=False)
    if parsed <= 0:
        pytest.fail(f"{item.nodeid}: limit_gpu_memory({limit!r}): give a size above 0, e.g. "
                    "'2GiB'", pytrace=False)
    return parsed


def cuda_missing_reason(device: str | None) -> str | None:
    """Why a marked test cannot be measured here (no CUDA); None when it can, or predicts."""
    if device is not None and device.startswith("meta"):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return ("mlamem: no CUDA device to measure GPU memory on (torch.cuda.is_available() is "
            'False); give the mark device="meta" to predict instead')


def pytest_configure(config: pytest.Config) -> None:
    for text in MARKERS.values():
        config.addinivalue_line("markers", text)
    config.stash[SUMMARY] = []


def _check_mark_names(item: pytest.Item) -> None:
    """A mark named almost as one of ours (limit_gpu_memroy) fails the test: pytest would only
    warn, and run it unlimited."""
    import difflib

    for mark in item.iter_markers():
        close = difflib.get_close_matches(mark.name, list(MARKERS), n=1, cutoff=0.8)
        if close and mark.name not in MARKERS:
            pytest.fail(f"{item.nodeid}: unknown mark {mark.name!r}: did you mean "
                        f"@pytest.mark.{close[0]}?", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a marked test without CUDA before its fixtures run; check the marks' arguments."""
    _check_mark_names(item)
    limits = limits_of(item)
    if limits is None:
        return
    reason = cuda_missing_reason(limits.device)
    if reason is not None:
        pytest.skip(reason)
    item.stash[LIMITS] = limits


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Measure the test function's body (fixtures are already set up) for the marks."""
    limits = pyfuncitem.stash.get(LIMITS, None)
    if limits is None:
        yield
        return
    from mlamem.api import Tracker

    tracker = Tracker(expect=limits.expect, device=limits.device)
    tracker.__enter__()
    outcome = yield
    tracker.__exit__(*(outcome.excinfo or (None, None, None)))  # the body's error stands
    pyfuncitem.stash[TRACKED] = tracker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A passed body that broke a mark fails, with the breakdown; every measured body's peak
    goes to the terminal summary."""
    outcome = yield
    tracker = item.stash.get(TRACKED, None)
    if call.when != "call" or tracker is None or tracker.call is None:
        return  # no call, or a body stopped by a test outcome (pytest.skip, an async def)
    limits = item.stash[LIMITS]
    report = outcome.get_result()
    problems = broken_limits(tracker, limits)
    if problems and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join([*problems, "", tracker.table()])
    item.config.stash[SUMMARY].append(summary_line(item.nodeid, tracker, limits))


def broken_limits(tracker: Tracker, limits: Limits) -> list[str]:
    """One line per mark the measured body broke."""
    problems = []
    peak = tracker.peak_allocated_bytes
    if limits.limit_bytes is not None and peak is not None and peak > limits.limit_bytes:
        problems.append(f"GPU peak allocated {format_bytes(peak)} ({peak} B){_tag(tracker)} "
                        f"exceeds limit_gpu_memory {format_bytes(limits.limit_bytes)} "
                        f"({limits.limit_bytes} B)")
    count = tracker.allocations_in_call
    if limits.max_allocations is not None and count is not None and count > limits.max_allocations:
        made = ", ".join(_made(b) for b in tracker.buffers)
        problems.append(f"{count} GPU allocation{'' if count == 1 else 's'} inside the test body"
                        f"{_tag(tracker)}, max_gpu_allocations({limits.max_allocations}): {made}")
    return problems


def _made(buffer) -> str:
    """An allocation in the failure message: its name (an expected buffer's, else its frame),
    its size, and the frame that made it where the name is not that frame."""
    where = "" if buffer.frame in (None, buffer.name) else f" at {buffer.frame}"
    return f"{buffer.name} {format_bytes(buffer.requested_bytes)}{where}"


def summary_line(nodeid: str, tracker: Tracker, limits: Limits) -> str:
    """One test's peak for the terminal summary."""
    if tracker.peak_allocated_bytes is None:
        return f"{nodeid}: {tracker.summary()}"
    limit = ("" if limits.limit_bytes is None
             else f" (limit {format_bytes(limits.limit_bytes)})")
    return (f"{nodeid}: peak allocated {format_bytes(tracker.peak_allocated_bytes)}{limit}"
            f"{_tag(tracker)}, {tracker.allocations_in_call} "
            f"allocation{'' if tracker.allocations_in_call == 1 else 's'} inside")


def _tag(tracker: Tracker) -> str:
    return "" if tracker.measured else " (PREDICTED)"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.write_sep("-", "mlamem GPU memory (test bodies)")
        for line in lines:
            terminalreporter.write_line(line)


class GpuMemory:
    """The `gpu_memory` fixture: `mlamem.track` and `mlamem.profile_call`, skipping the test
    where there is no CUDA device and none of them asked for device="meta"."""

    def track(self, expect: Mapping[str, Any] | None = None, device: Any = None) -> Tracker:
        from mlamem.api import track

        return self._or_skip(track, expect=expect, device=device)

    def profile_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tracker:
        from mlamem.api import profile_call

        return self._or_skip(profile_call, fn, *args, **kwargs)

    @staticmethod
    def _or_skip(start: Callable[..., Tracker], *args: Any, **kwargs: Any) -> Tracker:
        from mlamem.api import NoCudaError

        try:
            return start(*args, **kwargs)
        except NoCudaError as exc:
            pytest.skip(f"mlamem: {exc}")


@pytest.fixture
def gpu_memory() -> GpuMemory:
    """A tracker factory: `with gpu_memory.track(expect=...) as t:` or
    `gpu_memory.profile_call(fn, *args)`; the test is skipped without CUDA (device="meta"
    predicts instead)."""
    return GpuMemory()
