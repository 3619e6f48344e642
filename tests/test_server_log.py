"""The server log reader (mlamem/spec/server_log.py) on real lines of public reports
(tests/fixtures/logs/SOURCES.md cites each), and on broken, truncated, huge and non-UTF-8 logs."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from mlamem.spec import server_log
from mlamem.spec.errors import UserError
from mlamem.spec.server_log import parse_lines, read_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
GiB, MiB = 2**30, 2**20
SEED_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a "
            "total capacity of 79.19 GiB of which 5.29 GiB is free.")


def figures(name: str) -> dict:
    log = read_log(str(LOGS / name))
    return {f.name: f.value for f in log.figures}


def test_every_fixture_is_cited():
    """Each log under tests/fixtures/logs has its source's address in SOURCES.md."""
    sources = (LOGS / "SOURCES.md").read_text()
    for log in LOGS.glob("*.log"):
        row = next(line for line in sources.splitlines() if line.startswith(f"| {log.name} "))
        assert "https://github.com/" in row


def test_vllm_0_6_profiling_results():
    """vLLM 0.6.5's "Memory profiling results" block: weights, non-torch, activation peak."""
    got = figures("vllm-0.6.5-profiling.log")
    assert got["weights"] == round(7.48 * GiB)
    assert got["non_torch"] == round(3.58 * GiB)
    assert got["activation_peak"] == round(1.26 * GiB)
    assert got["total_gpu_memory"] == round(79.22 * GiB)


def test_vllm_0_7_one_line_summary():
    """vLLM 0.7.0's one-line summary gives four figures, and the blocks on the next line."""
    log = read_log(str(LOGS / "vllm-0.7.0-profiling.log"))
    got = {f.name: f for f in log.figures}
    assert log.engine == "vllm"
    assert got["kv_cache"].value == round(14.65 * GiB)
    assert got["activation_peak"].value == round(36.63 * GiB)
    assert got["kv_cache_blocks"].value == 6001
    assert got["weights"].line_number == 2 and "model weights take 19.86GiB" in got["weights"].line


def test_vllm_v0_model_loading_in_gb_is_gib():
    """vLLM 0.7's "Model loading took 15.4137 GB" is GiB (model_runner divides by 2**30)."""
    assert figures("vllm-0.7.3-model-loading.log")["weights"] == round(15.4137 * GiB)


def test_vllm_v1_kv_cache_tokens_and_concurrency():
    """vLLM 0.8's V1 lines: the KV cache in tokens, with thousands separators, and concurrency."""
    got = figures("vllm-0.8-v1-kv-cache.log")
    assert got["kv_cache_tokens"] == 106640 and got["max_concurrency"] == 13.02


def test_vllm_version_from_its_banner():
    """vLLM 0.25.0's banner prints its version: the engine and the version are read."""
    log = parse_lines((LOGS / "vllm-0.25.0-banner.log").read_text().splitlines())
    assert (log.engine, log.version) == ("vllm", "0.25.0")


def test_vllm_oom_with_its_frames():
    """A DeepSeek OOM under vLLM 0.8: request, total, free, and the traceback's frames."""
    [oom] = read_log(str(LOGS / "vllm-0.8-deepseek-oom.log")).ooms
    assert (oom.requested_bytes, oom.device, oom.free_bytes) == (2 * MiB, 6, 448 * 1024)
    assert oom.total_bytes == round(44.53 * GiB)
    assert oom.frames[-1] == "vllm/model_executor/models/deepseek_v2.py:646 forward"


def test_sglang_0_4_k_and_v_pools_add_up():
    """SGLang 0.4 prints K and V apart: the KV cache is their sum, its tokens beside it."""
    got = figures("sglang-0.4-kv-pool.log")
    assert got == {"kv_cache_tokens": 367404, "kv_cache": 2 * round(8.23 * GiB)}


def test_sglang_0_5_pool_and_weights():
    """SGLang 0.5's one KV size, the memory after the pool, and the weights' mem usage."""
    assert figures("sglang-0.5-deepseek-v3.2.log") == {
        "kv_cache_tokens": 975424, "kv_cache": round(43.67 * GiB),
        "avail_after_pool": round(37.71 * GiB)}
    assert figures("sglang-0.5-load-weight-end.log") == {
        "avail_after_weights": round(76.05 * GiB), "weights": round(2.33 * GiB)}
    log = read_log(str(LOGS / "sglang-0.5-load-weight-begin.log"))
    assert log.engine == "sglang" and log.figures[0].name == "avail_before_weights"


def test_oom_with_what_pytorch_held():
    """An SGLang DeepSeek-V3.2 OOM: this process's memory, PyTorch's allocated and reserved."""
    [oom] = read_log(str(LOGS / "sglang-deepseek-v3.2-oom.log")).ooms
    assert oom.process_bytes == round(20.13 * GiB)
    assert oom.allocated_bytes == round(19.53 * GiB)
    assert oom.reserved_unallocated_bytes == round(17.70 * MiB)


def test_trtllm_paged_kv_cache_and_executor_summary():
    """TensorRT-LLM: its paged KV cache (GiB and tokens); 1.0.0rc2's memory summary."""
    assert figures("trtllm-paged-kv-cache.log") == {"kv_cache": round(78.30 * GiB),
                                                   "kv_cache_tokens": 3731744}
    log = read_log(str(LOGS / "trtllm-1.0.0rc2-deepseek-v3.log"))
    got = {f.name: f.value for f in log.figures}
    assert log.engine == "trtllm"
    assert got["total_gpu_memory"] == 95 * GiB
    assert got["weights"] == round((94.30 - 47.83) * GiB)


def test_engine_found_by_lines_not_name(tmp_path):
    """A vLLM log named after SGLang is read as vLLM's."""
    path = tmp_path / "sglang-server.log"
    path.write_bytes((LOGS / "vllm-0.7.0-profiling.log").read_bytes())
    assert read_log(str(path)).engine == "vllm"


def test_seed_oom_line():
    """The seed's OOM line: 8 GiB tried, 79.19 GiB total, 5.29 GiB free, on GPU 0."""
    [oom] = parse_lines([SEED_OOM]).ooms
    assert (oom.requested_bytes, oom.device) == (8 * GiB, 0)
    assert (oom.total_bytes, oom.free_bytes) == (round(79.19 * GiB), round(5.29 * GiB))


def test_oom_message_wrapped_over_lines():
    """A message the report wraps over lines (SGLang 30505, the vLLM backport's 94): the total,
    the free memory and what PyTorch held are read from the lines after the request, and the
    message is the first line's."""
    [oom] = read_log(str(LOGS / "sglang-glm-5.2-wrapped-oom.log")).ooms
    assert (oom.requested_bytes, oom.device, oom.line_number) == (round(1.02 * GiB), 6, 1)
    assert (oom.total_bytes, oom.free_bytes) == (round(79.18 * GiB), round(837.06 * MiB))
    assert oom.allocated_bytes == round(71.12 * GiB)
    assert oom.reserved_unallocated_bytes == round(2.16 * GiB)
    [oom] = read_log(str(LOGS / "vllm-backport-wrapped-oom.log")).ooms
    assert (oom.total_bytes, oom.free_bytes) == (round(79.25 * GiB), round(287.94 * MiB))


def test_an_impossible_wrapped_message_names_its_first_line():
    """A wrapped message no GPU prints (more free than total) is one line naming where it
    begins."""
    lines = ["INFO start", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
             "GPU 0 has a total capacity of 8.00 GiB of which 9.00 GiB is free."]
    with pytest.raises(UserError, match="line 2: the OOM message gives the GPU more free"):
        parse_lines(lines)


def test_a_line_after_a_whole_message_is_not_read_into_it():
    """A whole message on one line takes nothing from the next (another message's figures)."""
    cut = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    log = parse_lines([SEED_OOM, "GPU 1 has a total capacity of 9.00 GiB of which 1.00 GiB is free.",
                       cut, "INFO 01-02 some other line", "GPU 2 has a total capacity of 79.19 "
                       "GiB of which 1.00 GiB is free."])
    assert [(o.total_bytes, o.free_bytes) for o in log.ooms] == [
        (round(79.19 * GiB), round(5.29 * GiB)), (None, None)]


def test_repeated_oom_counted_once():
    """The same message from eight ranks is one OOM, counted eight times."""
    [oom] = parse_lines([f"(rank={r}) {SEED_OOM}" for r in range(8)]).ooms
    assert oom.repeats == 8


def test_nothing_known_is_one_line(tmp_path):
    """A log with no line mlamem knows: a UserError naming the file, not an empty result."""
    path = tmp_path / "server.log"
    path.write_text("hello\nworld\n")
    with pytest.raises(UserError, match="no line of a vLLM, SGLang or TensorRT-LLM log"):
        read_log(str(path))


def test_truncated_oom_message_is_skipped(tmp_path):
    """A message cut before its size reads as nothing, and the log as unknown."""
    path = tmp_path / "cut.log"
    path.write_text(SEED_OOM[:60])
    with pytest.raises(UserError):
        read_log(str(path))


def test_non_utf8_bytes_are_replaced(tmp_path):
    """Bytes that are not UTF-8 around a known line do not stop the reader."""
    path = tmp_path / "binary.log"
    path.write_bytes(b"\xff\xfe\x00garbage\x80\n" + SEED_OOM.encode() + b"\n\xc3\x28\n")
    assert read_log(str(path)).ooms[0].free_bytes == round(5.29 * GiB)


def test_a_log_over_the_bound_is_refused(tmp_path, monkeypatch):
    """A file over MAX_LOG_BYTES is one line naming the bound."""
    monkeypatch.setattr(server_log, "MAX_LOG_BYTES", 100)
    path = tmp_path / "big.log"
    path.write_text(SEED_OOM * 3)
    with pytest.raises(UserError, match="more than a server log can be"):
        read_log(str(path))


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(UserError, match="is a folder"):
        read_log(str(tmp_path))


def test_standard_input(monkeypatch):
    """`-` reads standard input."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(SEED_OOM.encode())))
    assert read_log("-").ooms[0].requested_bytes == 8 * GiB


def test_tens_of_megabytes_in_seconds(tmp_path):
    """A 40 MB log of unknown and known lines reads in well under ten seconds."""
    filler = ("INFO 04-25 10:23:33 [loggers.py:116] Engine 000: Avg prompt throughput: 0.0 "
              "tokens/s, Running: 1 reqs, GPU KV cache usage: 1.4%\n") * 1000
    path = tmp_path / "huge.log"
    with open(path, "w") as handle:
        for _ in range(300):
            handle.write(filler)
        handle.write(SEED_OOM + "\n")
    start = time.perf_counter()
    log = read_log(str(path))
    assert time.perf_counter() - start < 10
    assert log.ooms and log.lines == 300_001


OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {asked} GiB. GPU 0 has "
            "a total capacity of {total} GiB of which {free} GiB is free.")


@pytest.mark.parametrize(("asked", "total", "free", "fix"), [
    ("999999.00", "79.19", "5.29", "more than any device"),  # past 256 TiB: a size bug
    ("1" + "0" * 400, "79.19", "5.29", "more than any device"),  # float overflow
    ("8.00", "0.00", "0.00", "a total capacity of 0 B"),
    ("8.00", "5.00", "79.19", "more free than its total"),
])
def test_an_oom_message_no_gpu_can_print_is_one_line(tmp_path, asked, total, free, fix):
    """An OOM line whose figures no GPU prints (edited, or a request past any device) is refused
    in one line naming the line, never a traceback nor a ledger of a 0 B device."""
    log = tmp_path / "edited.log"
    log.write_text(OOM_LINE.format(asked=asked, total=total, free=free) + "\n")
    with pytest.raises(UserError, match=f"line 1: .*{fix}") as error:
        read_log(str(log))
    assert error.value.field == "log"


def test_vllm_graph_estimate_and_the_utilization_it_is_worth():
    """vLLM 0.21+ prints the graph estimate set aside before the KV cache, and the utilization it
    is worth: 0.9200 less 0.9129, its share of the total."""
    log = read_log(str(LOGS / "vllm-cuda-graph-estimate.log"))
    got = {f.name: f for f in log.figures}
    assert got["cuda_graphs_estimated"].value == round(0.17 * GiB)
    assert got["utilization"].value == 0.92
    assert got["cuda_graphs_estimated_share"].value == 0.0071
    assert got["cuda_graphs_estimated_share"].line_number == 2
    assert got["kv_cache"].value == round(15.72 * GiB)


def test_vllm_graph_pool_actual_beside_the_estimate_may_be_negative():
    """vLLM's "CUDA graph pool memory: X GiB (actual), Y GiB (estimated)": the pool can shrink
    (a negative actual, as printed), the estimate is what the KV cache lost."""
    got = figures("vllm-cuda-graph-pool.log")
    assert got["cuda_graphs"] == round(-0.19 * GiB)
    assert got["cuda_graphs_estimated"] == round(2.43 * GiB)


@pytest.mark.parametrize(("given", "without"), [("92", "0.9129"), ("0.9129", "0.92")])
def test_a_utilization_vllm_cannot_print_is_one_line(tmp_path, given, without):
    """The estimate's utilization line with figures no vLLM prints (past 1, or more without the
    estimate than with it) is refused in one line naming the line."""
    log = tmp_path / "edited.log"
    log.write_text(f"The current --gpu-memory-utilization={given} is equivalent to "
                   f"--gpu-memory-utilization={without} without CUDA graph memory profiling.\n")
    with pytest.raises(UserError, match="line 1: .*no utilization vLLM prints") as error:
        read_log(str(log))
    assert error.value.field == "log"


def test_vllm_split_of_the_rank_up_to_0_26():
    """vLLM 0.10.2-0.26's split after capturing graphs: the weights, the profile's peak, the
    non-torch memory and the captured pool, the free memory at startup, the utilization and
    what it asks for, the suggested --kv-cache-memory; one line, all of them."""
    log = read_log(str(LOGS / "vllm-split-weight.log"))
    got = {f.name: f.value for f in log.figures}
    assert log.engine == "vllm"
    assert got == {"free_at_startup": round(264.19 * GiB), "total_gpu_memory": round(267.69 * GiB),
                   "utilization": 0.95, "requested_memory": round(254.3 * GiB),
                   "weights": round(205.08 * GiB), "activation_peak": round(3.75 * GiB),
                   "non_torch": round(1.63 * GiB), "cuda_graphs": round(0.14 * GiB),
                   "suggested_kv_cache_memory": 46779679130}


def test_vllm_split_from_0_27_wrapped_as_a_report_quotes_it():
    """vLLM 0.27+ prints the weights and non-torch memory as one figure, and the profile's peak
    with the graph estimate: read over the three lines a report wraps it on, from its first."""
    log = read_log(str(LOGS / "vllm-split-consumed-wrapped.log"))
    got = {f.name: f for f in log.figures}
    assert got["weights_and_non_torch"].value == round(106.85 * GiB)
    assert got["activation_peak_and_graph_estimate"].value == round(11.09 * GiB)
    assert got["cuda_graphs"].value == round(9.38 * GiB)
    assert {f.line_number for f in log.figures} == {1}
    assert "activation_peak" not in got and "weights" not in got


def test_vllm_free_memory_at_startup_and_the_utilization_it_asks_for():
    """vLLM's free memory at startup and its desired utilization, each on its own line."""
    assert figures("vllm-free-on-startup.log") == {
        "free_at_startup": round(110.37 * GiB), "total_gpu_memory": round(121.69 * GiB),
        "utilization": 0.87, "requested_memory": round(105.87 * GiB)}


def test_a_split_cut_short_is_read_as_far_as_it_goes(tmp_path):
    """A split whose lines stop before its end (a truncated log) gives no split figures and no
    traceback; the lines after it are read as usual."""
    quoted = (LOGS / "vllm-split-consumed-wrapped.log").read_text().splitlines()
    log = tmp_path / "cut.log"
    log.write_text("\n".join(quoted[:2] + ["INFO [gpu_worker.py:440] Available KV cache memory: "
                                            "34.86 GiB"]) + "\n")
    got = {f.name: f for f in read_log(str(log)).figures}
    assert set(got) == {"kv_cache"} and got["kv_cache"].line_number == 3


@pytest.mark.parametrize(("line", "fix"), [
    ("Free memory on device (200.0/100.0 GiB) on startup.", "no device's reading"),
    ("Free memory on device (0/0 GiB) on startup.", "no device's reading"),
    ("Desired GPU memory utilization is (7.5, 125.8 GiB).", "none vLLM takes"),
    ("Desired GPU memory utilization is (0, 125.8 GiB).", "none vLLM takes")])
def test_a_startup_reading_no_vllm_prints_is_one_line(tmp_path, line, fix):
    """vLLM's startup figures as no device or vLLM gives them (more free than the total, a
    total of 0, a utilization outside (0, 1]) are refused in one line naming the line."""
    log = tmp_path / "edited.log"
    log.write_text(line + "\n")
    with pytest.raises(UserError, match=f"line 1: .*{fix}") as error:
        read_log(str(log))
    assert error.value.field == "log"


def test_a_tp8_startup_excerpt_reflowed_over_lines():
    """A TP8 rank's startup lines as a record excerpts them (vLLM 0.28, 8 x H200): the weights,
    the KV cache, the free memory at startup, and the split wrapped over two lines."""
    got = figures("vllm-0.28-tp8-h200-startup.log")
    assert got["weights"] == round(38.24 * GiB) and got["kv_cache"] == round(81.79 * GiB)
    assert got["kv_cache_tokens"] == 7228559 and got["max_concurrency"] == 55.15
    assert (got["free_at_startup"], got["total_gpu_memory"]) == (round(137.64 * GiB), round(139.8 * GiB))
    assert got["weights_and_non_torch"] == round(39.98 * GiB)
    assert got["activation_peak_and_graph_estimate"] == round(4.04 * GiB)
    assert got["cuda_graphs"] == round(1.2 * GiB)
