"""The user's server log, read without torch: a vLLM, SGLang or TensorRT-LLM log's engine (by
its lines, never the file's name), its version where printed, every memory figure it prints with
the line it came from, and every CUDA out-of-memory message with its traceback's frames.

A line it does not know is skipped. The units are the engines' own: vLLM's "GB" (model_runner's
`Loading model weights took`, `self.model_memory_usage / float(2**30)`, vLLM 0.5-0.7), SGLang's
"GB" (python/sglang/srt/utils.py `get_available_gpu_memory`, `free_gpu_memory / (1 << 30)`,
and model_runner.py's `mem usage` differences of it, SGLang 0.4-0.5) and torch's messages
(c10/cuda/CUDACachingAllocator.cpp `format_size`: 1024-based) are all GiB, read as such.
"""

from __future__ import annotations

import dataclasses
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mlamem.spec.errors import UserError
from mlamem.spec.files import read_bytes
from mlamem.spec.units import MAX_BYTES, format_huge

MAX_LOG_BYTES = 512 * 1024 * 1024  # a day of a busy server's log; more is the wrong file
MAX_LINE_CHARS = 16_384  # a longer line (a config dump) is read up to here
LINE_QUOTED_CHARS = 400  # a figure's line as quoted back
MAX_FRAMES = 40  # an OOM's traceback frames kept, innermost last

_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "GB": 2**30, "MB": 2**20}
_NUM = r"([\d][\d,]*(?:\.\d+)?)"
_SIZE = _NUM + r"\s*(GiB|MiB|KiB|GB|MB|B)\b"
_SIGNED_SIZE = "(-?" + _NUM[1:] + r"\s*(GiB|MiB|KiB|GB|MB|B)\b"  # a growth a pool can shrink by


@dataclass(frozen=True)
class Figure:
    """One memory figure the log prints: bytes for a size, a count for tokens and blocks."""

    name: str  # weights, non_torch, activation_peak, kv_cache, kv_cache_tokens, ... (FIGURES)
    value: int | float  # bytes (sizes), tokens, blocks, or a ratio (max_concurrency)
    line_number: int  # 1-based
    line: str  # the line it came from, stripped, cut at LINE_QUOTED_CHARS


@dataclass(frozen=True)
class OutOfMemory:
    """A CUDA out-of-memory message: what it tried, the device's total and free memory, what
    this process and PyTorch held, and the traceback's frames before it (innermost last)."""

    requested_bytes: int
    device: int | None
    total_bytes: int | None
    free_bytes: int | None
    process_bytes: int | None  # "this process has X memory in use"
    allocated_bytes: int | None  # "X is allocated by PyTorch"
    reserved_unallocated_bytes: int | None  # "Y is reserved by PyTorch but unallocated"
    line_number: int
    line: str
    frames: tuple[str, ...] = ()
    repeats: int = 1  # the same message again (one per rank, or re-raised): counted once


@dataclass(frozen=True)
class ServerLog:
    """What a server log holds that mlamem reads."""

    source: str  # the file's name, or "-" (standard input)
    engine: str | None  # "vllm", "sglang" or "trtllm"
    version: str | None
    figures: tuple[Figure, ...]
    ooms: tuple[OutOfMemory, ...]
    lines: int
    ran_path: str | None = None  # the decode path the user says the engine ran (--log-path)

    def first(self, name: str) -> Figure | None:
        """The first figure of that name (rank 0's, in a log of many ranks), else None."""
        return next((f for f in self.figures if f.name == name), None)


# What each figure is, as the ledger names it
FIGURES = {
    "weights": "the weights (after loading)",
    "non_torch": "non-torch memory (CUDA context, NCCL, libraries)",
    "activation_peak": "the profile pass's activation peak",
    "kv_cache": "the KV cache",
    "kv_cache_tokens": "the KV cache, in tokens",
    "kv_cache_blocks": "the KV cache, in blocks",
    "max_concurrency": "requests of the longest length the KV cache holds",
    "weights_and_non_torch": "the weights and non-torch memory, as one figure",
    "activation_peak_and_graph_estimate": "the profile's peak and the CUDA-graph estimate, as one "
                                          "figure",
    "cuda_graphs_estimated": "CUDA graphs, as estimated before KV sizing",
    "cuda_graphs_estimated_share": "the CUDA-graph estimate as a share of the total memory",
    "utilization": "the engine's gpu_memory_utilization",
    "cuda_graphs": "CUDA graphs, as captured",
    "total_gpu_memory": "the GPU's total memory",
    "requested_memory": "utilization x total",
    "free_at_startup": "free memory on the device at startup",
    "avail_before_weights": "free memory before loading the weights",
    "avail_after_weights": "free memory after loading the weights",
    "avail_after_pool": "free memory after the KV pool",
    "avail_after_graphs": "free memory after capturing CUDA graphs",
    "free_before_executor": "free memory before the executor's resources",
    "suggested_kv_cache_memory": "the engine's own suggestion for the KV cache",
}

# (engine, keyword checked first, pattern, [(figure name, group, kind)]); kind "size": a
# number and its unit (two groups), "count": an integer, "ratio": a float
_V, _S, _T = "vllm", "sglang", "trtllm"
_RULES = [
    (_V, "Model loading took", rf"Model loading took {_SIZE}", [("weights", 1, "size")]),
    (_V, "Loading model weights took", rf"Loading model weights took {_SIZE}",
     [("weights", 1, "size")]),
    (_V, "model weights take", rf"model weights take\s+{_SIZE}", [("weights", 1, "size")]),
    (_V, "non_torch_memory", rf"non_torch_memory(?: takes)?\s+{_SIZE}",
     [("non_torch", 1, "size")]),
    (_V, "activation peak memory", rf"activation peak memory(?: takes)?\s+{_SIZE}",
     [("activation_peak", 1, "size")]),
    (_V, "reserved for KV Cache is", rf"reserved for KV Cache is\s+{_SIZE}",
     [("kv_cache", 1, "size")]),
    (_V, "available_kv_cache_memory", rf"available_kv_cache_memory\s+{_SIZE}",
     [("kv_cache", 1, "size")]),
    (_V, "Available KV cache memory", rf"Available KV cache memory:\s*{_SIZE}",
     [("kv_cache", 1, "size")]),
    (_V, "GPU KV cache size", rf"GPU KV cache size:\s*{_NUM} tokens", [("kv_cache_tokens", 1, "count")]),
    (_V, "blocks:", rf"# (?:GPU|CUDA) blocks:\s*{_NUM}", [("kv_cache_blocks", 1, "count")]),
    (_V, "Maximum concurrency", rf"Maximum concurrency for {_NUM} tokens per request:\s*{_NUM}x",
     [("max_concurrency", 2, "ratio")]),
    (_V, "total_gpu_memory", rf"total_gpu_memory\s*\(?\s*{_SIZE}", [("total_gpu_memory", 1, "size")]),
    (_V, "instance can use", rf"instance can use\s+(?:.*=\s*)?{_SIZE}",
     [("requested_memory", 1, "size")]),
    (_V, "Graph capturing finished", rf"Graph capturing finished in .*?took\s+{_SIZE}",
     [("cuda_graphs", 1, "size")]),
    (_V, "CUDA graph", rf"[Ee]stimated CUDA graph memory:?\s*{_SIZE}",
     [("cuda_graphs_estimated", 1, "size")]),
    # vLLM 0.21-0.33 gpu_worker.py: the captured pool beside the estimate set aside before KV
    (_V, "CUDA graph pool memory", rf"CUDA graph pool memory:\s*{_SIGNED_SIZE} \(actual\),\s*"
     rf"{_SIGNED_SIZE} \(estimated\)", [("cuda_graphs", 1, "size"), ("cuda_graphs_estimated", 3, "size")]),
    # vLLM 0.21-0.33 gpu_worker.py determine_available_memory: the estimate as a share of the
    # total, "--gpu-memory-utilization=A is equivalent to ...=B without CUDA graph memory profiling"
    (_V, "without CUDA graph memory profiling",
     rf"--gpu-memory-utilization={_NUM} is equivalent to --gpu-memory-utilization={_NUM} "
     rf"without CUDA graph memory profiling",
     [("utilization", 1, "ratio"), ("cuda_graphs_estimated_share", 1, "share_drop")]),
    # vLLM 0.10.2-0.33.0 gpu_worker.py compile_or_warm_up_model, after capturing graphs: the
    # rank's split (INFO in 0.10.2 and from 0.26.0, DEBUG between), CUDAGraph memory the pool as
    # captured. Up to 0.26.0 "for weight ... for non-torch memory"; from 0.27.0 the free memory
    # the profile consumed as one figure, and its "peak activation" the transient peak plus the
    # graph estimate (determine_available_memory: transient_peak_headroom + the estimate)
    (_V, "for peak activation", rf"Actual usage is {_SIZE} for weight,\s*{_SIGNED_SIZE} for peak "
     rf"activation,\s*{_SIGNED_SIZE} for non-torch memory,\s*(?:and\s+)?{_SIGNED_SIZE} for CUDAGraph "
     "memory",
     [("weights", 1, "size"), ("activation_peak", 3, "size"), ("non_torch", 5, "size"),
      ("cuda_graphs", 7, "size")]),
    (_V, "for peak activation", rf"Actual usage is {_SIZE} for consumed memory \(weights \+ "
     rf"non-torch\),\s*{_SIGNED_SIZE} for peak activation,\s*(?:and\s+)?{_SIGNED_SIZE} for "
     "CUDAGraph memory",
     [("weights_and_non_torch", 1, "size"), ("activation_peak_and_graph_estimate", 3, "size"),
      ("cuda_graphs", 5, "size")]),
    # the same line's head, and init_device's refusal that starts as it does
    (_V, "Free memory on device", rf"Free memory on device \({_NUM}/{_NUM} GiB\) on startup",
     [("free_at_startup", 1, "free_of"), ("total_gpu_memory", 2, "gib")]),
    (_V, "esired GPU memory utilization", rf"[Dd]esired GPU memory utilization (?:is )?\({_NUM}, "
     rf"{_NUM} GiB\)", [("utilization", 1, "fraction"), ("requested_memory", 2, "gib")]),
    (_V, "kv-cache-memory", rf"--kv-cache-memory[= ]{_NUM}", [("suggested_kv_cache_memory", 1, "count")]),
    (_S, "Load weight begin", rf"Load weight begin\. avail mem={_SIZE}",
     [("avail_before_weights", 1, "size")]),
    (_S, "Load weight end", rf"Load weight end\..*?avail mem={_SIZE}, mem usage={_SIZE}",
     [("avail_after_weights", 1, "size"), ("weights", 3, "size")]),
    (_S, "KV Cache is allocated", rf"KV Cache is allocated\. #tokens: {_NUM}, K size: {_SIZE}, "
     rf"V size: {_SIZE}", [("kv_cache_tokens", 1, "count"), ("kv_cache", 2, "kv_pair")]),
    (_S, "KV Cache is allocated", rf"KV Cache is allocated\. #tokens: {_NUM}, KV size: {_SIZE}",
     [("kv_cache_tokens", 1, "count"), ("kv_cache", 2, "size")]),
    (_S, "Memory pool end", rf"Memory pool end\. avail mem={_SIZE}", [("avail_after_pool", 1, "size")]),
    (_S, "Capture cuda graph end", rf"Capture cuda graph end\..*?mem usage={_SIZE}\.? avail mem={_SIZE}",
     [("cuda_graphs", 1, "size"), ("avail_after_graphs", 3, "size")]),
    (_T, "for max tokens in paged KV cache",
     rf"Allocated {_SIZE} for max tokens in paged KV cache \({_NUM}\)",
     [("kv_cache", 1, "size"), ("kv_cache_tokens", 3, "count")]),
    (_T, "Total GPU memory (GiB)", rf"Total GPU memory \(GiB\):\s*{_NUM}",
     [("total_gpu_memory", 1, "gib")]),
    (_T, "Free GPU memory before component", rf"before component creation attempt \(GiB\):\s*{_NUM}",
     [("free_before_executor", 1, "gib")]),
    (_T, "Model:", rf"^\s*Model:\s*{_NUM}\s*/\s*{_NUM}\s*$", [("weights", 1, "gib_drop")]),
    (_T, "max_memory is set to", rf"max_memory is set to {_SIZE}", [("kv_cache", 1, "size")]),
]
_COMPILED = [(engine, key, re.compile(pattern), fields) for engine, key, pattern, fields in _RULES]

# Lines that say which engine wrote the log (besides its figures' lines)
_MARKERS = {
    _V: ("vllm/", "vLLM", "VllmWorker", "EngineCore", "vllm.", "[gpu_worker.py", "[kv_cache_utils.py"),
    _S: ("sglang/", "sglang.", "[TP0]", " TP0]", "Scheduler hit an exception"),
    _T: ("[TensorRT-LLM]", "[TRT-LLM]", "tensorrt_llm/", "TensorRT LLM"),
}
_VERSIONS = [
    (_V, re.compile(r"vLLM API server version:?\s*v?(\d+\.\d+\.\d+\S*)")),
    (_V, re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(\d+\.\d+\.\d+[^)\s]*)\)")),
    (_V, re.compile(r"█\s+version\s+(\d+\.\d+\.\d+\S*)")),
    (_S, re.compile(r"\bsglang(?:\s+version:?|==|\s+v)\s*(\d+\.\d+\.\d+\S*)", re.IGNORECASE)),
    (_T, re.compile(r"TensorRT[- ]LLM version:?\s*(\d+\.\d+\.\d+\S*)")),
]

_OOM = re.compile(rf"out of memory\. Tried to allocate {_SIZE}\.?(?: GPU (\d+) has a total "
                  rf"capacity of {_SIZE} of which {_SIZE} is free\.)?")
_OOM_OLD = re.compile(rf"out of memory\. Tried to allocate {_SIZE} \(GPU (\d+); {_SIZE} total "
                      rf"capacity; {_SIZE} already allocated; {_SIZE} free")
# A message whose line ends after the request, as reports wrap it ("Tried to allocate 1.02 GiB."
# then "GPU 6 has a total capacity of ..." on the next line): read with the lines that continue it
_OOM_CUT = re.compile(rf"out of memory\. Tried to allocate {_SIZE}\.?\s*$")
_CONTINUED = ("memory in use", "allocated by PyTorch", "reserved by PyTorch", "private pools")
MAX_WRAPPED_CHARS = 1_000  # a whole message is under this; a longer one is not one message
_PROCESS = re.compile(rf"this process has {_SIZE} memory in use")
_TORCH = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch.*?and {_SIZE} is "
                    r"reserved by PyTorch but unallocated")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


class _Impossible(Exception):
    """A figure no GPU's log prints: the line was edited, or the server computed a size wrong."""


def _size(number: str, unit: str) -> int:
    value = float(number.replace(",", "")) * _UNIT[unit]
    if not value <= MAX_BYTES:  # also inf
        raise _Impossible(f"{number[:24]} {unit} is more than any device has "
                          f"({format_huge(MAX_BYTES)})")
    return round(value)


def _value(match: re.Match, group: int, kind: str) -> int | float:
    g = match.group
    if kind == "size":
        return _size(g(group), g(group + 1))
    if kind == "kv_pair":  # SGLang's K and V pools, each a number and its unit
        return _size(g(group), g(group + 1)) + _size(g(group + 2), g(group + 3))
    if kind == "gib":
        return _size(g(group), "GiB")
    if kind == "gib_drop":  # TRT-LLM's "Model: free before / free after" (GiB)
        return round((float(g(group)) - float(g(group + 1))) * 2**30)
    if kind == "ratio":
        return float(g(group).replace(",", ""))
    if kind == "fraction":  # a utilization vLLM takes: (0, 1] (config/cache.py)
        value = float(g(group).replace(",", ""))
        if not 0 < value <= 1:
            raise _Impossible(f"a gpu-memory-utilization of {g(group)[:24]} is none vLLM takes")
        return value
    if kind == "free_of":  # GiB free of the GiB total the next group gives
        free, total = _size(g(group), "GiB"), _size(g(group + 1), "GiB")
        if total == 0 or free > total:
            raise _Impossible(f"{g(group)[:24]} GiB free of {g(group + 1)[:24]} GiB is no "
                              "device's reading")
        return free
    if kind == "share_drop":  # vLLM's utilization less its equivalent without the graph estimate
        given, without = float(g(group).replace(",", "")), float(g(group + 1).replace(",", ""))
        if not 0 <= without <= given <= 1:
            raise _Impossible(f"a gpu-memory-utilization of {g(group)[:24]} equivalent to "
                              f"{g(group + 1)[:24]} is no utilization vLLM prints")
        return round(given - without, 4)
    return int(g(group).replace(",", ""))


@dataclass
class _Reader:
    """One pass over the lines: figures, OOMs, the engine's votes, the open traceback."""

    figures: list[Figure] = field(default_factory=list)
    ooms: list[OutOfMemory] = field(default_factory=list)
    votes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_MARKERS, 0))
    versions: dict[str, str] = field(default_factory=dict)
    frames: list[str] = field(default_factory=list)
    lines: int = 0
    wrapped: tuple[int, str] | None = None  # an OOM message cut at its line's end, and its line
    split: tuple[int, str] | None = None  # vLLM's split of the rank, wrapped as reports quote it

    def read(self, number: int, line: str) -> None:
        self.lines = number
        if self.wrapped is not None and _continues(self.wrapped[1], line):
            self.wrapped = (self.wrapped[0], f"{self.wrapped[1]} {line.strip()}")
            return
        if self.split is not None and _continues_split(self.split[1], line):
            self.split = (self.split[0], f"{self.split[1]} {line.strip()}")
            if SPLIT_END in line:
                self.flush()
            return
        self.flush()
        if SPLIT_START in line and SPLIT_END not in line:
            self.split = (number, line.strip())
            return
        self._read_at(number, line, self._figures)

    def flush(self) -> None:
        """The wrapped OOM message, and vLLM's wrapped split, read with the lines that go on
        them."""
        split, wrapped, self.split, self.wrapped = self.split, self.wrapped, None, None
        if split is not None:
            self._read_at(*split, self._figures)
        if wrapped is not None:
            self._read_at(*wrapped, self._oom)

    @staticmethod
    def _read_at(number: int, text: str, read) -> None:
        """`read` of the text from line `number`: a figure no server prints is one line."""
        try:
            read(number, text)
        except _Impossible as exc:
            raise _impossible(number, exc) from None

    def _figures(self, number: int, line: str) -> None:
        for engine, key, pattern, fields in _COMPILED:
            if key in line and (match := pattern.search(line)):
                self.votes[engine] += 2
                quoted = line.strip()[:LINE_QUOTED_CHARS]
                self.figures += [Figure(name, _value(match, group, kind), number, quoted)
                                 for name, group, kind in fields]
        for engine, markers in _MARKERS.items():
            if any(marker in line for marker in markers):
                self.votes[engine] += 1
        if "ersion" in line or "LLM engine (v" in line or "sglang" in line:
            for engine, pattern in _VERSIONS:
                if engine not in self.versions and (match := pattern.search(line)):
                    self.versions[engine] = match.group(1)
                    self.votes[engine] += 2
        self._traceback(line)
        if "out of memory" in line:
            if _OOM_CUT.search(line):  # a report wraps it: the next lines may hold the rest
                self.wrapped = (number, line.strip())
            else:
                self._oom(number, line)

    def _traceback(self, line: str) -> None:
        if "Traceback (most recent call last)" in line:
            self.frames = []
        elif 'File "' in line and (match := _FRAME.search(line)):
            path = match.group(1)
            for root in ("site-packages/", "dist-packages/"):
                path = path.rpartition(root)[2] or path
            self.frames.append(f"{path}:{match.group(2)} {match.group(3)}")
            del self.frames[:-MAX_FRAMES]

    def _oom(self, number: int, line: str) -> None:
        new = _old_message(line) or _message(line)
        if new is None:
            return
        _check_possible(new)
        new = OutOfMemory(**new, line_number=number, line=line.strip()[:LINE_QUOTED_CHARS],
                          frames=tuple(self.frames))
        for i, seen in enumerate(self.ooms):
            if _same(seen, new):
                self.ooms[i] = _counted(seen, new)
                return
        self.ooms.append(new)


def _impossible(number: int, exc: _Impossible) -> UserError:
    return UserError(f"line {number}: {exc}; pass the server's log as it wrote it")


def _continues(text: str, line: str) -> bool:
    """Whether `line` goes on the wrapped OOM message `text`: first the GPU's total, then what
    the process and PyTorch held; never another message, nor past a whole message's length."""
    line = line.strip()
    if "out of memory" in line or len(text) + len(line) > MAX_WRAPPED_CHARS:
        return False
    if "total capacity" not in text:
        return line.startswith("GPU ") and "total capacity" in line
    return any(part in line for part in _CONTINUED)


# vLLM's split of the rank ("Actual usage is ... for CUDAGraph memory"), which reports quote over
# several lines: its start, and its end
SPLIT_START, SPLIT_END = "Actual usage is", "for CUDAGraph memory"


def _continues_split(text: str, line: str) -> bool:
    """Whether `line` goes on vLLM's wrapped split `text`: a line of figures before its end,
    never another split, nor past a whole message's length."""
    return (SPLIT_START not in line and SPLIT_END not in text
            and len(text) + len(line) <= MAX_WRAPPED_CHARS and "GiB for" in line)


def _check_possible(oom: dict) -> None:
    """An OOM message's figures as a GPU prints them: a total, and no more free than it."""
    total, free = oom["total_bytes"], oom["free_bytes"]
    if total == 0:
        raise _Impossible("the OOM message gives the GPU a total capacity of 0 B")
    if total is not None and free is not None and free > total:
        raise _Impossible(f"the OOM message gives the GPU more free than its total "
                          f"({free} B free of {total} B)")


def _message(line: str) -> dict | None:
    match = _OOM.search(line)
    if match is None:
        return None
    g = match.group
    process, torch_held = _PROCESS.search(line), _TORCH.search(line)
    return {"requested_bytes": _size(g(1), g(2)),
            "device": int(g(3)) if g(3) is not None else None,
            "total_bytes": _size(g(4), g(5)) if g(4) else None,
            "free_bytes": _size(g(6), g(7)) if g(6) else None,
            "process_bytes": _size(*process.groups()) if process else None,
            "allocated_bytes": _size(torch_held.group(1), torch_held.group(2)) if torch_held else None,
            "reserved_unallocated_bytes": (_size(torch_held.group(3), torch_held.group(4))
                                           if torch_held else None)}


def _old_message(line: str) -> dict | None:
    """torch before 2.1: `(GPU 0; 79.15 GiB total capacity; X already allocated; Y free; ...`."""
    match = _OOM_OLD.search(line)
    if match is None:
        return None
    g = match.group
    return {"requested_bytes": _size(g(1), g(2)), "device": int(g(3)),
            "total_bytes": _size(g(4), g(5)), "free_bytes": _size(g(8), g(9)),
            "process_bytes": None, "allocated_bytes": _size(g(6), g(7)),
            "reserved_unallocated_bytes": None}


def _same(a: OutOfMemory, b: OutOfMemory) -> bool:
    keys = ("requested_bytes", "device", "total_bytes", "free_bytes")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _counted(seen: OutOfMemory, new: OutOfMemory) -> OutOfMemory:
    """The first message, counted once more; its frames, or the repeat's where it had none,
    and the repeat's PyTorch figures where the first was cut short."""
    fill = {k: getattr(new, k) for k in ("process_bytes", "allocated_bytes",
                                        "reserved_unallocated_bytes") if getattr(seen, k) is None}
    return dataclasses.replace(seen, repeats=seen.repeats + 1, frames=seen.frames or new.frames,
                               **fill)


def parse_lines(lines, source: str = "-") -> ServerLog:
    """The log's figures from its lines (str); the engine is the one its lines name most."""
    reader = _Reader()
    for number, line in enumerate(lines, start=1):
        reader.read(number, line[:MAX_LINE_CHARS])
    reader.flush()
    engine = max(reader.votes, key=reader.votes.get) if any(reader.votes.values()) else None
    return ServerLog(source=source, engine=engine, version=reader.versions.get(engine),
                     figures=tuple(reader.figures), ooms=tuple(reader.ooms), lines=reader.lines)


def read_log(path: str, field_name: str = "log", ran_path: str | None = None) -> ServerLog:
    """The server log at `path` (`-`: standard input), at most MAX_LOG_BYTES, its bytes
    decoded as UTF-8 with anything else replaced; a UserError in one line where it holds no
    line mlamem knows (neither a memory figure nor an OOM message). `ran_path`: the decode
    path the user says its engine ran, where they say it."""
    data = _stdin_bytes(field_name) if path == "-" else read_bytes(
        Path(path), "server log", field_name, limit=MAX_LOG_BYTES)
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline=None)
    try:
        log = parse_lines(text, source=path)
    except UserError as exc:  # a line no server prints
        raise UserError(f"{path}: {exc.message}", field=field_name) from None
    if not log.figures and not log.ooms:
        raise UserError(f"{path}: no line of a vLLM, SGLang or TensorRT-LLM log mlamem reads "
                        f"(no memory figure, no CUDA out-of-memory message) in {log.lines} lines; "
                        "pass the server's own log", field=field_name)
    return dataclasses.replace(log, ran_path=ran_path)


def _stdin_bytes(field_name: str) -> bytes:
    data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        raise UserError(f"standard input is more than a server log can be ({MAX_LOG_BYTES} "
                        "bytes); pass the right log", field=field_name)
    return data
