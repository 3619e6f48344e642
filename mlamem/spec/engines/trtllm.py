"""TensorRT-LLM's context-MLA reuse, as the spec layer knows it (no torch): its reserve variants,
its `trtllm-serve` parser and how its saved results read (`SPEC`); its rank is
`mlamem.engines.trtllm_context_reuse`, its reserve arithmetic `context_reserve.py`.

The serve command: `trtllm-serve MODEL ...` as TensorRT-LLM's click command reads it
(tensorrt_llm/commands/serve.py, `serve`, NVIDIA/TensorRT-LLM at 00209af1): its options by their
own names (click takes `--x=y` and no abbreviations), defaults from that file
(free_gpu_memory_fraction 0.9, chunked prefill off) and the LLM API's (BuildConfig
max_batch_size 2048, max_num_tokens 8192; KvCacheConfig's block reuse on, 32 tokens per
block). The scenario is TensorRT-LLM's context-MLA reuse rank (engines/trtllm_context_reuse.py),
with vLLM's sparse decode beside it.

`--config FILE` (or `--extra_llm_api_options FILE`) is read as trtllm-serve at 00209af1 reads it:
`with_config_file`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mlamem.spec.engines import Column, EngineSpec, View
from mlamem.spec.errors import UserError
from mlamem.spec.serve_command import config_file
from mlamem.spec.serve_command.parsed import EngineParser, Parsed
from mlamem.spec.units import format_bytes

VARIANTS = ("none", "fp8", "full")  # no reserve, the PR's fp8-only reserve, everything charged
VARIANT_LABELS = {"none": "no reserve", "fp8": "fp8-only reserve (the PR)",
                  "full": "everything charged (plan's reserve)"}


PROG = "trtllm-serve"
# every option of `serve`: name (and aliases) -> its type; None: a flag without a value
OPTIONS = {
    ("--tokenizer",): str, ("--custom_tokenizer",): str, ("--host",): str, ("--port",): int,
    ("--backend",): str, ("--custom_module_dirs",): str, ("--log_level",): str,
    ("--max_beam_width",): int, ("--max_batch_size",): int, ("--max_num_tokens",): int,
    ("--max_seq_len",): int, ("--tensor_parallel_size", "--tp_size"): int,
    ("--pipeline_parallel_size", "--pp_size"): int, ("--context_parallel_size", "--cp_size"): int,
    ("--moe_expert_parallel_size", "--ep_size"): int,
    ("--moe_cluster_parallel_size", "--cluster_size"): int, ("--gpus_per_node",): int,
    ("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"): float,
    ("--num_postprocess_workers",): int, ("--trust_remote_code",): None, ("--revision",): str,
    ("--config", "--extra_llm_api_options"): str, ("--reasoning_parser",): str,
    ("--tool_parser",): str, ("--metadata_server_config_file",): str, ("--server_role",): str,
    ("--fail_fast_on_attention_window_too_large",): None, ("--otlp_traces_endpoint",): str,
    ("--disagg_cluster_uri",): str, ("--enable_chunked_prefill",): None,
    ("--media_io_kwargs",): str, ("--chat_template",): str,
}
MODELLED = {"--max_batch_size", "--max_num_tokens", "--max_seq_len", "--tensor_parallel_size",
            "--free_gpu_memory_fraction", "--enable_chunked_prefill", "--moe_expert_parallel_size"}
# the scenario's fields as TensorRT-LLM's options set them
FIELD_FLAGS = {"tensor_parallel": "--tp_size", "max_num_batched_tokens": "--max_num_tokens",
               "max_model_len": "--max_seq_len", "max_batch_size": "--max_batch_size",
               "gpu_memory_utilization": "--kv_cache_free_gpu_memory_fraction"}
MAX_BATCH_SIZE, MAX_NUM_TOKENS = 2048, 8192  # BuildConfig's defaults
TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block


def parser() -> argparse.ArgumentParser:
    p = EngineParser(prog=PROG, add_help=False, allow_abbrev=False)
    p.add_argument("model")
    for names, kind in OPTIONS.items():
        extra = {"action": "store_true"} if kind is None else {"type": kind}
        p.add_argument(*names, dest=names[0][2:], default=argparse.SUPPRESS, **extra)
    return p


# the LLM API fields of an options file that mlamem models: field -> (the option's dest in
# `given`, the option's name for the notes, the value's kind)
FILE_FIELDS = {"max_batch_size": ("max_batch_size", "--max_batch_size", "int"),
               "max_num_tokens": ("max_num_tokens", "--max_num_tokens", "int"),
               "max_seq_len": ("max_seq_len", "--max_seq_len", "int"),
               "tensor_parallel_size": ("tensor_parallel_size", "--tp_size", "int"),
               "moe_expert_parallel_size": ("moe_expert_parallel_size", "--ep_size", "int|null"),
               "enable_chunked_prefill": ("enable_chunked_prefill", "--enable_chunked_prefill",
                                          "bool"),
               "model": ("model", "MODEL", "str")}
# ... and of its kv_cache_config (KvCacheConfig's fields): field -> (dest, kind)
KV_FIELDS = {"free_gpu_memory_fraction": ("free_gpu_memory_fraction", "fraction"),
             "enable_block_reuse": ("block_reuse", "bool"),
             "tokens_per_block": ("tokens_per_block", "int"), "dtype": ("kv_dtype", "str")}
KV_DTYPES = ("auto", "fp8")  # the fp8 MLA cache mlamem models: an fp8 checkpoint's auto, or fp8
# trtllm-serve's option names that are no LLM API field: the field a file names instead
OPTION_FIELDS = {"tp_size": "tensor_parallel_size", "pp_size": "pipeline_parallel_size",
                 "cp_size": "context_parallel_size", "ep_size": "moe_expert_parallel_size",
                 "cluster_size": "moe_cluster_parallel_size",
                 "free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction",
                 "kv_cache_free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction"}
_KINDS = {"int": "an integer", "int|null": "an integer or null", "bool": "true or false",
          "str": "a string", "fraction": "a number"}


def _checked(path: Path, name: str, value, kind: str):
    """`value` if it is of `kind`, else one line naming the file's key."""
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str),
          "fraction": isinstance(value, (int, float)) and not isinstance(value, bool)}
    if kind == "int|null":
        ok["int|null"] = value is None or ok["int"]
    if not ok[kind]:
        raise UserError(f"{path}: {name}: expected {_KINDS[kind]}, got {value!r}", field="serve")
    return value


def with_config_file(given: dict, model: str) -> tuple[str, list[str], list[str]]:
    """The command's options (`given`, updated in place) and model with a `--config FILE`'s
    LLM API options laid over them, as trtllm-serve does at 00209af1 (commands/serve.py
    `serve`: yaml.safe_load of the file, whatever its name, then llmapi/llm_args.py
    update_llm_args_with_extra_dict): the file's top-level fields replace what the command's
    options set (`llm_args | file`: the file wins; explicit flags win only from PR #14812, June
    2026, whose description says the file overrode them until then), and its kv_cache_config is
    laid key by key over the command's (PR #9262, late 2025; 00209af1 has the gRPC server of
    PR #11037, January 2026, so it is later), so --kv_cache_free_gpu_memory_fraction stands
    unless the file's kv_cache_config sets free_gpu_memory_fraction. The file's null stops
    trtllm-serve (the merge takes a mapping). Fields mlamem models: FILE_FIELDS and KV_FIELDS,
    each of the type the LLM API declares; every other one is named. Returns (model, the file's
    unmodelled fields, notes)."""
    path = Path(given.pop("config"))
    options = config_file.load(path)
    if options is None:
        raise UserError(f"{path}: empty: trtllm-serve hands the file's null to "
                        "update_llm_args_with_extra_dict, which takes a mapping; write LLM API "
                        "options in it, or drop --config", field="serve")
    if not isinstance(options, dict):
        raise UserError(f"{path}: a TensorRT-LLM options file is a mapping of LLM API fields "
                        "(max_batch_size: 64, kv_cache_config: {...})", field="serve")
    unmodelled, notes = [], []
    for key, value in options.items():
        if not isinstance(key, str):
            raise config_file.key_error(path, key, "TensorRT-LLM")
        if key == "kv_cache_config":
            unmodelled += _kv_cache_config(path, value, given, notes)
        elif key in FILE_FIELDS:
            dest, option, kind = FILE_FIELDS[key]
            value = _checked(path, key, value, kind)
            before = model if dest == "model" else given.get(dest)
            if (dest == "model" or dest in given) and before != value:
                notes.append(f"{key} {value}: the file's, over the command's {option} {before} "
                             "(trtllm-serve's file overrides its options)")
            if dest == "model":
                model = value
            else:
                given[dest] = value
        else:
            unmodelled.append(key)
            if key in OPTION_FIELDS:
                notes.append(f"{key} in {path}: a trtllm-serve option's name, not an LLM API "
                             f"field; the file's field is {OPTION_FIELDS[key]}")
    return model, unmodelled, notes


def _kv_cache_config(path: Path, table, given: dict, notes: list[str]) -> list[str]:
    """The file's kv_cache_config over the command's: the modelled fields into `given`, the
    others' names returned."""
    if not isinstance(table, dict):
        raise UserError(f"{path}: kv_cache_config: expected a mapping of KvCacheConfig fields, "
                        f"got {table!r}", field="serve")
    unmodelled = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise config_file.key_error(path, key, "TensorRT-LLM")
        if key not in KV_FIELDS:
            unmodelled.append(f"kv_cache_config.{key}")
            continue
        dest, kind = KV_FIELDS[key]
        value = _checked(path, f"kv_cache_config.{key}", value, kind)
        if dest == "free_gpu_memory_fraction" and dest in given and given[dest] != value:
            notes.append(f"kv_cache_config.free_gpu_memory_fraction {value}: the file's, over the "
                         f"command's --kv_cache_free_gpu_memory_fraction {given[dest]}")
        if dest == "kv_dtype" and value not in KV_DTYPES:
            raise UserError(f"{path}: kv_cache_config.dtype {value}: mlamem models the fp8 MLA "
                            f"cache; use {' or '.join(KV_DTYPES)}", field="serve")
        given[dest] = value
    return unmodelled


def parse(words: list[str]):
    given = vars(parser().parse_args(words))
    model = given.pop("model")
    from_file, file_notes = [], []
    if "config" in given:
        model, from_file, file_notes = with_config_file(given, model)
    kv = {key: given.pop(key) for key in ("block_reuse", "tokens_per_block", "kv_dtype")
          if key in given}
    unmodelled = sorted([f"--{d}" for d in given if f"--{d}" not in MODELLED] + from_file)
    tp = given.get("tensor_parallel_size", 1)
    if tp < 1:
        raise UserError(f"{PROG} --tp_size {tp}: must be at least 1", field="serve")
    if "max_seq_len" not in given:
        raise UserError(f"{PROG}: the command sets no --max_seq_len (nor its --config file "
                        "max_seq_len), and TensorRT-LLM's default (from the model's config) is "
                        "not read here: add it", field="serve")
    fraction = given.get("free_gpu_memory_fraction", 0.9)
    chunked = given.get("enable_chunked_prefill", False)
    reuse, block = kv.get("block_reuse", True), kv.get("tokens_per_block", TOKENS_PER_BLOCK)
    notes = [f"gpu_memory_utilization {fraction}: TensorRT-LLM's free_gpu_memory_fraction, of "
             "the memory free after the weights",
             f"block_reuse {'on' if reuse else 'off'} and tokens_per_block {block}: "
             + ("KvCacheConfig's defaults" if not {"block_reuse", "tokens_per_block"} & set(kv)
                else "the --config file's kv_cache_config, KvCacheConfig's defaults for the rest"),
             "CUDA graphs: TensorRT-LLM's context-reuse emulation captures none", *file_notes]
    if unmodelled:
        notes.insert(0, "not modelled: " + ", ".join(unmodelled))
    serving = {"max_num_batched_tokens": given.get("max_num_tokens", MAX_NUM_TOKENS),
               "max_model_len": given["max_seq_len"], "kv_cache_dtype": "fp8",
               "block_size": block,
               "max_batch_size": given.get("max_batch_size", MAX_BATCH_SIZE),
               "block_reuse": reuse, "chunked_prefill": chunked}
    notes.append("kv_cache_dtype fp8: " + (
        "the --config file's kv_cache_config.dtype fp8" if kv.get("kv_dtype") == "fp8" else
        "the fp8 MLA cache an fp8 checkpoint's KvCacheConfig dtype 'auto' takes"))
    ep = given.get("moe_expert_parallel_size") or tp
    return Parsed(model=model, tensor_parallel=tp, attention_data_parallel=1, tp=tp,
                  serving=serving, memory_fraction=fraction,
                  engines=["trtllm-context-reuse", "vllm"], operations=["sparse-decode"],
                  sections={}, notes=notes + ([f"--ep_size {ep}: the routed experts are placed "
                                               f"over {tp} ranks"] if ep != tp else []),
                  cuda_graphs=False, prog=PROG, flags=FIELD_FLAGS, expert_parallel=ep > 1)


# -- how its saved results read --

def _reserve(case: dict) -> str:
    return "-" if case.get("reserve_bytes") is None else format_bytes(case["reserve_bytes"])


def _admission_cap(case: dict) -> str:
    cap = case.get("admission_cap_tokens")
    return "none" if cap is None else str(cap)


def _kv_pool_tokens(case: dict) -> str:
    return "n/a" if case.get("kv_pool_tokens") is None else str(case["kv_pool_tokens"])


def _admitted(case: dict) -> str:
    return f"{len(case.get('admitted', []))} / {len(case.get('trimmed', []))}"


def _attended(case: dict) -> str:
    return "n/a" if case.get("attended_tokens") is None else str(case["attended_tokens"])


def _budget_rule(budget: dict, cases: list[dict]) -> str:
    """TRT-LLM's KV budget rule, with the figures of the first case that sized one."""
    figures = ""
    case = next((c for c in cases if c.get("budget_bytes") is not None), None)
    if case is not None:
        cap, weights, profile = (case["torch_limit_bytes"], case["weights_bytes"],
                                 case["profile_peak_bytes"])
        figures = f" = {format_bytes(case['budget_bytes'])}"
        if int(budget["utilization"] * (cap - weights - profile)) == case["budget_bytes"]:
            figures = (f" = {budget['utilization']} x ({format_bytes(cap)} - "
                       f"{format_bytes(weights)} - {format_bytes(profile)}){figures}")
    return (f"KV budget rule (TRT-LLM's): free_gpu_memory_fraction x (total - non-torch - "
            f"weights - profile peak){figures}; each variant's reserve comes out of it. "
            "`mlamem plan` charges neither the profile peak nor non-torch memory, so its "
            "reserves differ")


_CELLS = (("reserve", _reserve), ("admission cap", _admission_cap),
          ("KV pool tokens", _kv_pool_tokens), ("admitted / trimmed", _admitted),
          ("attended KV", _attended))

VIEW = View(
    heading="Context-MLA reuse OOM",
    cases_named="reserve variants",
    table_title="{scenario}, context-MLA reuse{predicted}",
    table_columns=tuple(Column(header.replace(" ", "\n", 1), cell) for header, cell in _CELLS),
    markdown_columns=tuple(Column(header, cell) for header, cell in _CELLS),
    row_name=lambda c: VARIANT_LABELS[c["variant"]],
    case_label=lambda c: VARIANT_LABELS[c["variant"]],
    verdict_in_notes=lambda c: True,
    budget_rule=_budget_rule)


SPEC = EngineSpec(name="trtllm-context-reuse", rank="mlamem.engines.trtllm_context_reuse:TRTLLMContextReuse",
                  view=VIEW, key_field="variant")
