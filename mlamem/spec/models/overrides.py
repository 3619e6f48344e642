"""A scenario with the model, GPU and weights a user names: the config's [model] table and its
weights per rank at a layout, shared by `--serve` (serve_command) and the commands' --model,
--gpu and --weights-per-rank (`apply`), and the one line that says one rank's weights do not fit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from mlamem.spec import gpus
from mlamem.spec.errors import UserError
from mlamem.spec.models.hf_config import ModelConfig, load_config
from mlamem.spec.models.weights import UP_PROJECTION_COPIES, count_weights, fit_line, weights_per_rank

if TYPE_CHECKING:
    from mlamem.spec.scenario import Scenario

OVERRIDE_NOTE = "override: given as --weights-per-rank, not counted from the model's config"


def override_gib(weights_bytes: int) -> float:
    """A labelled override of one rank's weights, in GiB: more than 0 (a rank holds weights)."""
    if weights_bytes <= 0:
        raise UserError(f"{weights_bytes} B: one rank holds weights; give its size, e.g. 40GiB",
                        field="weights_per_rank")
    return weights_bytes / 1024**3


def config_name(path: str | Path) -> str:
    """A config's display name: its folder's (`GLM-5/` or `GLM-5/config.json`), else the file's
    stem (the shipped `glm-5.json`)."""
    path = Path(path).resolve()
    if path.is_dir() or path.name == "config.json":
        return (path if path.is_dir() else path.parent).name
    return path.stem


def model_table(config: ModelConfig, name: str) -> dict:
    """The scenario's [model] table from a config: the attention's dimensions by their names."""
    label = config.quantization.label if config.quantization else None
    says = label and re.search(rf"(?<![a-z0-9]){re.escape(label)}(?![a-z0-9])", name, re.I)
    return {"name": name + (f" {label}" if label and not says else ""),  # not GLM-5-FP8 FP8
            "num_attention_heads": config.num_attention_heads,
            "num_layers": config.num_hidden_layers, "kv_lora_rank": config.kv_lora_rank,
            "qk_rope_head_dim": config.qk_rope_head_dim,
            "qk_nope_head_dim": config.qk_nope_head_dim, "v_head_dim": config.v_head_dim,
            **({"index_topk": config.index_topk} if config.has_indexer else {}),
            "hidden_size": config.hidden_size, **beyond_attention(config)}


def beyond_attention(config: ModelConfig) -> dict:
    """The [model] fields of what a rank allocates beyond attention (spec/engines/rank_buffers.py),
    by their config.json names: the MLP and MoE widths, the vocabulary, the indexer, MTP."""
    names = ["vocab_size", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
             "n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers", "q_lora_rank"]
    names += ["num_experts_per_tok"] if config.num_experts_per_tok else []
    names += ["index_n_heads", "index_head_dim"] if config.has_indexer else []
    names += [name for name in ("index_topk_freq", "index_skip_topk_offset")
              if config.has_indexer and getattr(config, name) is not None]
    table = {name: getattr(config, name) for name in names}
    table |= {"architecture": config.architecture} if config.architecture else {}
    return table | ({"quantization": config.quantization.scheme} if config.quantization else {})


# model_table's keys whose config.json field has another name
CONFIG_NAMES = {"num_layers": "num_hidden_layers"}
_MODEL_FIELD = re.compile(r"\[model\]\.(\w+)|\bmodel\.(\w+)")


def scenario_from_config(data: dict, source: str) -> Scenario:
    """`scenario.from_dict(data, source)` for data whose [model] is a config.json's
    (model_table): a rule the config breaks is one line in the config's own field names, with
    no scenario file's name the user never wrote."""
    from mlamem.spec import scenario as _scenario

    try:
        return _scenario.from_dict(data, source)
    except UserError as error:
        text = error.message.removeprefix(f"{source}: ").removesuffix("; fix that field")
        if not _MODEL_FIELD.search(text):
            raise
        named = _MODEL_FIELD.sub(lambda m: CONFIG_NAMES.get(m[1] or m[2], m[1] or m[2]), text)
        raise UserError(f"the model's {named}", field="model") from None


def counted_weights(config: ModelConfig, *, tp: int, dp: int, mtp: bool, shared_head: bool = False,
                    engine: str | None = None, every_indexer: bool = False,
                    source: str = "the model's config") -> tuple[float, str]:
    """One rank's weights in GiB (to the byte) at `tp` ranks with attention-DP `dp`, and the note
    saying they are counted from `source` (`mtp`, `shared_head`, `engine`, `every_indexer`:
    weights_per_rank's)."""
    gib = weights_per_rank(config, tp=tp, dp=dp, mtp=mtp, shared_head=shared_head, engine=engine,
                           every_indexer=every_indexer) / 1024**3
    extra_indexers = every_indexer and any(
        config.has_indexer and not config.layer_has_indexer(i) for i in range(config.num_hidden_layers))
    own_head = shared_head and config.mtp_embeddings
    copies = count_weights(config).up_projection_copies(tp=tp // dp, engine=engine)
    return gib, (f"counted from {source}: {gib:.3f} GiB per rank"
                 + (f", with {engine}'s bf16 {UP_PROJECTION_COPIES[engine]} (kv_b_proj) as it loads"
                    if copies else "")
                 + (", MTP layers included (speculative decoding)" if mtp else "")
                 + (", their own embedding and head the target's" if mtp and own_head else "")
                 + (f", with the indexers {engine} builds on the layers that share another's "
                    "top-k too" if extra_indexers else "")
                 + (", the vision tower not counted" if config.vision else ""))


def indexers_on_every_layer(engine: str, version: str | None) -> bool:
    """Whether `engine` at `version` (None: its default) builds a DSA indexer on every layer of
    an IndexCache model, the layers that share another's top-k included: vLLM before 0.24.0
    (vllm.INDEXER_ON_OWN_LAYERS_FROM), SGLang before 0.5.18 (sglang.INDEXER_ON_OWN_LAYERS_FROM)."""
    from mlamem.spec.engines import sglang, vllm  # they import spec.models: a cycle

    if engine == "vllm":
        return vllm.version_rules(version).indexers_on_every_layer
    if engine == "sglang":
        return not sglang.sglang_rules(version).indexer_on_own_layers
    return False


def loaded_weights(scenario: Scenario) -> dict[str, bool | str | None]:
    """counted_weights' `mtp`, `shared_head` and `engine` for the scenario's engines: the MTP layers
    load where vLLM's [vllm] table asks for speculative tokens or SGLang's [sglang] table for draft
    tokens; the drafter holds the target's embedding and head, not the layers' own (SGLang's,
    and vLLM's from 0.18.0: spec.engines.vllm MTP_SHARES_HEAD_FROM); the first engine's copies of
    the up-projection, and its indexers on every layer where its version builds them there."""
    from mlamem.spec.engines.vllm import version_rules  # it imports spec.models: a cycle

    table = scenario.sections.get("vllm")
    vllm = getattr(table, "num_speculative_tokens", 0) > 0
    sglang = getattr(scenario.sections.get("sglang"), "speculative_num_draft_tokens", None) is not None
    vllm_shares = vllm and version_rules(getattr(table, "engine_version", None)).mtp_shares_head
    engine = scenario.engines[0]
    version = getattr(scenario.sections.get(engine), "engine_version", None)
    return {"mtp": vllm or sglang, "shared_head": (sglang and not vllm) or vllm_shares,
            "engine": engine, "every_indexer": indexers_on_every_layer(engine, version)}


def apply(scenario: Scenario, *, model: str | None = None, gpu: str | None = None,
          weights_bytes: int | None = None) -> Scenario:
    """`scenario` with [model] from the config.json at `model` (a file or its folder) and the
    weights counted from it at the scenario's layout, retargeted to the GPU named `gpu`, and
    with `weights_bytes` per rank as a labelled override; each None keeps the scenario's own."""
    from mlamem.spec import scenario as _scenario  # pydantic: loaded where a scenario is

    if model is None and weights_bytes is None:
        return gpus.retarget(scenario, gpu)
    data = _scenario.to_dict(scenario)
    parallel = data["parallel"]
    if model is not None:
        config = load_config(model)
        data["model"] = model_table(config, config_name(model))
        if weights_bytes is None:
            parallel["weights_gib_per_rank"], parallel["weights_note"] = counted_weights(
                config, tp=parallel["tensor_parallel"], dp=parallel["attention_data_parallel"],
                **loaded_weights(scenario), source=str(model))
    if weights_bytes is not None:
        parallel["weights_gib_per_rank"] = override_gib(weights_bytes)
        parallel["weights_note"] = OVERRIDE_NOTE
    build = _scenario.from_dict if model is None else scenario_from_config
    return gpus.retarget(build(data, scenario.source or scenario.name), gpu)


def weights_fit_line(scenario: Scenario, gpu_bytes: int | None = None) -> str | None:
    """None when one rank's weights (the scenario's, counted or given) fit its GPU, or
    `gpu_bytes` of an emulated one; else the one line that says they do not."""
    p = scenario.parallel
    gpu = scenario.gpu.name if gpu_bytes is None else "emulated GPU"
    return fit_line(scenario.model.name, p.weights_bytes, tp=p.tensor_parallel,
                    dp=p.attention_data_parallel, gpu=gpu,
                    gpu_bytes=scenario.gpu.memory_bytes if gpu_bytes is None else gpu_bytes)
