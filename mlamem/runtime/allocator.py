"""A model of PyTorch's CUDA caching allocator (native backend, default settings).

It reproduces the allocator's bookkeeping, not its timing: request rounding, the small and
large pools, segment sizes, best-fit reuse of cached blocks, splitting, merging on free, and
`empty_cache`, and the private pools CUDA-graph captures allocate from. Fed the allocation
events of a run, it gives the same allocated and reserved figures, peaks included, that
`torch.cuda.memory_stats()` reports for that run. The constants are those of
c10/cuda/CUDACachingAllocator.cpp.

Pools: a block is only ever reused by a request to its own pool. `DEFAULT_POOL` is the
allocator's ordinary pool on the default stream; `CAPTURE_STREAM_POOL` the ordinary pool on the
capture stream (torch.cuda.graph's side stream), where the RNG state of the first live graph is
allocated; any other key is a graph's private pool. A private pool's segments survive
`empty_cache` until `release_pool` says its graphs are gone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

MIN_BLOCK_SIZE = 512  # every request is rounded up to a multiple of this
SMALL_SIZE = 1 << 20  # requests up to 1 MiB come from the small pool
SMALL_BUFFER = 2 << 20  # small-pool segment size
LARGE_BUFFER = 20 << 20  # segment size for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # from here, segments are the request rounded to ROUND_LARGE
ROUND_LARGE = 2 << 20
DEFAULT_POOL = "default"
CAPTURE_STREAM_POOL = "capture-stream"


def round_size(nbytes: int) -> int:
    """Bytes a request occupies: at least 512, rounded up to a multiple of 512."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def segment_size(rounded: int) -> int:
    """Bytes cudaMalloc'd for a new segment that must hold a `rounded` request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


class AllocatorOutOfMemory(Exception):
    """A new segment would exceed the memory limit, even after releasing cached segments."""

    def __init__(self, requested_bytes: int, free_bytes: int):
        super().__init__(f"out of memory: tried to allocate {requested_bytes} bytes "
                         f"with {free_bytes} bytes free under the limit")
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes


@dataclass(eq=False)
class Block:
    """A contiguous range of one segment, allocated or cached."""

    address: int
    size: int
    small: bool
    pool: object = DEFAULT_POOL
    free: bool = True
    requested: int = 0  # bytes asked for, while allocated
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    @property
    def whole_segment(self) -> bool:
        return self.prev is None and self.next is None


class CachingAllocatorModel:
    """Allocated/reserved bookkeeping of one device's caching allocator, one stream."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes  # like set_per_process_memory_fraction; None: unlimited
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.num_ooms = 0
        self._pools: dict[tuple[object, bool], list[Block]] = {}  # (pool, small?) -> free blocks
        self.pool: object = DEFAULT_POOL  # where requests go now (a private pool while capturing)
        self._private: set = set()  # private pools whose graphs are alive
        self._segments: list[Block] = []  # first block of each segment
        self._addresses = itertools.count(start=1 << 40, step=1 << 40)
        self.trace: list[dict] | None = None  # when a list, events are appended as torch records them

    def _record(self, action: str, address: int, size: int,
                frames: list[dict] | None = None) -> None:
        if self.trace is not None:
            self.trace.append({"action": action, "addr": address, "size": size, "stream": 0,
                               "frames": frames or []})

    def malloc(self, nbytes: int, frames: list[dict] | None = None) -> Block:
        """Allocate `nbytes`; returns the block (pass it to `free`). `frames`: the Python stack
        that asked for it, kept in the trace's alloc event as torch keeps it."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small) or self._new_segment(size, small)
        free_blocks = self._free_blocks(block)
        free_blocks.remove(block)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            rest = Block(block.address + size, remaining, small, block.pool, prev=block,
                         next=block.next)
            if block.next:
                block.next.prev = rest
            block.next, block.size = rest, size
            free_blocks.append(rest)
        block.free, block.requested = False, nbytes
        self._record("alloc", block.address, nbytes, frames)
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block

    def free(self, block: Block) -> None:
        """Return a block to its pool, merging it with free neighbours."""
        self._record("free_completed", block.address, block.requested)
        block.free, block.requested = True, 0
        self.allocated_bytes -= block.size
        free_blocks = self._free_blocks(block)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                free_blocks.remove(neighbour)
                if neighbour is block.prev:
                    block.address = neighbour.address
                    block.prev = neighbour.prev
                    if neighbour.prev:
                        neighbour.prev.next = block
                    else:
                        self._segments[self._segments.index(neighbour)] = block
                else:
                    block.next = neighbour.next
                    if neighbour.next:
                        neighbour.next.prev = block
                block.size += neighbour.size
        free_blocks.append(block)

    def empty_cache(self) -> None:
        """Release every segment that holds no allocation (torch.cuda.empty_cache), except
        those of private pools whose graphs are alive."""
        for block in [b for b in self._segments if b.free and b.whole_segment
                      and b.pool not in self._private]:
            self._release(block)

    def begin_allocate_to_pool(self, pool: object) -> None:
        """Requests go to the private pool `pool` until `end_allocate_to_pool` (a capture)."""
        self._private.add(pool)
        self.pool = pool

    def end_allocate_to_pool(self) -> None:
        self.pool = DEFAULT_POOL

    def release_pool(self, pool: object) -> None:
        """The graphs of `pool` are gone: its free segments go at the next `empty_cache`."""
        self._private.discard(pool)

    def _free_blocks(self, block: Block) -> list[Block]:
        return self._pools.setdefault((block.pool, block.small), [])

    def reset_peaks(self) -> None:
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = self.reserved_bytes

    def _best_fit(self, size: int, small: bool) -> Block | None:
        fitting = [b for b in self._pools.get((self.pool, small), []) if b.size >= size]
        return min(fitting, key=lambda b: (b.size, b.address), default=None)

    def _new_segment(self, size: int, small: bool) -> Block:
        alloc = segment_size(size)
        if self.limit_bytes is not None and self.reserved_bytes + alloc > self.limit_bytes:
            if self.pool not in self._private:  # it frees cached segments and retries, but not
                # while capturing (c10 skips release_cached_blocks when a capture is underway)
                self.empty_cache()
            if self.reserved_bytes + alloc > self.limit_bytes:
                self.num_ooms += 1
                self._record("oom", 0, size)
                raise AllocatorOutOfMemory(size, self.limit_bytes - self.reserved_bytes)
        block = Block(next(self._addresses), alloc, small, self.pool)
        self._record("segment_alloc", block.address, alloc)
        self._segments.append(block)
        self._free_blocks(block).append(block)
        self.reserved_bytes += alloc
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def segments(self) -> list[dict]:
        """The segments in the layout of torch.cuda.memory._snapshot()["segments"]."""
        result = []
        for first in self._segments:
            blocks, block = [], first
            while block is not None:
                blocks.append({"address": block.address, "size": block.size,
                               "requested_size": block.requested, "frames": [],
                               "state": "inactive" if block.free else "active_allocated"})
                block = block.next
            used = [b for b in blocks if b["state"] == "active_allocated"]
            result.append({
                "device": 0, "address": first.address, "stream": 0,
                "total_size": sum(b["size"] for b in blocks),
                "allocated_size": sum(b["size"] for b in used),
                "active_size": sum(b["size"] for b in used),
                "requested_size": sum(b["requested_size"] for b in used),
                "segment_type": "small" if first.small else "large", "blocks": blocks,
            })
        return result

    def _release(self, block: Block) -> None:
        self._record("segment_free", block.address, block.size)
        self._segments.remove(block)
        self._free_blocks(block).remove(block)
        self.reserved_bytes -= block.size
