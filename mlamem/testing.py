"""Helpers for mlamem's tests (and yours): error checks, fixed seeds, random decode inputs,
scenario files, synthetic memory snapshots of any size, and skip markers for GPU-only tests.

Importing this module imports neither pytest nor torch nor a kernel: the input helpers import
torch when called, and the markers `needs_flashmla` and `no_gpu` are built (importing pytest and
the FlashMLA adapter) on first access.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlamem.commands.shards import ITEMS, Shard, units_of
from mlamem.runtime import nvml
from mlamem.runtime.non_torch import load_setups
from mlamem.spec.errors import UserError

if TYPE_CHECKING:
    import torch

CACHE_BLOCK_TOKENS = 64  # tokens per KV-cache block in random_decode_inputs


def one_line_error(capsys) -> str:
    """The single stderr line of a failed command, checked to be `mlamem: error: ...`."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mlamem: error:"), err
    return err[0]


def check_command_reads_back(command: str, **build: Any) -> None:
    """A serve command (`serve_command.from_command`'s `build` keywords) makes a scenario whose
    TOML reads back as it was written, or is refused in one line (a UserError)."""
    from mlamem.spec import scenario  # pydantic: loaded where a scenario is
    from mlamem.spec.serve_command import from_command

    try:
        built = from_command(command, **build)
    except UserError as error:
        message = str(error)
        assert "\n" not in message, message
        return
    again = scenario.parse(scenario.to_toml(built.scenario), "again")
    assert scenario.to_dict(again) == scenario.to_dict(built.scenario)


def check_bad_input(args: Sequence[str], fix: str | tuple[str, ...] | None = None, *,
                    watch: Path | None = None, code: int = 2) -> str:
    """Run `mlamem ARGS` in this process, from a fresh empty working folder, and check what bad
    input must give: exit `code` (2), nothing on stdout, exactly one stderr line, starting
    `mlamem: error:` and containing `fix` if given (a tuple: one of its wordings), no traceback,
    and no file left behind, neither in the working folder nor under `watch` (created, changed or
    removed). Returns the line; an AssertionError says what differs."""
    import contextlib
    import io
    import os
    import shlex
    import tempfile
    import traceback

    from mlamem.cli import main

    command = "mlamem " + shlex.join(map(str, args))
    before = _files_under(watch) if watch is not None else None
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory(prefix="mlamem-bad-input-") as folder:
        here = os.getcwd()
        os.chdir(folder)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                returned = main([str(a) for a in args])
        except BaseException:  # noqa: BLE001 (anything that escapes main is a traceback)
            raise AssertionError(f"{command} raised:\n{traceback.format_exc()}") from None
        finally:
            os.chdir(here)
        left = _files_under(Path(folder))
    lines = err.getvalue().splitlines()
    problems = []
    if returned != code:
        problems.append(f"exit {returned}, not {code}")
    if out.getvalue():
        problems.append(f"stdout is not empty: {out.getvalue()[:200]!r}")
    if "Traceback" in err.getvalue():
        problems.append("a traceback")
    if len(lines) != 1 or not lines[0].startswith("mlamem: error:"):
        problems.append(f"stderr is not one 'mlamem: error:' line: {lines}")
    elif fix is not None and not any(w in lines[0] for w in ((fix,) if isinstance(fix, str) else fix)):
        problems.append(f"the line does not say {fix!r}: {lines[0]!r}")
    if left:
        problems.append(f"left files in the working folder: {sorted(left)}")
    if before is not None and _files_under(watch) != before:
        problems.append(f"changed files under {watch}")
    if problems:
        raise AssertionError(f"{command}: {'; '.join(problems)}")
    return lines[0]


def _files_under(folder: Path) -> dict[str, tuple[int, int] | None]:
    """Every file and folder under `folder`: relative path -> (size, mtime in ns) for a file,
    None for a folder (whose mtime moves when a file is tried there and removed)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else (p.stat().st_size,
                                                                 p.stat().st_mtime_ns)
            for p in sorted(Path(folder).rglob("*"))}


def seed_for(name: str) -> int:
    """A seed fixed by a name (a test's node id): every run draws the same inputs, and a
    failure names its seed in its message."""
    return zlib.crc32(name.encode())


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in float32: the error of an output `a` against a reference `b`."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def random_decode_inputs(s_q: int, h_q: int, topk: int, *, seed: int,
                         pool_tokens: int | None = None, invalid_fraction: float = 0.2,
                         cache_scale: float = 1.0, device: str | torch.device = "cpu",
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random inputs of one sparse decode call, drawn on `device` from `seed`.

    - q: (1, s_q, h_q, 576) bfloat16, standard normal;
    - kv: (pool_tokens / 64, 64, 1, 656) uint8, an fp8_ds_mla cache quantized (on the CPU) from
      standard normal latents times `cache_scale`; pool_tokens defaults to 4 x topk, in whole
      64-token blocks;
    - indices: (1, s_q, topk) int32 into the pool, each -1 (invalid) with probability
      `invalid_fraction`, except the first of every query, which stays valid.
    """
    import torch

    from mlamem.kernels.fp8_ds_mla import BYTES_PER_TOKEN, quantize

    device = torch.device(device)
    pool = pool_tokens or -(-4 * topk // CACHE_BLOCK_TOKENS) * CACHE_BLOCK_TOKENS
    if pool % CACHE_BLOCK_TOKENS:
        raise ValueError(f"pool_tokens must be a multiple of {CACHE_BLOCK_TOKENS}, got {pool}")
    cpu = torch.Generator().manual_seed(seed)
    kv = quantize(torch.randn(pool, 576, generator=cpu) * cache_scale).view(
        pool // CACHE_BLOCK_TOKENS, CACHE_BLOCK_TOKENS, 1, BYTES_PER_TOKEN).to(device)
    gen = torch.Generator(device).manual_seed(seed)
    q = torch.randn((1, s_q, h_q, 576), device=device, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, pool, (1, s_q, topk), dtype=torch.int32, device=device,
                            generator=gen)
    drop = torch.rand(indices.shape, device=device, generator=gen) < invalid_fraction
    drop[..., 0] = False
    return q, kv, indices.masked_fill(drop, -1)


def kernel_or_skip(name: str):
    """The registered kernel `name`, instantiated; the calling test is skipped, with the
    adapter's one-line reason, where it cannot run here."""
    import pytest

    from mlamem.kernels import load_kernel

    adapter = load_kernel(name)()
    reason = adapter.unavailable_reason()
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    return adapter


def scenario_file(folder: Path, base: str = "glm5-fp8-tp8",
                  edits: Mapping[str, str] | None = None) -> Path:
    """A scenario TOML written into `folder`: the shipped scenario `base` with each text edit
    (old -> new) applied. An edit whose old text is not in the file exactly once is an error,
    so a test never checks the unedited scenario by mistake."""
    text = (resources.files("mlamem.scenarios") / f"{base}.toml").read_text()
    for old, new in (edits or {}).items():
        if text.count(old) != 1:
            raise ValueError(f"{old!r} occurs {text.count(old)} times in {base}.toml, not once")
        text = text.replace(old, new)
    path = Path(folder) / f"{base}-edited.toml"
    path.write_text(text)
    return path


def recorded_host_or_skip(kernel: str | None = None, target_mib: int | None = None) -> None:
    """Skip a test that holds a measured repro-oom run equal to its prediction where
    mlamem/non_torch.toml has no record of this GPU, torch and CUDA for `kernel` (default: the
    default kernel): a prediction models the recorded host, and elsewhere its limits can differ
    (reports/repro-oom-h100); or where the target, `target_mib`, is larger than this GPU
    (NVML's total), which repro-oom refuses to measure (an H200 target on an H100). The GPU's
    name and memory come from NVML: the process opens no CUDA context."""
    import pytest
    import torch

    from mlamem.kernels import DEFAULT_KERNEL

    kernel = kernel or DEFAULT_KERNEL
    handle = nvml.nvml_query("nvmlDeviceGetHandleByIndex", 0)
    name = None if handle is None else nvml.nvml_query("nvmlDeviceGetName", handle)
    name = name.decode() if isinstance(name, bytes) else name
    host = (name, torch.__version__, torch.version.cuda)
    recorded = [s for s in load_setups() if s.kernel == kernel]
    if host not in {(s.gpu, s.torch, s.cuda) for s in recorded}:
        pytest.skip(f"no non-torch record of {kernel} on {name}, torch {host[1]}, CUDA {host[2]}: "
                    f"predictions model the {recorded[0].gpu if recorded else 'recorded host'}")
    memory = None if handle is None else nvml.nvml_query("nvmlDeviceGetMemoryInfo", handle)
    if target_mib is not None and memory is not None and target_mib * 2**20 > memory.total:
        pytest.skip(f"the {target_mib} MiB target is larger than this {name}: not measured here")


def scenario_as_run(name: str, budget: Mapping[str, Any]) -> Any:
    """The shipped scenario `name` with the target GPU memory a saved repro-oom run had: its
    budget's `scenario_gpu_memory_bytes`, else its `gpu_memory_bytes` (GLM-5 targeted nvidia-smi's
    81559 MiB before 2026-12-05, CUDA's 81079 since)."""
    import dataclasses

    from mlamem.spec import scenario

    shipped = scenario.load(name)
    memory = budget.get("scenario_gpu_memory_bytes", budget["gpu_memory_bytes"])
    return dataclasses.replace(shipped, gpu=dataclasses.replace(shipped.gpu,
                                                                memory_mib=memory // 2**20))


def split_into_shards(document: dict, count: int) -> list[dict]:
    """A saved profile or validate result (a JSON document) as the `count` files that `--shard
    I/N` runs of its sweep write: its units dealt by `mlamem.commands.shards.Shard`, each file's command
    with `--shard I/N` added and its `shard` set. Tests the merge on real results, such as the
    committed measured ones, where the sweep cannot run again."""
    key = ITEMS[document["schema"]]
    units = units_of(document[key])
    shards = []
    for index in range(1, count + 1):
        shard = Shard(index, count)
        items = [item for unit in shard.pick(units) for item in unit]
        part = {**document, "command": f"{document['command']} --shard {shard}", key: items,
                "shard": str(shard)}
        if "agrees" in document:
            part["agrees"] = all(item["difference"] == 0 for item in items)
        shards.append(part)
    return shards


SEGMENT_BYTES = 1 << 32  # each synthetic segment's size (4 GiB)


def _synthetic_stacks(rng: random.Random, count: int) -> list[list[dict]]:
    """`count` stacks as torch records them (innermost first): the caching allocator's C++
    frames, a torch frame, then a few of a user's Python frames; frame dicts are shared among
    stacks, as torch's snapshot shares them."""
    native = [{"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
               "filename": "CUDACachingAllocator.cpp", "line": 0},
              {"name": "at::detail::empty_strided_cuda", "filename": "??", "line": 0}]
    torch_frames = [{"name": name, "filename": f"/usr/lib/python3/site-packages/torch/{file}",
                     "line": line} for name, file, line in
                    [("forward", "nn/modules/linear.py", 125), ("empty", "_refs/__init__.py", 4800),
                     ("_conv_forward", "nn/modules/conv.py", 549)]]
    user = [{"name": f"step_{i % 7}", "filename": f"/srv/app/model_{i % 5}.py", "line": 10 + i}
            for i in range(40)]
    return [native + [rng.choice(torch_frames)] + rng.sample(user, rng.randint(2, 4))
            for _ in range(count)]


def synthetic_snapshot(events: int, *, seed: int = 0, segments: int = 8, size_count: int = 400,
                       calls: Sequence[Sequence[int]] = (), call_every: int = 10_000) -> dict:
    """A memory snapshot in the layout `torch.cuda.memory._dump_snapshot` writes, of about
    `events` trace events: allocations of a mix of sizes (`size_count` drawn, 512 B to
    64 MiB, small ones most often), each with a stack of a few frames (a new list per
    allocation, shared with its free events, the frame dicts shared, as torch's are), freed
    after a while (free_requested, then free_completed), in `segments` segments of
    SEGMENT_BYTES, which the trace opens first and the snapshot holds at the end with the
    blocks live then. Every `call_every` events one of `calls` (each a list of requested
    bytes, in order: an MLA call's allocations) is allocated, then freed."""
    rng = random.Random(seed)
    stacks = _synthetic_stacks(rng, 64)
    sizes = sorted({rng.choice((4, 8, 256, 1024, 4096)) if i % 5 == 0 else
                    int(512 * 2 ** rng.uniform(0, 17)) for i in range(size_count)})
    trace: list[dict] = [{"action": "segment_alloc", "addr": s * SEGMENT_BYTES * 2,
                          "size": SEGMENT_BYTES, "stream": 0, "frames": []}
                         for s in range(1, segments + 1)]
    bump = [s * SEGMENT_BYTES * 2 for s in range(1, segments + 1)]
    live: dict[int, dict] = {}  # address -> its alloc event

    def alloc(size: int, frames: list[dict]) -> int:
        segment = rng.randrange(segments)
        start = (segment + 1) * SEGMENT_BYTES * 2
        addr = bump[segment]
        while addr in live:
            addr += 512
        bump[segment] = start + (addr - start + -(-size // 512) * 512) % (SEGMENT_BYTES // 2)
        live[addr] = {"action": "alloc", "addr": addr, "size": size, "stream": 0,
                      "time_us": len(trace), "frames": frames}
        trace.append(live[addr])
        return addr

    def free(addr: int) -> None:
        event = live.pop(addr)
        for action in ("free_requested", "free_completed"):
            trace.append({**event, "action": action, "time_us": len(trace)})

    while len(trace) < events:
        if calls and len(trace) // call_every != (len(trace) + 20) // call_every:
            call = rng.choice(calls)
            frames = [{"name": "flash_mla_with_kvcache", "line": 254,
                       "filename": "/srv/site/flash_mla/flash_mla_interface.py"},
                      *rng.choice(stacks)[3:]]
            for addr in [alloc(size, frames) for size in call]:
                free(addr)
        elif len(live) < 256 or (len(live) < 4096 and rng.random() < 0.5):
            alloc(sizes[min(int(rng.expovariate(4 / len(sizes))), len(sizes) - 1)],
                  list(rng.choice(stacks)))
        else:
            free(rng.choice(list(live)) if rng.random() < 0.1 else next(reversed(live)))
    return {"segments": _synthetic_segments(live, segments), "device_traces": [trace],
            "allocator_settings": {}, "external_annotations": []}


def _synthetic_segments(live: dict[int, dict], count: int) -> list[dict]:
    """The segments at the end: each one's live blocks by address, the gaps inactive."""
    found = []
    for s in range(1, count + 1):
        start, blocks = s * SEGMENT_BYTES * 2, []
        at = start
        for addr in sorted(a for a in live if start <= a < start + SEGMENT_BYTES):
            if addr < at:  # over a block kept long, which the ring went past: left out
                continue
            if addr > at:
                blocks.append({"address": at, "size": addr - at, "requested_size": 0,
                               "state": "inactive", "frames": []})
            size = -(-live[addr]["size"] // 512) * 512
            blocks.append({"address": addr, "size": size, "requested_size": live[addr]["size"],
                           "state": "active_allocated", "frames": live[addr]["frames"]})
            at = addr + size
        blocks.append({"address": at, "size": start + SEGMENT_BYTES - at, "requested_size": 0,
                       "state": "inactive", "frames": []})
        found.append({"device": 0, "address": start, "total_size": SEGMENT_BYTES, "stream": 0,
                      "segment_type": "large", "blocks": blocks, "frames": []})
    return found


def __getattr__(name: str) -> Any:
    """`needs_flashmla` and `no_gpu`, built on first access: they import pytest and ask the
    FlashMLA adapter whether it can run here."""
    if name not in ("needs_flashmla", "no_gpu"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import pytest

    from mlamem.kernels import DEFAULT_KERNEL, load_kernel

    reason = load_kernel(DEFAULT_KERNEL)().unavailable_reason()
    markers = {
        "needs_flashmla": pytest.mark.skipif(reason is not None,
                                             reason=f"needs a CUDA GPU with flash_mla: {reason}"),
        # for checks of what a machine without a GPU prints (predicted output)
        "no_gpu": pytest.mark.skipif(reason is None, reason="a GPU here measures instead"),
    }
    globals().update(markers)
    return markers[name]
