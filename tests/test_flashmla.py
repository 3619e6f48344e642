"""The FlashMLA adapter on the CPU: its allocation spec. On a GPU, tests/test_flashmla_gpu.py
checks the real kernel against it."""

from mlamem.kernels.flashmla import flashmla_allocations

GiB = 1024**3


def test_kernel_spec_accounts_for_split_kv_accumulators():
    """At T=32768 the spec holds out 2 GiB, lse 8 MiB, lse_accum 16 MiB, o_accum 8 GiB."""
    specs = {s.name: s.nbytes for s in flashmla_allocations((1, 32768, 64, 576), 512, 132)}
    assert specs == {"out": 2 * GiB, "lse": 8 << 20, "scheduler_metadata": 32, "num_splits": 8,
                     "lse_accum": 16 << 20, "o_accum": 8 * GiB}
    small = {s.name: s.shape for s in flashmla_allocations((1, 4, 64, 576), 512, 132)}
    assert small["o_accum"][0] == 1 + 132 // 4  # b + num_sm_parts


def test_split_count_below_64_heads():
    """Below 64 heads the split count is one 64-head tile's, max(132 // s_q // 1, 1), with no
    ZeroDivisionError; at 64 and 128 heads FlashMLA's SM90 sparse decode formula,
    max(132 // s_q // (h_q // 64), 1); the dense decode's ceil(h_q / 64) at s_q = 1."""
    from mlamem.kernels.flashmla import num_sm_parts

    assert [num_sm_parts(132, s_q, 8) for s_q in (1, 4, 200)] == [132, 33, 1]
    assert [num_sm_parts(132, 4, h_q) for h_q in (16, 32, 64, 128)] == [33, 33, 33, 16]
    assert [num_sm_parts(132, 1, h_q) for h_q in (16, 64, 128, 192)] == [132, 132, 66, 44]
    specs = {s.name: s.shape for s in flashmla_allocations((1, 4, 8, 576), 512, 132)}
    assert specs["scheduler_metadata"] == (33, 8) and specs["o_accum"][0] == 1 + 33


def _library_folder(tmp_path, monkeypatch, size: int):
    """$MLAMEM_VLLM_FLASHMLA naming a folder whose library is `size` bytes (sparse, so no disk)."""
    from mlamem.kernels import flashmla_vllm

    library = tmp_path / flashmla_vllm.LIBRARY
    with open(library, "wb") as handle:
        handle.write(b"ELF")
        handle.truncate(size)
    monkeypatch.setenv(flashmla_vllm.FOLDER_VARIABLE, str(tmp_path))
    return library


def test_the_vllm_library_is_hashed_in_chunks(tmp_path, monkeypatch):
    """A 64 MiB library is hashed, and a 64 MiB METADATA beside it read for its version,
    without holding either: Python's peak stays under 8 MiB."""
    import hashlib
    import tracemalloc

    from mlamem.kernels.flashmla_vllm import FlashMLAVLLM

    library = _library_folder(tmp_path, monkeypatch, 64 << 20)
    with open(tmp_path / "METADATA", "wb") as handle:  # the wheel's, kept beside it
        handle.write(b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
        handle.truncate(64 << 20)
    tracemalloc.start()
    try:
        version = FlashMLAVLLM().version()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with open(library, "rb") as handle:
        expected = hashlib.file_digest(handle, "sha256").hexdigest()
    assert version == f"vllm 0.33.0 sha256:{expected[:16]}"
    assert peak < 8 << 20


def test_a_vllm_library_past_512_mib_is_refused_in_one_line_naming_the_variable(tmp_path,
                                                                                monkeypatch):
    """$MLAMEM_VLLM_FLASHMLA at a 4 GiB file: not read, the kernel unavailable, the reason one
    line naming the variable (a FlashMLA library is about 4 MB)."""
    from mlamem.kernels.flashmla_vllm import FOLDER_VARIABLE, FlashMLAVLLM

    library = _library_folder(tmp_path, monkeypatch, 4 << 30)
    adapter = FlashMLAVLLM()
    reason = adapter.unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert FOLDER_VARIABLE in reason and str(library) in reason and "4294967296 bytes" in reason
    assert adapter.version() is None
