"""Scenarios: a model, its parallelism, a serving configuration and a target GPU, as data.

Scenarios are TOML files (the shipped ones live in `scenarios/`) loaded into frozen pydantic
dataclasses: a file's tables are validated strictly (no bool for an int, no string for a number,
every number finite, no unknown key), then each section checks its own rules. Derived sizes are
properties; inputs are never overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from importlib import resources
from pathlib import Path

import pydantic
from pydantic.dataclasses import dataclass

from mlamem import operations as _operations
from mlamem.operations import decode_token_limit
from mlamem.spec.engine_registry import DEFAULT_ENGINES, engine_names, engine_tables, section_type
from mlamem.spec.errors import UserError
from mlamem.spec.files import CONTROL_CHARACTERS, read_text
from mlamem.spec.models.quantization import SCHEMES
from mlamem.spec.scenario_names import (  # noqa: F401  (DEFAULT_SCENARIO, shipped_names: read from here too)
    DEFAULT_SCENARIO,
    check_exists,
    is_path,
    shipped_names,
)
from mlamem.spec.sections import (  # noqa: F401 (SECTION_CONFIG: read from here too)
    SECTION_CONFIG,
    FieldError,
    check_positive,
    section_model,
)
from mlamem.spec.units import MAX_BYTES, MAX_TOKENS, MiB, format_huge

# The kernel operations a scenario can drive (its top-level `operations` list, names from
# `operation_names()`) and the caches they read: the operation registry's (mlamem.operations).
DEFAULT_OPERATIONS = (_operations.SPARSE_DECODE,)  # what a file without `operations` drives
SPARSE_DECODE_KV_DTYPE = _operations.KV_FORMATS[_operations.SPARSE_DECODE][0]

# KV-cache bytes per token per layer, by the engine's kv-cache dtype name.
KV_CACHE_BYTES_PER_TOKEN = {
    "fp8_ds_mla": 656,  # 512 fp8 NoPE + 4 fp32 scales + 64 bf16 RoPE
    "fp8": 576,  # 576 fp8 values
    "bf16": 1152,  # 576 bf16 values
}

@section_model
class Model:
    """Attention dimensions of one model (whole model, before any parallel split)."""

    name: str  # display name, e.g. "GLM-5 FP8"
    num_attention_heads: int  # query heads
    num_layers: int  # decoder layers, each with one MLA attention
    kv_lora_rank: int  # compressed KV latent dim (the absorbed value dim, d_v)
    qk_rope_head_dim: int  # RoPE part of each q/k head
    qk_nope_head_dim: int  # NoPE part of each q/k head before absorption
    v_head_dim: int  # value head dim before absorption
    index_topk: int | None = None  # DSA indexer top-k; None for a dense-MLA model
    hidden_size: int | None = None  # residual-stream width; sizes the engine's activations
    # The rest of the model, as its config.json names it, for what a rank allocates beyond
    # attention (spec/engines/rank_buffers.py); None where the scenario does not say.
    vocab_size: int | None = None  # the sampler's logits
    intermediate_size: int | None = None  # the dense MLP layers' width
    moe_intermediate_size: int | None = None  # one routed expert's width
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None  # the router's top-k
    n_shared_experts: int | None = None
    first_k_dense_replace: int | None = None  # dense MLP layers before the MoE ones
    index_n_heads: int | None = None  # DSA indexer heads
    q_lora_rank: int | None = None  # the query's compressed width (q_a_proj's output)
    index_head_dim: int | None = None
    num_nextn_predict_layers: int | None = None  # MTP layers the checkpoint ships
    # IndexCache (GLM-5.2's config): 1 of every index_topk_freq DSA layers after the first
    # index_skip_topk_offset computes its own top-k, and only those hold an indexer in vLLM
    # (spec/engines/vllm.py indexer_layer_count); None: the config does not set them
    index_topk_freq: int | None = None
    index_skip_topk_offset: int | None = None
    quantization: str | None = None  # the checkpoint's scheme (spec/models/quantization.py); None: bf16
    architecture: str | None = None  # config.json's architectures[0], e.g. "GlmMoeDsaForCausalLM"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "index_topk", "vocab_size", "intermediate_size",
                     "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                     "index_n_heads", "index_head_dim", "q_lora_rank", "index_topk_freq"):
            if getattr(self, name) is not None:
                check_positive(self, "model", name)
        for name in ("n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers",
                     "index_skip_topk_offset"):
            if (getattr(self, name) or 0) < 0:
                raise FieldError("model", name, "must be >= 0")
            if getattr(self, name):
                check_positive(self, "model", name)
        if self.architecture is not None and not re.fullmatch(r"[A-Za-z_]\w{0,99}", self.architecture):
            raise FieldError("model", "architecture", "expected a class name such as "
                             f"GlmMoeDsaForCausalLM, got {self.architecture[:40]!r}")
        if self.quantization is not None and self.quantization not in SCHEMES:
            raise FieldError("model", "quantization", f"expected one of {', '.join(SCHEMES)} "
                             f"(or leave it out for bf16), got {self.quantization!r}")
        for name in ("num_attention_heads", "num_layers", "kv_lora_rank", "qk_rope_head_dim",
                     "qk_nope_head_dim", "v_head_dim"):
            check_positive(self, "model", name)
        if (self.num_experts_per_tok or 0) > (self.n_routed_experts or 1 << 62):
            raise FieldError("model", "num_experts_per_tok",
                             f"{self.num_experts_per_tok} exceeds n_routed_experts "
                             f"{self.n_routed_experts}")

    @property
    def has_moe(self) -> bool:
        """Whether the scenario gives the MoE layer's shape."""
        return bool(self.n_routed_experts and self.num_experts_per_tok
                    and self.moe_intermediate_size and self.hidden_size)


@section_model
class Parallelism:
    """How one rank sees the model."""

    tensor_parallel: int  # TP size
    attention_data_parallel: int = 1  # attention-DP size; heads are split over TP / DP ranks
    expert_parallel: bool = False  # the routed experts split over the TP x DP ranks (EP)
    weights_gib_per_rank: float | None = None  # model weights one rank holds, GiB
    weights_note: str = ""  # where weights_gib_per_rank comes from (measured, estimate, placeholder)

    def __post_init__(self) -> None:
        if self.weights_gib_per_rank is not None and self.weights_gib_per_rank < 0:
            raise FieldError("parallel", "weights_gib_per_rank", "must be >= 0")
        check_positive(self, "parallel", "tensor_parallel")
        check_positive(self, "parallel", "attention_data_parallel")
        if self.tensor_parallel % self.attention_data_parallel:
            raise FieldError("parallel", "attention_data_parallel",
                               "must divide tensor_parallel")

    @property
    def weights_bytes(self) -> int:
        """Weights one rank holds; 0 when the scenario states none."""
        return round((self.weights_gib_per_rank or 0) * 1024**3)

    @property
    def attention_tensor_parallel(self) -> int:
        """Ranks that split the attention heads (TP / attention-DP)."""
        return self.tensor_parallel // self.attention_data_parallel


@section_model
class Serving:
    """The serving configuration every engine reads; an engine's own settings are its table
    (`Scenario.section`)."""

    max_num_batched_tokens: int  # tokens per step; sizes the engine's attention workspace
    max_model_len: int  # longest sequence
    kv_cache_dtype: str  # one of KV_CACHE_BYTES_PER_TOKEN
    block_size: int  # KV-cache page size in tokens
    synthetic_topk: int | None = None  # topk that drives the sparse operations for dense models
    max_batch_size: int | None = None  # requests per step (TRT-LLM max_batch_size); sizes dense decode
    decode_context_len: int | None = None  # context tokens of each request in the dense decode batch
    block_reuse: bool = False  # prefix (KV block) reuse across requests
    chunked_prefill: bool = True  # long prompts split into chunks of max_num_batched_tokens

    def __post_init__(self) -> None:
        if self.max_batch_size is not None:
            check_positive(self, "serving", "max_batch_size")
        for name in ("max_num_batched_tokens", "max_model_len", "block_size"):
            check_positive(self, "serving", name)
        if self.synthetic_topk is not None:
            check_positive(self, "serving", "synthetic_topk")
        if self.decode_context_len is not None:
            check_positive(self, "serving", "decode_context_len")
            if self.decode_context_len > self.max_model_len:
                raise FieldError("serving", "decode_context_len",
                                   f"{self.decode_context_len} exceeds [serving].max_model_len "
                                   f"{self.max_model_len}: a request cannot hold more tokens than "
                                   "a sequence; lower it or raise max_model_len")
        if self.kv_cache_dtype not in KV_CACHE_BYTES_PER_TOKEN:
            raise FieldError("serving", "kv_cache_dtype",
                               f"expected one of {sorted(KV_CACHE_BYTES_PER_TOKEN)}, "
                               f"got {self.kv_cache_dtype!r}")


@section_model
class TargetGPU:
    """The GPU the scenario is sized for (not necessarily the one measuring it)."""

    name: str  # e.g. "H100 SXM 80GB"
    memory_mib: int  # total device memory (as CUDA reports it, or nvidia-smi; see each file)
    gpu_memory_utilization: float  # the engine's fraction of memory it may use
    sm_count: int  # streaming multiprocessors; FlashMLA's split-KV scheduling depends on it

    def __post_init__(self) -> None:
        check_positive(self, "gpu", "memory_mib", maximum=MAX_BYTES // MiB)
        check_positive(self, "gpu", "sm_count")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise FieldError("gpu", "gpu_memory_utilization", "must be in (0, 1]")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024**2


@dataclass(frozen=True, config=pydantic.ConfigDict(arbitrary_types_allowed=True))
class Scenario:
    """One tensor-parallel rank of a model served by an engine on a target GPU."""

    name: str
    description: str
    model: Model
    parallel: Parallelism
    serving: Serving
    gpu: TargetGPU
    operations: tuple[str, ...] = DEFAULT_OPERATIONS  # kernel operations it drives (operation_names())
    engines: tuple[str, ...] = DEFAULT_ENGINES  # engines serving it (mlamem.engines), first: default
    source: str = ""  # where it was loaded from
    # the engines' own tables the file gives ([vllm], ...), by engine name: see `section`
    sections: dict[str, object] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check_operations(self.operations)  # pydantic has made a list a tuple
        _check_engines(self.engines)
        if self.model.num_attention_heads % self.parallel.attention_tensor_parallel:
            raise FieldError("parallel", "tensor_parallel",
                               "must divide model.num_attention_heads (with attention-DP)")
        _check_serving_for_operations(self)

    def section(self, engine: str):
        """Engine `engine`'s own table (its registry `section` class): as the file gave it, else
        its defaults."""
        given = self.sections.get(engine)
        return given if given is not None else section_type(engine)()

    @property
    def sparse_operations(self) -> tuple[str, ...]:
        """The operations that attend a top-k of the KV (sparse-decode, sparse-prefill)."""
        return tuple(op for op in self.operations if _operations.operation(op).sparse)

    @property
    def heads_per_rank(self) -> int:
        """Query heads one rank's attention computes."""
        return self.model.num_attention_heads // self.parallel.attention_tensor_parallel

    @property
    def decode_topk(self) -> int | None:
        """KV tokens each query attends in the sparse operations (sparse decode and prefill): the
        indexer's topk, else synthetic. None when the scenario drives no sparse operation (dense
        decode attends every cached token); validation guarantees an int otherwise."""
        if not self.sparse_operations:
            return None
        return self.model.index_topk or self.serving.synthetic_topk

    @property
    def d_qk(self) -> int:
        """q/k width seen by the absorbed MLA kernel: latent + RoPE (576 for these models)."""
        return self.model.kv_lora_rank + self.model.qk_rope_head_dim

    @property
    def d_v(self) -> int:
        """Output width of the absorbed MLA kernel: the latent (512)."""
        return self.model.kv_lora_rank

    @property
    def softmax_scale(self) -> float:
        """The model's attention scale, 1/sqrt(qk_nope + qk_rope)."""
        return (self.model.qk_nope_head_dim + self.model.qk_rope_head_dim) ** -0.5

    @property
    def kv_cache_bytes_per_token_per_layer(self) -> int:
        return KV_CACHE_BYTES_PER_TOKEN[self.serving.kv_cache_dtype]

    def one_line(self) -> str:
        """A one-line summary for listings."""
        p = self.parallel
        par = f"TP{p.tensor_parallel}" + (f" DP{p.attention_data_parallel}"
                                          if p.attention_data_parallel > 1 else "")
        s = self.serving
        shape = [f"topk {self.decode_topk}"] if self.decode_topk is not None else []
        if "dense-decode" in self.operations:
            shape.append(f"batch {s.max_batch_size} x {s.decode_context_len} tokens")
        return ", ".join([f"{self.model.name}", par, f"{self.heads_per_rank} heads/rank",
                          "+".join(self.operations), *shape,
                          f"MNBT {s.max_num_batched_tokens}", s.kv_cache_dtype,
                          f"{self.gpu.name} @ {self.gpu.gpu_memory_utilization}"])


def _check_operations(operations: tuple[str, ...]) -> None:
    """The top-level `operations`: a non-empty list of distinct registered operations."""
    _check_names("operations", "operation", operations, list(_operations.operation_names()),
                 list(DEFAULT_OPERATIONS))


def _check_engines(engines: tuple[str, ...]) -> None:
    """The top-level `engines`: a non-empty list of distinct registered engine names."""
    _check_names("engines", "engine", engines, engine_names(), list(DEFAULT_ENGINES))


def _check_names(field: str, what: str, names: tuple[str, ...], known: list[str],
                 default: list[str]) -> None:
    """A top-level list of names: not empty, each known, none twice."""
    if not names:
        raise FieldError("top", field, f"is empty; list at least one of {known}, or leave it "
                                        f"out for {default}")
    for name in names:
        if name not in known:
            raise FieldError("top", field, f"has unknown {name!r}; expected names from {known}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise FieldError("top", field, f"lists {repeated[0]!r} more than once; name each "
                                        f"{what} once")


def _check_serving_for_operations(scenario: Scenario) -> None:
    """What each operation needs of [model] and [serving]; errors name the field and the fix."""
    ops, m, s = scenario.operations, scenario.model, scenario.serving
    sparse = scenario.sparse_operations
    if sparse and m.index_topk is None and s.synthetic_topk is None:
        raise FieldError("serving", "synthetic_topk",
                           f"is required for {sparse[0]} on a dense-MLA model ([model].index_topk "
                           f"unset): set it, or drop {'/'.join(sparse)} from operations")
    if not sparse and s.synthetic_topk is not None:
        raise FieldError("serving", "synthetic_topk",
                           f"is set but no operation uses it (operations {list(ops)}): remove it, "
                           "or add sparse-decode or sparse-prefill to operations")
    _check_one_cache(ops)
    for op in ops:
        problem = _operations.operation(op).serving_problem(scenario)
        if problem is not None:
            raise FieldError("serving", *problem)
    users = [n for n in _operations.operation_names()
             if "decode_context_len" in _operations.operation(n).serving_fields]
    if s.decode_context_len is not None and not set(users) & set(ops):
        raise FieldError("serving", "decode_context_len",
                           f"is set but no operation uses it (operations {list(ops)}): remove it, "
                           f"or add {' or '.join(users)} to operations")


def _check_one_cache(ops: tuple[str, ...]) -> None:
    """The operations that read the scenario's own cache must agree on its format."""
    readers = [_operations.operation(op) for op in ops]
    readers = [r for r in readers if r.reads_scenario_cache]
    for i, first in enumerate(readers):
        for second in readers[i + 1:]:
            if not set(first.kv_formats) & set(second.kv_formats):
                raise FieldError("top", "operations",
                                   f"lists both {first.name} and {second.name}, which read "
                                   f"different caches ({' or '.join(first.kv_formats)} vs "
                                   f"{' or '.join(second.kv_formats)}): keep one and put the "
                                   "other in its own scenario")


# The cache every decode kernel here reads (kernels/fp8_ds_mla.py for sparse decode; a plain
# bf16 or fp8 cache for dense decode): a 512-wide latent, which is d_v, and 64 RoPE values, so
# d_qk = 576.
DECODE_LATENT = 512  # [model].kv_lora_rank the kernels take
DECODE_ROPE = 64  # [model].qk_rope_head_dim the kernels take


def check_decode(scenario: Scenario, head_counts: tuple[int, ...], kernel_label: str) -> int:
    """Refuse, naming the TOML field, a scenario the decode kernel cannot run; else return the
    head count the kernel pads each rank's heads to. Pure arithmetic: call it before any work."""
    m, p = scenario.model, scenario.parallel
    where = f"{scenario.source or scenario.name}: "
    cache = (SPARSE_DECODE_KV_DTYPE if "sparse-decode" in scenario.operations
             else scenario.serving.kv_cache_dtype)
    for field, value, wanted in (("kv_lora_rank", m.kv_lora_rank, DECODE_LATENT),
                                 ("qk_rope_head_dim", m.qk_rope_head_dim, DECODE_ROPE)):
        if value != wanted:
            raise UserError(f"{where}[model].{field} is {value}; {kernel_label} reads the {cache} "
                            f"cache (d_qk {DECODE_LATENT + DECODE_ROPE} = {DECODE_LATENT} latent + "
                            f"{DECODE_ROPE} RoPE, d_v {DECODE_LATENT}): set it to {wanted}")
    topk = scenario.decode_topk  # None: no sparse operation, so no top-k to bound
    if topk is not None and topk > scenario.serving.max_model_len:
        field = "[model].index_topk" if m.index_topk else "[serving].synthetic_topk"
        raise UserError(f"{where}{field} {topk} exceeds [serving].max_model_len "
                        f"{scenario.serving.max_model_len}: a query cannot attend more tokens than "
                        "a sequence holds; lower it or raise max_model_len")
    heads, most = scenario.heads_per_rank, max(head_counts)
    if heads > most:
        n = m.num_attention_heads  # attention ranks must divide it: try its divisors
        ranks = sorted(d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)
                       if n // d <= most)
        fix = (f"set [parallel].tensor_parallel to {ranks[0] * p.attention_data_parallel} or "
               "more" if ranks else f"lower [model].num_attention_heads to {most}")
        ranks_text = f"{p.attention_tensor_parallel} attention rank" + (
            "s" if p.attention_tensor_parallel > 1 else "")
        raise UserError(f"{where}[parallel].tensor_parallel {p.tensor_parallel} leaves {heads} heads "
                        f"per rank ([model].num_attention_heads {m.num_attention_heads} over "
                        f"{ranks_text}); {kernel_label} runs at most {most}: {fix}")
    return min(h for h in head_counts if h >= heads)


def check_decode_tokens(scenario: Scenario, padded_heads: int | None, tokens, *,
                        field: str = "tokens", max_tokens: int | None = None,
                        max_tokens_field: str | None = None, workspace: bool = False) -> None:
    """Refuse a T, and a max_num_batched_tokens (which sizes the workspace), whose tensors
    cannot exist. With `workspace` (a path staged in it runs, so it bounds T) the message leads
    with max_num_batched_tokens where that is the lower bound, then names the largest T.
    `padded_heads` None (the kernel not loaded yet): only int32 is checked. `max_tokens`
    overrides the scenario's max_num_batched_tokens and `max_tokens_field` names the field
    that gave it (None: the scenario)."""
    limit = MAX_TOKENS if padded_heads is None else decode_token_limit(scenario, padded_heads)
    largest = (f"at most {limit}" if padded_heads is None else
               f"the largest T {scenario.name} can take is {limit}")

    def why(count: int) -> str:
        size = count * (padded_heads or 0) * (scenario.d_qk + scenario.d_v) * 2
        if size > MAX_BYTES:
            return (f"q and out of that many tokens ({padded_heads} heads, bf16) would take "
                    f"{format_huge(size)}, over the {format_huge(MAX_BYTES)} any tensor here "
                    "may take")
        return "engines and kernels count tokens in int32"

    mnbt = scenario.serving.max_num_batched_tokens if max_tokens is None else max_tokens
    for t in tokens:
        if t > limit and workspace and mnbt < limit:  # the bound a sweep meets first
            raise UserError(f"T={t} exceeds {scenario.name}'s max_num_batched_tokens={mnbt}, "
                            f"which bounds the T a sweep takes, and no raise reaches it: "
                            f"{why(t)} ({largest})", field=field)
        if t > limit:
            raise UserError(f"T={t} cannot run: {why(t)}; {largest}", field=field)
    if mnbt > limit:
        where = "" if max_tokens_field else (f"{scenario.source or scenario.name}: "
                                             "[serving].max_num_batched_tokens ")
        raise UserError(f"{where}{mnbt} cannot be reserved: {why(mnbt)}; {largest}",
                        field=max_tokens_field)


_SECTIONS = {"model": Model, "parallel": Parallelism, "serving": Serving, "gpu": TargetGPU}


# pydantic's error types, in the words a field's problem is told in
_TYPE_WORDS = {"int_type": "int", "float_type": "float", "string_type": "str", "bool_type": "bool",
               "finite_number": "a finite number"}


def _build(cls: type, table: object, section: str):
    """Build a section from a TOML table (`cls` a section_model, or a plain dataclass that is
    made one): unknown keys, missing ones and wrong types are FieldErrors naming the key."""
    if not isinstance(table, dict):
        raise FieldError(section, "", "must be a table")
    model = cls if pydantic.dataclasses.is_pydantic_dataclass(cls) else section_model(cls)
    fields = [f.name for f in dataclasses.fields(model)]
    for key in table:
        if key not in fields:
            raise FieldError(section, key, f"is not a known field; expected one of {fields}")
    try:
        return model(**table)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        if error["type"] == "missing":
            raise FieldError(section, name, "is missing") from None
        words = _TYPE_WORDS.get(error["type"], error["msg"].lower())
        raise FieldError(section, name, f"must be {words}, got {error['input']!r}") from None


def load(name_or_path: str) -> Scenario:
    """Load a shipped scenario by name, or a user's TOML file by path."""
    check_exists(name_or_path)
    if is_path(name_or_path):
        path = Path(name_or_path)
        return parse(read_text(path, "scenario file (TOML)"), str(path))
    text = (resources.files("mlamem.scenarios") / f"{name_or_path}.toml").read_text()
    return parse(text, f"{name_or_path}.toml")


def parse(text: str, source: str) -> Scenario:
    """Parse scenario TOML text; errors name the source and the field (a nan or inf the model's
    sections refuse, naming the field)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: not valid TOML ({exc}); fix the file") from None
    return from_dict(data, source)


def to_dict(scenario: Scenario) -> dict:
    """The scenario as plain data, in the TOML layout (`from_dict` reads it back)."""
    data = {"name": scenario.name, "description": scenario.description,
            "operations": list(scenario.operations), "engines": list(scenario.engines)}
    for section in _SECTIONS:
        fields = dataclasses.asdict(getattr(scenario, section))
        data[section] = {k: v for k, v in fields.items() if v is not None}
    for engine, table in scenario.sections.items():
        data[engine] = {k: v for k, v in dataclasses.asdict(table).items() if v is not None}
    return data


def _toml_value(value: object) -> str:
    """A TOML value: JSON's string escapes are TOML's basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value).replace("\x7f", "\\u007f")  # TOML refuses a raw DEL
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def to_toml(scenario: Scenario) -> str:
    """The scenario as a scenario file (`parse` reads it back to an equal scenario)."""
    data = to_dict(scenario)
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items()
             if not isinstance(value, dict)]
    for table, fields in data.items():
        if isinstance(fields, dict):
            lines += ["", f"[{table}]", *(f"{k} = {_toml_value(v)}" for k, v in fields.items())]
    return "\n".join(lines) + "\n"


def file_schema() -> dict:
    """The JSON Schema of a scenario file (its TOML as data): the top-level keys, the four
    sections and every engine's own table, each from its model."""
    tables = engine_tables()
    properties = {
        "name": {"type": "string"}, "description": {"type": "string"},
        "operations": {"type": "array", "items": {"enum": list(_operations.operation_names())}, "minItems": 1,
                       "uniqueItems": True, "default": list(DEFAULT_OPERATIONS)},
        "engines": {"type": "array", "items": {"enum": engine_names()}, "minItems": 1,
                    "uniqueItems": True, "default": list(DEFAULT_ENGINES)}}
    for name, cls in {**_SECTIONS, **tables}.items():
        properties[name] = {**pydantic.TypeAdapter(cls).json_schema(), "additionalProperties": False}
    return {"title": "mlamem scenario", "type": "object", "properties": properties,
            "required": ["name", "description", *_SECTIONS], "additionalProperties": False}


# Version 1 of the layout kept vLLM's CUDA-graph settings in [serving]; they are its own table now.
MOVED_TO_ENGINE = {"vllm": ("max_num_seqs", "max_cudagraph_capture_size", "cudagraph_mode",
                            "num_speculative_tokens")}


def migrate(data: dict) -> dict:
    """Data in the older layout, in today's: each engine's settings moved from [serving] to its
    own table. One step; data already in today's layout comes back as it was."""
    serving = data.get("serving")
    if not isinstance(serving, dict):
        return data
    data, serving = dict(data), dict(serving)
    for engine, names in MOVED_TO_ENGINE.items():
        moved = {name: serving.pop(name) for name in names if name in serving}
        if not moved:
            continue
        table = data.get(engine, {})
        if isinstance(table, dict):
            both = sorted(set(moved) & set(table))
            if both:
                raise FieldError("serving", both[0], f"is also in [{engine}]; keep it only there")
            data[engine] = {**moved, **table}
    data["serving"] = serving
    return data


def from_dict(data: dict, source: str) -> Scenario:
    """Build a scenario from TOML-layout data; errors name the source and the field."""
    try:
        data = migrate(data)
        tables = list(engine_tables())
        unknown = (set(data) - set(_SECTIONS) - set(tables)
                   - {"name", "description", "operations", "engines"})
        if unknown:
            raise FieldError(sorted(unknown)[0], "", "is not a known section; expected "
                             f"name, description, operations, engines, "
                             f"{', '.join([*_SECTIONS, *tables])}")
        for top in ("name", "description"):
            if not isinstance(data.get(top), str):
                raise FieldError("top", top, "must be a string")
        if CONTROL_CHARACTERS.search(data["name"]):  # a name is one line of printable text
            raise FieldError("top", "name", f"{data['name']!r} holds a control character or a "
                             "line break; write the name on one line, in printable characters")
        operations = data.get("operations", list(DEFAULT_OPERATIONS))
        if not (isinstance(operations, list) and all(isinstance(op, str) for op in operations)):
            raise FieldError("top", "operations", "must be a list of names from "
                             f"{list(_operations.operation_names())}, got {operations!r}")
        engines = data.get("engines", list(DEFAULT_ENGINES))
        if not (isinstance(engines, list) and all(isinstance(name, str) for name in engines)):
            raise FieldError("top", "engines", "must be a list of names from "
                                                f"{engine_names()}, got {engines!r}")
        sections = {}
        for key, cls in _SECTIONS.items():
            if key not in data:
                raise FieldError(key, "", "section is missing")
            sections[key] = _build(cls, data[key], key)
        given = {name: _build(section_type(name), data[name], name)
                 for name in tables if name in data}
        for name in engines:  # a declared engine's table must hold what it requires
            if name in tables and name not in given:
                _build(section_type(name), {}, name)
        return Scenario(name=data["name"], description=data["description"], source=source,
                        operations=tuple(operations), engines=tuple(engines), sections=given,
                        **sections)
    except FieldError as exc:
        raise UserError(f"{source}: {exc}; fix that field") from None
