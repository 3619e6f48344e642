"""mlamem.runtime.frames: an allocation's frame, the same string from the allocator trace's stacks
and from the interpreter's stack a predicted allocation takes."""

import sys

import torch
from torch._C._profiler import gather_traceback, symbolize_tracebacks

from mlamem.runtime.frames import NO_FRAMES, frame_label, python_frames
from mlamem.runtime.memory import SimulatedMemory


def _both_stacks():
    """This line's stack as torch's trace gathers it (the capture behind
    `_record_memory_history(stacks="python")`) and as python_frames walks it."""
    return gather_traceback(python=True, script=False, cpp=False), python_frames()


def test_python_frames_are_the_stack_torchs_trace_records():
    """Innermost first, {filename, line, name}: the same frames as torch's own capture, so
    one label names a measured and a predicted allocation alike."""
    captured, walked = _both_stacks()
    [symbolized] = symbolize_tracebacks([captured])
    assert walked == [{k: f[k] for k in ("filename", "line", "name")} for f in symbolized]
    line = _both_stacks.__code__.co_firstlineno + 3
    assert frame_label(walked) == f"tests/test_frames.py:{line} _both_stacks"


def _frame(filename: str, line: int = 1, name: str = "f") -> dict:
    return {"filename": filename, "line": line, "name": name}


def test_the_label_is_the_innermost_frame_outside_the_libraries():
    """torch, mlamem (its package, its console script, its kernel adapters in a checkout) and
    the kernel libraries are skipped; with nothing else, the innermost outside torch."""
    site = "/venv/lib/python3.11/site-packages"
    user = _frame("/home/me/model/layer.py", 42, "forward")
    stack = [_frame(f"{site}/torch/nn/functional.py"), _frame(f"{site}/mlamem/paths.py"),
             _frame("/src/mlamem-checkout/kernels/flashmla.py"),
             _frame(f"{site}/flash_mla/flash_mla_interface.py"), user,
             _frame("/venv/bin/mlamem", 8, "<module>")]
    assert frame_label(stack) == "model/layer.py:42 forward"
    assert frame_label(stack[:4]) == "mlamem/paths.py:1 f"
    nested = _frame(f"{site}/mlamem/engines/base.py", 7, "step")  # named from the package down
    assert frame_label([stack[0], nested]) == "mlamem/engines/base.py:7 step"
    assert frame_label([stack[0], stack[-1]]) == "bin/mlamem:8 <module>"  # only if all are ours
    assert frame_label([]) == NO_FRAMES


def test_the_cpp_frames_of_a_default_snapshot_are_passed_over():
    """`_record_memory_history()` records C++ frames too (stacks="all"): `??` where symbols
    are missing (or an empty name: the H200's torch 2.11 gave the caching allocator's frame as
    ""), a .cpp source, a shared library. The label is still the user's Python frame, as the
    H200's plain PyTorch snapshot showed (it read `??:0 torch::unwind::unwind()`, then
    `:0 c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(...)`)."""
    user = _frame("<string>", 12, "layer")
    native = [_frame("??", 0, "torch::unwind::unwind()"),
              _frame("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc"),
              _frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1080, "malloc"),
              _frame("/usr/lib/libtorch_cuda.so", 0, "at::empty"),
              _frame("/opt/lib/libcudart.so.13", 0, "cudaMalloc")]
    assert frame_label([*native, _frame("/venv/lib/site-packages/torch/cuda/memory.py"), user,
                        *native]) == "<string>:12 layer"
    assert frame_label(native) == "??:0 torch::unwind::unwind()"  # nothing else to name


def test_a_predicted_allocation_takes_its_stack_only_under_a_trace():
    """SimulatedMemory(record_stacks=True): an allocation inside the watch carries the stack of
    the code whose op allocated (the dispatch hook's own frames left out); without
    record_stacks, the trace's frames stay empty, as torch's without context."""
    for record_stacks in (True, False):
        memory = SimulatedMemory(record_stacks=record_stacks)
        with memory, memory.watch() as watch:
            line = sys._getframe().f_lineno + 1
            kept = torch.empty(1024, device="meta")
        [alloc] = [e for e in watch.events if e["action"] == "alloc"]
        assert kept.numel() == 1024
        if record_stacks:
            assert alloc["frames"][0] == _frame(__file__, line, sys._getframe().f_code.co_name)
        else:
            assert alloc["frames"] == []
