"""`trtllm-serve MODEL ...` as TensorRT-LLM's click command reads it (tensorrt_llm/commands/serve.py,
`serve`, NVIDIA/TensorRT-LLM at 00209af1): its options by their own names (click takes `--x=y`
and no abbreviations), defaults from that file (free_gpu_memory_fraction 0.9, chunked prefill
off) and the LLM API's (BuildConfig max_batch_size 2048, max_num_tokens 8192; KvCacheConfig's
block reuse on, 32 tokens per block). The scenario is TensorRT-LLM's context-MLA reuse rank
(engines/trtllm_context_reuse.py), with vLLM's sparse decode beside it.
"""

from __future__ import annotations

import argparse

from mlamem.errors import UserError
from mlamem.serve_command.parsed import EngineParser, Parsed

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


def parse(words: list[str]):
    given = vars(parser().parse_args(words))
    model = given.pop("model")
    if "config" in given:
        raise UserError(f"{PROG} --config: an LLM API options YAML is not read here; put its "
                        "settings on the command", field="serve")
    unmodelled = sorted(f"--{d}" for d in given if f"--{d}" not in MODELLED)
    tp = given.get("tensor_parallel_size", 1)
    if tp < 1:
        raise UserError(f"{PROG} --tp_size {tp}: must be at least 1", field="serve")
    if "max_seq_len" not in given:
        raise UserError(f"{PROG}: the command sets no --max_seq_len, and TensorRT-LLM's default "
                        "(from the model's config) is not read here: add it", field="serve")
    fraction = given.get("free_gpu_memory_fraction", 0.9)
    chunked = given.get("enable_chunked_prefill", False)
    notes = [f"gpu_memory_utilization {fraction}: TensorRT-LLM's free_gpu_memory_fraction, of "
             "the memory free after the weights",
             "block_reuse on and tokens_per_block 32: KvCacheConfig's defaults",
             "CUDA graphs: TensorRT-LLM's context-reuse emulation captures none"]
    if unmodelled:
        notes.insert(0, "not modelled: " + ", ".join(unmodelled))
    serving = {"max_num_batched_tokens": given.get("max_num_tokens", MAX_NUM_TOKENS),
               "max_model_len": given["max_seq_len"], "kv_cache_dtype": "fp8",
               "block_size": TOKENS_PER_BLOCK,
               "max_batch_size": given.get("max_batch_size", MAX_BATCH_SIZE),
               "block_reuse": True, "chunked_prefill": chunked}
    notes.append("kv_cache_dtype fp8: the fp8 MLA cache an fp8 checkpoint's KvCacheConfig "
                 "dtype 'auto' takes")
    ep = given.get("moe_expert_parallel_size") or tp
    return Parsed(model=model, tensor_parallel=tp, attention_data_parallel=1, tp=tp,
                  serving=serving, memory_fraction=fraction,
                  engines=["trtllm-context-reuse", "vllm"], operations=["sparse-decode"],
                  sections={}, notes=notes + ([f"--ep_size {ep}: the routed experts are placed "
                                               f"over {tp} ranks"] if ep != tp else []),
                  cuda_graphs=False, prog=PROG, flags=FIELD_FLAGS)
