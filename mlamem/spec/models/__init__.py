"""Models from their Hugging Face config.json: the fields mlamem reads, and the weights they make."""

from mlamem.spec.models.hf_config import SHIPPED, ModelConfig, load_config, shipped_config
from mlamem.spec.models.weights import Tensor, WeightCount, count_weights, weights_fit, weights_per_rank

__all__ = [
    "SHIPPED", "ModelConfig", "Tensor", "WeightCount", "count_weights", "load_config", "shipped_config",
    "weights_fit", "weights_per_rank",
]
