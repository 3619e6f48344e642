"""The parameters and bytes of a model's checkpoint, tensor by tensor, from its config."""

from __future__ import annotations

from dataclasses import dataclass

from mlamem.spec.errors import UserError
from mlamem.spec.models.hf_config import ModelConfig
from mlamem.spec.models.quantization import Quantization
from mlamem.spec.units import gib


@dataclass(frozen=True)
class Tensor:
    name: str
    rows: int
    cols: int = 1
    quantized: bool = False  # a Linear weight, which the checkpoint's quantization may store; bf16 otherwise
    mtp: bool = False  # an MTP layer's: in the checkpoint, loaded only with speculative decoding
    fp32: bool = False
    copies: int = 1  # the checkpoint tensors it counts together (the routed experts, rows // copies each)

    @property
    def params(self) -> int:
        return self.rows * self.cols


# How vLLM 0.33.0 places each tensor (vllm/model_executor/models/deepseek_v2.py): these are ReplicatedLinear,
# norms or the router, whole on every rank; the routed experts split across the expert group; the rest
# (vocab, q_b/kv_b/o projections, dense and shared MLPs) shard by tensor parallelism.
_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "indexer.", "mlp.gate", "mlp.e_score_correction_bias",
               "eh_proj")


# the attention's tensors, under `self_attn.` in the checkpoint's names
_ATTENTION = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
              "o_proj", "indexer.")


def hf_module(tensor: Tensor) -> str:
    """The checkpoint's module name of `tensor` (modeling_deepseek.py's, which vLLM's prefixes follow):
    `model.layers.3.self_attn.q_a_proj`, `model.layers.3.mlp.experts.0.gate_proj` (every expert alike),
    `lm_head`; what a quantization_config's ignore list matches."""
    if tensor.name == "lm_head":
        return "lm_head"
    if not tensor.name.startswith("layers."):
        return "model." + tensor.name
    _, layer, rest = tensor.name.split(".", 2)
    if rest.startswith(_ATTENTION):
        rest = "self_attn." + rest
    return f"model.layers.{layer}." + rest.replace("mlp.experts.", "mlp.experts.0.")


def _expert(tensor: Tensor) -> bool:
    return ".mlp.experts." in tensor.name


def placement(tensor: Tensor) -> str:
    if _expert(tensor):
        return "experts"
    last = tensor.name.split(".", 2)[-1] if tensor.name.startswith("layers.") else tensor.name
    replicated = tensor.cols == 1 or last in _REPLICATED or last.startswith("indexer.")
    return "replicated" if replicated else "tp"


@dataclass(frozen=True)
class WeightCount:
    tensors: tuple[Tensor, ...]
    quantization: Quantization | None

    @property
    def fp8_block(self) -> tuple[int, int] | None:
        q = self.quantization
        return q.block if q and q.scheme == "fp8-block" else None

    def stored_quantized(self, tensor: Tensor) -> bool:
        """Whether the checkpoint stores `tensor` quantized: a Linear weight its quantization covers."""
        return bool(tensor.quantized and self.quantization and self.quantization.quantizes(hf_module(tensor)))

    def params(self, *, mtp: bool = False) -> int:
        return sum(t.params for t in self.tensors if t.mtp == mtp)

    def bytes(self, *, mtp: bool = False) -> int:
        return sum(self._bytes(t) for t in self.tensors if t.mtp == mtp)

    def bytes_per_rank(self, *, tp: int, expert_ranks: int, mtp: bool = False,
                       shared_head: bool = False) -> int:
        """One rank's share: `tp` ranks shard attention's and the MLPs' projections (each data-parallel
        attention group holds its own copy), `expert_ranks` (tp x dp under expert or data parallelism)
        split the routed experts; `shared_head`: the MTP layers' own embedding and head left out (the
        drafter uses the target's)."""
        split = {"replicated": 1, "tp": tp, "experts": expert_ranks}
        return sum(-(-self._bytes(t) // split[placement(t)]) for t in self.tensors
                   if t.mtp == mtp and not (shared_head and mtp_own_head(t)))

    def up_projection_copies(self, *, tp: int, engine: str | None, mtp: bool = False) -> int:
        """One rank's bf16 copies of the MLA up-projection (kv_b_proj) the engine multiplies in the
        absorbed decode, held beside the checkpoint's tensor (UP_PROJECTION_COPIES); `tp`: the ranks
        sharding attention."""
        if engine not in UP_PROJECTION_COPIES:
            return 0
        return sum(2 * -(-t.params // tp) for t in self.tensors
                   if t.mtp == mtp and t.name.endswith(".kv_b_proj")
                   and (engine == "sglang" or self.stored_quantized(t)))

    def elements(self, *, mtp: bool = False) -> int:
        """Every stored tensor's elements, what the Hub's parameter count adds up: a quantized weight's
        packed words, scales and zero points (Quantization.weight_elements), the rest's parameters."""
        return sum(self.quantization.weight_elements(t.rows, t.cols, t.copies, expert=_expert(t))
                   if self.stored_quantized(t) else t.params for t in self.tensors if t.mtp == mtp)

    def scales(self, *, mtp: bool = False) -> int:
        """The fp32 weight_scale_inv entries, one per fp8 block (Hugging Face counts them as parameters)."""
        return sum(self._scales(t) for t in self.tensors if t.mtp == mtp)

    def _scales(self, tensor: Tensor) -> int:
        if not (self.fp8_block and self.stored_quantized(tensor)):
            return 0
        return self.quantization.block_scales(tensor.rows, tensor.cols)

    def _bytes(self, tensor: Tensor) -> int:
        if not self.stored_quantized(tensor):
            return (4 if tensor.fp32 else 2) * tensor.params
        return self.quantization.weight_bytes(tensor.rows, tensor.cols, tensor.copies, expert=_expert(tensor))


# The absorbed MLA decode multiplies q and the output by kv_b_proj split per head, in bf16, kept beside
# the checkpoint's kv_b_proj (which stays loaded), one copy of kv_b_proj's shape per attention layer:
# - vLLM (0.10.2-0.33.0 MLA process_weights_after_loading: v1/attention/backends/mla/common.py to 0.17,
#   model_executor/layers/attention/mla_attention.py from 0.18, "we just store fp16/bf16 copies"): W_UK_T
#   and W_UV, views of kv_b_proj dequantized (quant_utils.py get_and_maybe_dequant_weights), a new tensor
#   only where the checkpoint stores kv_b_proj quantized (an unquantized weight comes back as is);
# - SGLang (0.5.23 models/deepseek_common/deepseek_weight_loader.py post_load_weights): w_kc and w_vc,
#   each made contiguous, so copied whether kv_b_proj is stored quantized (dequantized to bf16 on CUDA
#   for 128 x 128 blocks, SGLANG_USE_DEEPGEMM_BMM off by default) or not.
UP_PROJECTION_COPIES = {"vllm": "W_UK_T and W_UV", "sglang": "w_kc and w_vc"}

# an MTP layer's own embedding and head (DeepSeek's; GLM's MTP layer has none)
MTP_HEAD = ("embed_tokens", "shared_head.head")


def mtp_own_head(tensor: Tensor) -> bool:
    """Whether `tensor` is an MTP layer's own embedding or head."""
    return tensor.mtp and tensor.name.split(".", 2)[-1] in MTP_HEAD


def _layer(config: ModelConfig, i: int, mtp: bool, every_indexer: bool = False) -> list[Tensor]:
    c, h = config, config.hidden_size
    p = f"layers.{i}."
    heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim

    def t(name: str, rows: int, cols: int = 1, quantized: bool = True, fp32: bool = False,
          copies: int = 1) -> Tensor:
        return Tensor(p + name, rows, cols, quantized and cols > 1, mtp, fp32, copies)

    tensors = [t("input_layernorm", h), t("post_attention_layernorm", h),
               t("q_a_proj", c.q_lora_rank, h), t("q_a_layernorm", c.q_lora_rank),
               t("q_b_proj", heads * qk, c.q_lora_rank),
               t("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h),
               t("kv_a_layernorm", c.kv_lora_rank),
               t("kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
               t("o_proj", h, heads * c.v_head_dim)]
    if c.layer_has_indexer(i) or (every_indexer and c.has_indexer):
        tensors += [t("indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank),
                    t("indexer.wk", c.index_head_dim, h), t("indexer.k_norm", 2 * c.index_head_dim),
                    t("indexer.weights_proj", c.index_n_heads, h, quantized=False)]
    moe = i >= c.first_k_dense_replace and i % c.moe_layer_freq == 0
    if not moe:
        dense = c.intermediate_size
        return tensors + [t("mlp.gate_proj", dense, h), t("mlp.up_proj", dense, h),
                          t("mlp.down_proj", h, dense)]
    inner = c.moe_intermediate_size
    tensors += [t("mlp.gate", c.n_routed_experts, h, quantized=False),
                t("mlp.e_score_correction_bias", c.n_routed_experts, fp32=True)]
    experts = c.n_routed_experts
    tensors += [t(f"mlp.experts.{n}", experts * inner, h, copies=experts) for n in ("gate_proj", "up_proj")]
    tensors += [t("mlp.experts.down_proj", experts * h, inner, copies=experts)]
    shared = c.n_shared_experts * inner
    return tensors + [t(f"mlp.shared_experts.{n}", shared, h) for n in ("gate_proj", "up_proj")] + [
        t("mlp.shared_experts.down_proj", h, shared)]


def count_weights(config: ModelConfig, *, every_indexer: bool = False) -> WeightCount:
    """Every tensor of the checkpoint, the MTP layers' marked apart; `every_indexer`: with an
    indexer on every layer of an IndexCache model, as engines that build one on its shared layers
    too hold them (never filled: the checkpoint has none there), at the size of the others.

    Experts are grouped per layer (rows = experts x rows): the fp8 blocks tile each expert alike, as every
    expert dimension is a multiple of the block.
    """
    h, v = config.hidden_size, config.vocab_size
    tensors = [Tensor("embed_tokens", v, h), Tensor("norm", h)]
    if not config.tie_word_embeddings:
        tensors.append(Tensor("lm_head", v, h))
    tensors += [t for i in range(config.num_hidden_layers)
                for t in _layer(config, i, mtp=False, every_indexer=every_indexer)]
    for k in range(config.num_nextn_predict_layers):
        i = config.num_hidden_layers + k
        tensors += _layer(config, i, mtp=True)
        # an MTP layer stores its projection and norms; DeepSeek's (not GLM's) its own embedding and head too
        own = (("embed_tokens", v, h), ("shared_head.head", v, h)) if config.mtp_embeddings else ()
        tensors += [Tensor(f"layers.{i}.{name}", rows, cols, False, True) for name, rows, cols in (
            *own, ("eh_proj", h, 2 * h), ("enorm", h, 1), ("hnorm", h, 1), ("shared_head.norm", h, 1))]
    return WeightCount(tuple(tensors), config.quantization)


def weights_per_rank(config: ModelConfig, *, tp: int, dp: int = 1, mtp: bool = False,
                     shared_head: bool = False, engine: str | None = None,
                     every_indexer: bool = False) -> int:
    """One rank's bytes under a scenario's layout: `tp` ranks in all, attention data-parallel over `dp` groups
    of tp // dp ranks (vLLM's DP ranks, each with its own TP), the routed experts split over all `tp` ranks
    (vLLM flattens TP across DP for the MoE: FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp); the MTP
    layers' share added when speculative decoding loads them, without their own embedding and head
    where the drafter frees them for the target's (`shared_head`: SGLang 0.5.23's EAGLE worker,
    speculative/eagle_worker_v2.py, set_embed_and_head, which models/deepseek_v2.py
    DeepseekV2ForCausalLM.set_embed_and_head frees with torch.cuda.empty_cache before the KV pool is
    sized); with `engine`'s bf16 copies of the MLA up-projection (WeightCount.up_projection_copies);
    `every_indexer`: count_weights'."""
    if tp < 1:
        raise UserError(f"needs a positive rank count, got {tp}", field="tensor_parallel")
    if dp < 1 or tp % dp:
        raise UserError(f"needs a divisor of tensor_parallel {tp}, got {dp}", field="attention_data_parallel")
    weights = count_weights(config, every_indexer=every_indexer)
    layout = {"tp": tp // dp, "expert_ranks": tp}
    copies = weights.up_projection_copies(tp=tp // dp, engine=engine)
    if mtp:
        copies += weights.up_projection_copies(tp=tp // dp, engine=engine, mtp=True)
    drafter = weights.bytes_per_rank(**layout, mtp=True, shared_head=shared_head) if mtp else 0
    return weights.bytes_per_rank(**layout) + drafter + copies


def weights_fit(model: str, config: ModelConfig, *, tp: int, dp: int = 1, gpu: str, gpu_bytes: int,
                mtp: bool = False, shared_head: bool = False, engine: str | None = None,
                every_indexer: bool = False) -> str | None:
    """None when one rank's weights fit in `gpu_bytes`; else the one line that says they do not."""
    per_rank = weights_per_rank(config, tp=tp, dp=dp, mtp=mtp, shared_head=shared_head, engine=engine,
                                every_indexer=every_indexer)
    return fit_line(model, per_rank, tp=tp, dp=dp, gpu=gpu, gpu_bytes=gpu_bytes, mtp=mtp)


def fit_line(model: str, per_rank: int, *, tp: int, dp: int = 1, gpu: str, gpu_bytes: int,
             mtp: bool = False) -> str | None:
    """None when `per_rank` bytes (counted or given) fit in `gpu_bytes`; else the one line that says
    they do not."""
    if per_rank <= gpu_bytes:
        return None
    layout = f"TP{tp}" + (f" with attention-DP {dp}" if dp > 1 else "")
    layout += " with its MTP layers" if mtp else ""
    return (f"{model}'s weights are {gib(per_rank):.1f} GiB per rank at {layout}, more than the {gpu}'s "
            f"{gib(gpu_bytes):.1f} GiB")
