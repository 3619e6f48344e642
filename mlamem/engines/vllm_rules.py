"""vLLM's own rules, without torch: its scenario table `[vllm]` (`VLLMSection`), which decode
sizes vLLM 0.33.0 captures as FULL graphs, and its estimate of the pool they take
(v1/worker/gpu/cudagraph_utils.py, profile_cudagraph_memory and _extrapolate_full_graph_memory):
first FULL capture + max(second, 1 MiB) x (N - 1).

The vLLM engine (engines/vllm.py) and `mlamem graphs` read them; the scenario loader reads
`VLLMSection` through the engine registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlamem.errors import UserError
from mlamem.scenario import FieldError, Scenario, check_positive, section_model

MIN_PER_GRAPH_BYTES = 1 << 20  # vLLM's _MIN_PER_GRAPH_BYTES: "driver overhead" per graph

# vLLM 0.33.0's capture sizes (config/vllm.py, VllmConfig._set_cudagraph_sizes)
DEFAULT_MAX_GRAPH_SIZE = 512  # caps the default largest size, on every GPU (no per-arch value)
FULL_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")  # decode graphs hold attention
# vLLM's CUDAGraphMode names (config/compilation.py)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@section_model
class VLLMSection:
    """The scenario's `[vllm]` table: vLLM's CUDA-graph settings, at vLLM 0.33.0's defaults."""

    max_num_seqs: int = 1024  # --max-num-seqs: `vllm serve` on a >= 70 GiB GPU other than A100
    max_cudagraph_capture_size: int | None = None  # None: vLLM's rule from max_num_seqs
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # -O2's mode; one of CUDAGRAPH_MODES
    num_speculative_tokens: int = 0  # MTP / speculative tokens per decode step (k)
    # the serve command captures CUDA graphs (no --enforce-eager): repro-oom's --cuda-graphs
    # default; None (a scenario written by hand) leaves it off
    cuda_graphs: bool | None = None

    def __post_init__(self) -> None:
        check_positive(self, "vllm", "max_num_seqs")
        if self.max_cudagraph_capture_size is not None:
            check_positive(self, "vllm", "max_cudagraph_capture_size")
        if not 0 <= self.num_speculative_tokens <= 64:
            raise FieldError("vllm", "num_speculative_tokens",
                             f"{self.num_speculative_tokens} is outside 0..64")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise FieldError("vllm", "cudagraph_mode",
                             f"expected one of {', '.join(CUDAGRAPH_MODES)}, "
                             f"got {self.cudagraph_mode!r}")


def settings(scenario: Scenario) -> VLLMSection:
    """The scenario's `[vllm]` table, or its defaults."""
    return scenario.section("vllm")


def request_counts(max_num_seqs: int) -> list[int]:
    """vLLM's request counts for uniform decode sizes under speculation (config/vllm.py)."""
    m = min(max_num_seqs, DEFAULT_MAX_GRAPH_SIZE)
    counts = [1, 2, 4] + list(range(8, min(m + 1, 256), 8)) + list(range(256, m + 1, 16))
    return sorted({c for c in counts if c <= m} | {m})


def capture_sizes(scenario: Scenario) -> list[int]:
    """vLLM 0.33.0's `cudagraph_capture_sizes` for this serving config, ascending.

    max = max_cudagraph_capture_size, or min(max_num_seqs x (1 + k) x 2, 512) by default,
    capped at max_num_batched_tokens; sizes [1, 2, 4] + range(8, 256, 8) + range(256, max + 1,
    16) up to max, plus max_num_batched_tokens when it is within max, plus the uniform decode
    sizes (by default only).
    """
    vllm = settings(scenario)
    query_len = 1 + vllm.num_speculative_tokens
    tokens = scenario.serving.max_num_batched_tokens
    largest = vllm.max_cudagraph_capture_size
    uniform: list[int] = []
    if largest is None:
        largest = min(vllm.max_num_seqs * query_len * 2, DEFAULT_MAX_GRAPH_SIZE)
        if query_len > 1:
            uniform = sorted({n * query_len for n in request_counts(vllm.max_num_seqs)
                              if n * query_len <= largest})
        elif vllm.max_num_seqs <= largest:
            uniform = [vllm.max_num_seqs]
    largest = min(tokens, largest)
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if tokens <= largest:
        sizes.append(tokens)
    sizes += [s for s in uniform if s <= tokens]
    return sorted(set(sizes))


def full_decode_sizes(scenario: Scenario) -> list[int]:
    """The FULL uniform-decode graphs (attention inside), largest first: vLLM V2's
    CudaGraphManager._init_candidates rounds each capture size up to a multiple of 1 + k and
    keeps those within max_num_seqs x (1 + k) and the largest capture size. Empty when the mode
    puts attention in no graph (NONE, PIECEWISE)."""
    vllm = settings(scenario)
    if vllm.cudagraph_mode not in FULL_MODES:
        return []
    query_len = 1 + vllm.num_speculative_tokens
    sizes = capture_sizes(scenario)
    if not sizes:
        return []
    rounded = {-(-s // query_len) * query_len for s in sizes}
    return sorted((s for s in rounded if s <= vllm.max_num_seqs * query_len
                   and s <= sizes[-1]), reverse=True)


def capture_list_source(scenario: Scenario) -> str:
    """Where the default list comes from, in words."""
    vllm = settings(scenario)
    largest = ("max_cudagraph_capture_size " + str(vllm.max_cudagraph_capture_size)
               if vllm.max_cudagraph_capture_size is not None
               else "max_cudagraph_capture_size by vLLM's rule")
    return (f"vLLM 0.33.0's FULL decode graphs for cudagraph_mode {vllm.cudagraph_mode}, "
            f"max_num_seqs {vllm.max_num_seqs}, {largest}, "
            f"{vllm.num_speculative_tokens} speculative tokens, max_num_batched_tokens "
            f"{scenario.serving.max_num_batched_tokens}")


def check_capture_sizes(sizes: Sequence[int], max_tokens: int) -> list[int]:
    """The sizes, largest first, without repeats; UserError for one outside 1..max_tokens."""
    for size in sizes:
        if not 1 <= size <= max_tokens:
            raise UserError(f"size {size}: a capture must hold 1 to {max_tokens} tokens (the "
                            "scenario's max_num_batched_tokens sizes the workspace)",
                            field="capture_sizes")
    return sorted(set(sizes), reverse=True)


def sizes_to_capture(scenario: Scenario, sizes: Sequence[int] | None) -> list[int]:
    """`sizes` (capture_sizes), or the scenario's FULL decode graphs; largest first."""
    if sizes is None:
        sizes = full_decode_sizes(scenario)
        if not sizes:
            raise UserError(f"{scenario.name}: cudagraph_mode {settings(scenario).cudagraph_mode} "
                            "puts the attention call in no CUDA graph (vLLM runs it eagerly); set "
                            "[vllm].cudagraph_mode = \"FULL_AND_PIECEWISE\" or give the sizes",
                            field="capture_sizes")
    return check_capture_sizes(sizes, scenario.serving.max_num_batched_tokens)


@dataclass(frozen=True)
class Estimate:
    """vLLM's rule on two samples: first + max(second, 1 MiB) x (graphs - 1)."""

    source: str  # "device" (mem_get_info, as vLLM) or "allocator" (reserved growth)
    first_bytes: int
    second_bytes: int
    per_graph_bytes: int  # max(second, 1 MiB)
    graphs: int
    estimate_bytes: int
    actual_bytes: int  # what the whole list took, by the same measure
    error_bytes: int  # estimate - actual
    error_percent: float | None  # of actual


def vllm_estimate(source: str, samples: Sequence[int], actual: int, graphs: int) -> Estimate:
    """vLLM's extrapolation from the first two captures' growth `samples`."""
    first = samples[0] if samples else 0
    second = samples[1] if len(samples) > 1 else 0
    per_graph = max(second, MIN_PER_GRAPH_BYTES) if graphs > 1 else 0
    estimate = first + per_graph * (graphs - 1) if graphs else 0
    return Estimate(source, first, second, per_graph, graphs, estimate, actual,
                    estimate - actual, round(100 * (estimate - actual) / actual, 2)
                    if actual else None)
