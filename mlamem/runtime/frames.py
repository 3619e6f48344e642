"""Where an allocation comes from: the Python frame that asked for it, as one label.

The allocator trace of a measured call gives each event its Python stack (`frames`, innermost
first, each {filename, line, name}: `torch.cuda.memory._record_memory_history(context="alloc",
stacks="python")`); a predicted call takes the same stack from the interpreter as the dispatch
hook sees the allocation (`python_frames`). `frame_label` names either, the same way: the
innermost Python frame outside torch, mlamem and the kernel libraries, as `file:line function`
(a snapshot recorded with `stacks="all"` also holds C++ frames, which it passes over).
"""

from __future__ import annotations

import functools
import sys
from pathlib import PurePath

# A frame in these packages is the machinery, not the caller: the frame named is the innermost
# outside them (typer and click run mlamem's own CLI).
LIBRARIES = frozenset({"torch", "mlamem", "flash_mla", "flashinfer", "sgl_kernel", "triton",
                       "typer", "click"})
# mlamem's kernel adapters, which a checkout installed in place runs from kernels/, not mlamem/
ADAPTER_FILES = frozenset({"flashmla.py", "flashmla_vllm.py", "flashinfer_mla.py", "reference.py"})
TORCH = frozenset({"torch"})
NO_FRAMES = "no frames"
NATIVE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".so"})


def python_frames(skip: int = 1) -> list[dict]:
    """The caller's Python stack as torch's trace records it: innermost first, each
    {filename, line, name}; `skip` frames are left out (1: this function's)."""
    frames, frame = [], sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        frames.append({"filename": code.co_filename, "line": frame.f_lineno or 0,
                       "name": code.co_name})
        frame = frame.f_back
    return frames


def frame_label(frames: list[dict]) -> str:
    """The innermost frame outside the LIBRARIES as `file:line function`; else the innermost
    outside torch; NO_FRAMES where the trace has none."""
    if not frames:
        return NO_FRAMES
    frames = [f for f in frames if _is_python(f["filename"])] or frames  # C++ frames out
    outside = [f for f in frames if not _in_libraries(f["filename"])]
    chosen = (outside or [f for f in frames if not _in(f["filename"], TORCH)] or frames)[0]
    return f"{_short(chosen['filename'])}:{chosen['line']} {chosen['name']}"


@functools.lru_cache(maxsize=4096)  # a stack's files repeat: each is parsed once
def _in_libraries(filename: str) -> bool:
    path = PurePath(filename)
    adapter = path.name in ADAPTER_FILES and path.parent.name == "kernels"  # mlamem's adapters
    script = path.name == "mlamem" and path.parent.name in ("bin", "Scripts")  # console script
    return adapter or script or _in(filename, LIBRARIES) or filename.startswith("<frozen")


class StackLabels:
    """`frame_label` of the stacks of one snapshot, each computed once: torch's snapshot shares
    its frame objects among the events and blocks of one stack, so a stack is known by the ids
    of its frames (the frames are kept, so the ids stay theirs)."""

    def __init__(self) -> None:
        self._labels: dict[tuple[int, ...], tuple[str, list[dict]]] = {}

    def __call__(self, frames: list[dict]) -> str:
        key = tuple(map(id, frames))
        found = self._labels.get(key)
        if found is None:
            found = self._labels[key] = (frame_label(frames), frames)
        return found[0]


@functools.lru_cache(maxsize=4096)
def _is_python(filename: str) -> bool:
    """Not one of the C++ frames a snapshot recorded with `stacks="all"` (the default) holds
    beside the Python ones: `??` or an empty file name where symbols are missing (the H200's
    torch 2.11 writes "" for the caching allocator's frames), else a C/C++/CUDA source or a
    shared library."""
    path = PurePath(filename)
    return filename not in ("", "??") and path.suffix not in NATIVE_SUFFIXES and ".so." not in path.name


@functools.lru_cache(maxsize=4096)
def _in(filename: str, packages: frozenset[str]) -> bool:
    return any(part in packages for part in PurePath(filename).parts[:-1])


def _short(filename: str) -> str:
    """The file's last two path parts (`flash_mla/flash_mla_interface.py`); one of mlamem's own,
    from its package down (`mlamem/runtime/paths.py`, `mlamem/engines/base.py`)."""
    folders = PurePath(filename).parts[:-1]
    if "mlamem" in folders:
        return "/".join(PurePath(filename).parts[len(folders) - folders[::-1].index("mlamem") - 1:])
    return "/".join(PurePath(filename).parts[-2:])
