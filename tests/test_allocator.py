"""The caching-allocator model follows c10's rules for rounding, pools, splits and caching."""

import pytest

from mlamem.runtime.allocator import AllocatorOutOfMemory, CachingAllocatorModel, round_size, segment_size

MiB = 1 << 20


@pytest.mark.parametrize(("request_bytes", "rounded"), [(1, 512), (512, 512), (513, 1024), (8, 512),
                                                        (3 * MiB + 1, 3 * MiB + 512)])
def test_round_size(request_bytes, rounded):
    """Requests round up to 512-byte multiples, never below 512."""
    assert round_size(request_bytes) == rounded


@pytest.mark.parametrize(("rounded", "segment"), [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                                  (9 * MiB, 20 * MiB), (10 * MiB, 10 * MiB),
                                                  (11 * MiB, 12 * MiB)])
def test_segment_size(rounded, segment):
    """Small requests get 2 MiB segments, mid-size 20 MiB, large round up to 2 MiB."""
    assert segment_size(rounded) == segment


def test_small_requests_share_a_segment():
    """Scheduler-sized tensors (32 B, 8 B) share one 2 MiB small segment."""
    model = CachingAllocatorModel()
    model.malloc(32)
    model.malloc(8)
    assert (model.allocated_bytes, model.reserved_bytes) == (1024, 2 * MiB)


def test_free_space_of_a_segment_is_reused_and_merged():
    """A 5 MiB tensor leaves 15 MiB of its 20 MiB segment for an 8 MiB request; frees merge."""
    model = CachingAllocatorModel()
    a = model.malloc(5 * MiB)
    b = model.malloc(8 * MiB)
    assert model.reserved_bytes == 20 * MiB
    model.free(a)
    model.free(b)
    model.empty_cache()
    assert (model.allocated_bytes, model.reserved_bytes) == (0, 0)
    assert (model.peak_allocated_bytes, model.peak_reserved_bytes) == (13 * MiB, 20 * MiB)


def test_unsplit_remainder_counts_as_allocated():
    """A cached block is not split when 1 MiB or less would remain: all of it is allocated."""
    model = CachingAllocatorModel()
    model.free(model.malloc(12 * MiB))
    model.malloc(11 * MiB + 512)
    assert model.allocated_bytes == 12 * MiB


def test_empty_cache_keeps_segments_in_use():
    """empty_cache releases only segments with no live block."""
    model = CachingAllocatorModel()
    keep = model.malloc(64 * MiB)
    model.free(model.malloc(256 * MiB))
    model.empty_cache()
    assert model.reserved_bytes == 64 * MiB
    model.free(keep)
    model.empty_cache()
    assert model.reserved_bytes == 0


def test_limit_releases_cache_then_raises():
    """Under a limit, cached segments are released before an allocation fails."""
    model = CachingAllocatorModel(limit_bytes=100 * MiB)
    model.free(model.malloc(60 * MiB))
    model.malloc(80 * MiB)  # fits once the cached 60 MiB segment is released
    with pytest.raises(AllocatorOutOfMemory) as info:
        model.malloc(30 * MiB)
    assert info.value.requested_bytes == 30 * MiB
    assert model.num_ooms == 1


def test_a_capture_reuses_blocks_an_earlier_capture_freed():
    """Blocks freed in a private pool go back to it: a later, smaller capture takes them."""
    model = CachingAllocatorModel()
    model.begin_allocate_to_pool("graphs")
    out = model.malloc(32 * MiB)
    model.free(model.malloc(128 * MiB))  # the accumulators, freed inside the capture
    model.end_allocate_to_pool()
    model.free(out)  # the capture's output: only weakly referenced afterwards
    reserved = model.reserved_bytes
    model.empty_cache()  # torch.cuda.graph empties the cache before each capture
    model.begin_allocate_to_pool("graphs")
    model.malloc(16 * MiB)
    model.malloc(64 * MiB)
    model.end_allocate_to_pool()
    assert model.reserved_bytes == reserved == 160 * MiB


def test_private_pool_blocks_are_never_given_to_ordinary_requests():
    """A free block of a live graph pool does not serve a request outside the capture."""
    model = CachingAllocatorModel()
    model.begin_allocate_to_pool("graphs")
    model.free(model.malloc(64 * MiB))
    model.end_allocate_to_pool()
    model.malloc(8 * MiB)
    assert model.reserved_bytes == 64 * MiB + 20 * MiB


def test_empty_cache_keeps_a_live_pool_and_releases_it_once_its_graphs_are_gone():
    model = CachingAllocatorModel()
    model.begin_allocate_to_pool("graphs")
    model.free(model.malloc(64 * MiB))
    model.end_allocate_to_pool()
    model.empty_cache()
    assert model.reserved_bytes == 64 * MiB
    model.release_pool("graphs")
    model.empty_cache()
    assert model.reserved_bytes == 0


def test_out_of_memory_inside_a_capture_releases_no_cache():
    """During a capture c10 does not free cached segments to retry; outside it does."""
    model = CachingAllocatorModel(limit_bytes=100 * MiB)
    model.free(model.malloc(64 * MiB))  # cached in the ordinary pool
    model.begin_allocate_to_pool("graphs")
    with pytest.raises(AllocatorOutOfMemory):
        model.malloc(64 * MiB)
    model.end_allocate_to_pool()
    model.malloc(80 * MiB)  # outside the capture the cached 64 MiB is released first
    assert model.reserved_bytes == 80 * MiB
