"""A Hugging Face config.json read by its field names, for the model types of the shipped families."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from mlamem.spec.errors import UserError
from mlamem.spec.files import check_name_length, loads_json, read_text
from mlamem.spec.models.quantization import Quantization, parse_quantization


@dataclass(frozen=True)
class ModelType:
    indexer: bool  # its layers carry the DSA indexer
    mtp_embeddings: bool  # each MTP layer stores its own embedding and head (GLM's share the main model's)


# Kimi-K2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM) under its own model_type.
MODEL_TYPES = {"deepseek_v32": ModelType(indexer=True, mtp_embeddings=True),
               "glm_moe_dsa": ModelType(indexer=True, mtp_embeddings=False),
               "kimi_k2": ModelType(indexer=False, mtp_embeddings=True),
               "deepseek_v3": ModelType(indexer=False, mtp_embeddings=True)}
# a multimodal model_type whose language model is one of MODEL_TYPES under a key: vLLM 0.33.0 builds
# Kimi-K2.5's DeepseekV3 language model from config.text_config (model_executor/models/kimi_k25.py,
# KimiK25ForConditionalGeneration.__init__); its vision tower is not counted
WRAPPERS = {"kimi_k25": "text_config"}
SHIPPED = {name: f"{name}.json" for name in (
    "deepseek-v3.2", "glm-5", "kimi-k2", "deepseek-v3", "deepseek-r1", "deepseek-v3.1", "deepseek-v3.2-exp",
    "glm-5.1", "glm-5.2", "kimi-k2-thinking", "kimi-k2.5")}
# the Hugging Face Hub names of the checkpoints each shipped config describes (the same dimensions and
# the same quantization); `vllm serve HUBNAME` reads the shipped config (serve_command)
HUB_NAMES = {"deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2", "zai-org/GLM-5-FP8": "glm-5",
             "zai-org/GLM-5": "glm-5", "moonshotai/Kimi-K2-Instruct": "kimi-k2",
             "moonshotai/Kimi-K2-Instruct-0905": "kimi-k2", "moonshotai/Kimi-K2-Base": "kimi-k2",
             "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
             "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3", "deepseek-ai/DeepSeek-R1": "deepseek-r1",
             "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1", "deepseek-ai/DeepSeek-V3.1": "deepseek-v3.1",
             "deepseek-ai/DeepSeek-V3.1-Terminus": "deepseek-v3.1",
             "deepseek-ai/DeepSeek-V3.2-Exp": "deepseek-v3.2-exp", "zai-org/GLM-5.1-FP8": "glm-5.1",
             "moonshotai/Kimi-K2-Thinking": "kimi-k2-thinking", "moonshotai/Kimi-K2.5": "kimi-k2.5",
             "zai-org/GLM-5.1": "glm-5.1", "zai-org/GLM-5.2-FP8": "glm-5.2", "zai-org/GLM-5.2": "glm-5.2"}
# the bf16 checkpoints among them: the FP8 config's fields without its quantization_config (zai-org
# publishes GLM's bf16 weights under the plain name, the FP8 ones under -FP8; NVIDIA's NeMo pages
# train from zai-org/GLM-5 and zai-org/GLM-5.1)
BF16_HUB_NAMES = ("zai-org/GLM-5", "zai-org/GLM-5.1", "zai-org/GLM-5.2")

_INTS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
         "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
         "v_head_dim", "n_routed_experts", "n_shared_experts", "first_k_dense_replace")
_INDEXER = ("index_topk", "index_n_heads", "index_head_dim")
# every key vLLM 0.33.0 or SGLang 0.5.23 reads a model's context length from
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
               "model_max_length", "max_target_positions", "max_sequence_length", "max_seq_length",
               "seq_len")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    first_k_dense_replace: int
    moe_layer_freq: int = 1
    num_nextn_predict_layers: int = 0
    num_experts_per_tok: int = 0  # the router's top-k; 0 where the config does not say
    architecture: str | None = None  # architectures[0], the class the engines pick rules by
    tie_word_embeddings: bool = False
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    quantization: Quantization | None = None  # how the checkpoint stores its Linear weights; None: bf16
    # GLM's indexer_types: per decoder layer, whether it holds its own indexer ("full") or reuses the one
    # before it ("shared", no indexer tensors); None: every layer holds one
    indexer_layers: tuple[bool, ...] | None = None
    # IndexCache (GLM-5.2): 1 of every index_topk_freq layers after index_skip_topk_offset computes
    # its own top-k; None where the config does not set them (the engines' defaults)
    index_topk_freq: int | None = None
    index_skip_topk_offset: int | None = None
    # the context-length keys the config sets (max_position_embeddings, ...), in LENGTH_KEYS'
    # order: the engines derive their default context from them
    length_fields: tuple[tuple[str, int], ...] = ()
    rope_type: str | None = None  # rope_scaling's (or rope_parameters') rope_type, or type
    rope_factor: float | None = None  # its factor
    rope_original_length: int | None = None  # its original_max_position_embeddings
    vision: bool = False  # a multimodal model's (WRAPPERS): its vision tower holds weights not counted

    @property
    def fp8_block(self) -> tuple[int, int] | None:
        """Block fp8's (rows, cols) per fp32 weight_scale_inv, else None."""
        quantization = self.quantization
        return quantization.block if quantization and quantization.scheme == "fp8-block" else None

    def length_field(self, name: str) -> int | None:
        return dict(self.length_fields).get(name)

    @property
    def has_indexer(self) -> bool:
        return self.index_n_heads > 0

    @property
    def mtp_embeddings(self) -> bool:
        return MODEL_TYPES[self.model_type].mtp_embeddings

    def layer_has_indexer(self, i: int) -> bool:
        """Layer i's own indexer; MTP layers (past the pattern) hold one whenever the model has an indexer."""
        if not self.has_indexer:
            return False
        return self.indexer_layers is None or i >= len(self.indexer_layers) or self.indexer_layers[i]


# the largest value a config's count may take: the layer and expert counts bound the tensors the
# count enumerates, the rest fit the int32 an engine keeps them in
_LARGEST = {"num_hidden_layers": 4096, "n_routed_experts": 65536, "num_nextn_predict_layers": 64,
            "num_experts_per_tok": 65536, "index_topk_freq": 4096, "index_skip_topk_offset": 4096}
# the counts a model may set to 0: no shared experts, no dense layers first, no MTP layers; every
# other size or count is at least 1 (a 0 would divide by zero or make an empty tensor)
_ZERO_ALLOWED = ("n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers",
                 "index_skip_topk_offset")
_INT32 = (1 << 31) - 1


def bad(name: str, text: str) -> UserError:
    """A config.json field's error: the field by its own name, first (`config.json: NAME ...`)."""
    return UserError(f"{name} {text}", field=f"config.{name}")


def _int(raw: dict, name: str) -> int:
    if raw.get(name) is None:
        raise bad(name, "is missing")
    value = raw[name]
    least, largest = (0 if name in _ZERO_ALLOWED else 1), _LARGEST.get(name, _INT32)
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= largest:
        raise bad(name, f"needs an integer in {least}..{largest}, got {value!r}")
    return value


def parse_config(raw: dict) -> ModelConfig:
    """The fields mlamem reads; an unknown model_type or a missing field is one error naming it."""
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in WRAPPERS:
        return _language_model(raw, WRAPPERS[model_type])
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise bad("model_type", f"{model_type!r} is not known; known: {', '.join([*MODEL_TYPES, *WRAPPERS])}")
    fields = {name: _int(raw, name) for name in _INTS}
    if MODEL_TYPES[model_type].indexer:
        fields |= {name: _int(raw, name) for name in _INDEXER}
        fields["indexer_layers"] = _indexer_layers(raw.get("indexer_types"), fields["num_hidden_layers"])
        for name in ("index_topk_freq", "index_skip_topk_offset"):
            if raw.get(name) is not None:
                fields[name] = _int(raw, name)
    for name in ("moe_layer_freq", "num_nextn_predict_layers", "num_experts_per_tok"):
        if name in raw:
            fields[name] = _int(raw, name)
    tied = raw.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise bad("tie_word_embeddings", f"needs true or false, got {tied!r}")
    fields["architecture"] = _architecture(raw.get("architectures"))
    fields["length_fields"] = tuple((name, _positive(raw, name)) for name in LENGTH_KEYS
                                    if raw.get(name) is not None)
    return ModelConfig(model_type=model_type, tie_word_embeddings=tied,
                       quantization=parse_quantization(raw.get("quantization_config")), **fields,
                       **_rope(raw))


def _architecture(value: object) -> str | None:
    """architectures[0] where it is a class name, else None (engines then take their defaults)."""
    first = value[0] if isinstance(value, list) and value else None
    return first if isinstance(first, str) and re.fullmatch(r"[A-Za-z_]\w{0,99}", first) else None


def _language_model(raw: dict, key: str) -> ModelConfig:
    """A multimodal config's language model, from `key` (its quantization_config the top level's
    where the language model's has none); an error names the field under `key`."""
    text = raw.get(key)
    if not isinstance(text, dict) or text.get("model_type") in WRAPPERS:
        raise bad(key, f"needs the language model's config as a JSON object, got {text!r}")
    if text.get("quantization_config") is None and raw.get("quantization_config") is not None:
        text = {**text, "quantization_config": raw["quantization_config"]}
    try:
        return replace(parse_config(text), vision=True)
    except UserError as error:
        name = (error.field or "config.").removeprefix("config.")
        raise UserError(f"{key}.{error.message}", field=f"config.{key}.{name}") from None


def _positive(raw: dict, name: str, table: str = "") -> int:
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _INT32:
        raise bad(table + name, f"needs an integer in 1..{_INT32}, got {value!r}")
    return value


def _rope(raw: dict) -> dict:
    """rope_scaling (transformers 4) or rope_parameters (5): its type, factor and original
    length, which scale the context the engines derive."""
    name = "rope_scaling" if raw.get("rope_scaling") is not None else "rope_parameters"
    rope = raw.get(name)
    if rope is None:
        return {}
    if not isinstance(rope, dict):
        raise bad(name, f"needs a JSON object or null, got {rope!r}")
    kind = rope.get("rope_type", rope.get("type"))
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if kind is not None and not isinstance(kind, str):
        raise bad(f"{name}.rope_type", f"needs a string, got {kind!r}")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)
                               or not 0 < factor < 1e6):
        raise bad(f"{name}.factor", f"needs a number in (0, 1e6), got {factor!r}")
    if original is not None:
        _positive(rope, "original_max_position_embeddings", f"{name}.")
    return {"rope_type": kind, "rope_factor": None if factor is None else float(factor),
            "rope_original_length": original}


def _indexer_layers(types: object, layers: int) -> tuple[bool, ...] | None:
    if types is None:
        return None
    if not (isinstance(types, list) and len(types) == layers and set(types) <= {"full", "shared"}):
        raise bad("indexer_types", f"needs one of 'full' or 'shared' per decoder layer ({layers}), "
                  f"got {types!r}")
    return tuple(kind == "full" for kind in types)


def load_config(path: str | Path) -> ModelConfig:
    """config.json, or a folder holding one."""
    path = Path(path)
    check_name_length(path, "model")
    if path.is_dir():
        path = path / "config.json"
    text = read_text(path, "model config (a Hugging Face config.json)", field="model")
    try:
        raw = loads_json(text)
    except ValueError as error:  # a decode error, NaN/Infinity or nesting too deep
        raise UserError(f"{path}: not a config.json ({error})", field="model") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config.json holds one JSON object, not a "
                        f"{type(raw).__name__}", field="model")
    return parse_config(raw)


def hub_config(hub: str) -> ModelConfig:
    """The shipped config of a hub name of HUB_NAMES, in bf16 for a bf16 checkpoint's."""
    config = shipped_config(HUB_NAMES[hub])
    return replace(config, quantization=None) if hub in BF16_HUB_NAMES else config


def shipped_config(name: str) -> ModelConfig:
    if name not in SHIPPED:
        raise UserError(f"unknown shipped model {name!r}; known: {', '.join(SHIPPED)}", field="model")
    return parse_config(json.loads(resources.files("mlamem.spec.models").joinpath(SHIPPED[name]).read_text()))
