"""The `b12x` quantization config: ModelOpt checkpoints (mixed precision or single format) run by b12x_core."""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from b12x_formats import FORMATS, modelopt, spec

from .backends import b12x_requested

logger = logging.getLogger("b12x_vllm")
# raw GGML block formats (nothing else in vLLM runs them here), from the format specs
GGML_CODECS = tuple(f for f in FORMATS if spec(f).packing == "ggml")


@register_quantization_config("b12x")
class B12xConfig(QuantizationConfig):
    def __init__(self, quant: modelopt.QuantizationConfig):
        super().__init__()
        self.quant = quant

    def __repr__(self) -> str:
        kind = "mixed precision" if self.quant.is_mixed else self.quant.default
        return f"B12xConfig({kind}: {sorted(self.quant.formats)})"

    def get_name(self) -> str:
        return "b12x"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 90  # Hopper and consumer Blackwell (SM120/121); the CPU runs the exact reference

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> B12xConfig:
        return cls(modelopt.parse_quantization_config(config))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        """ "b12x" for the checkpoints `claims` gives b12x."""
        return "b12x" if claims(hf_quant_cfg, user_quant, b12x_requested()) else None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        from vllm.model_executor.layers.fused_moe import RoutedExperts
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        from .linear import B12xEmbeddingMethod, B12xLinearMethod
        from .moe import B12xMoEMethod
        from .tied import B12xLMHeadMethod

        if isinstance(layer, (LinearBase, ParallelLMHead)):
            fmt = self.quant.format_for(prefix)
            if fmt is None and isinstance(layer, ParallelLMHead):
                return B12xLMHeadMethod()  # vLLM's own unless tied to a b12x embedding (tied.py)
            return UnquantizedLinearMethod() if fmt is None else B12xLinearMethod(fmt, prefix)
        if isinstance(layer, VocabParallelEmbedding):
            prefix = prefix or self._embedding_prefix()
            fmt = self.quant.format_for(prefix)
            if fmt is None:
                return None
            if fmt != "Q8_0":
                raise ValueError(f"b12x: embedding {prefix or 'embed_tokens'} is {fmt}; b12x embeddings are Q8_0")
            return B12xEmbeddingMethod(prefix)
        if isinstance(layer, RoutedExperts):
            config = layer.moe_config
            formats = self.quant.moe_formats(prefix, config.num_logical_experts)
            if formats["w13"] is None and formats["w2"] is None:
                return None
            if None in formats.values() or formats["w13"] != formats["w2"]:
                raise ValueError(f"b12x: MoE {prefix} needs one format for w13 and w2, got {formats}")
            return B12xMoEMethod(formats["w13"], config, prefix)
        return None

    def _embedding_prefix(self) -> str:
        """Some models (Llama) build their embedding without a prefix: use the checkpoint's embed_tokens."""
        names = [p for p in self.quant.layers if p.rsplit(".", 1)[-1] == "embed_tokens"]
        return names[0] if len(names) == 1 else ""

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.quant.layers:
            self.quant.layers = hf_to_vllm_mapper.apply_dict(self.quant.layers)


def claims(hf_quant_cfg, user_quant: str | None, requested: bool) -> bool:
    """Whether b12x runs this checkpoint: ModelOpt checkpoints that hold GGML block codecs (nothing else in vLLM
    runs them here) and, when the user asked for b12x (`requested`: --linear-backend / --moe-backend b12x, or
    --quantization b12x), every ModelOpt checkpoint. A checkpoint meant for b12x whose config does not parse raises
    the ValueError that says what is wrong with it."""
    if user_quant == "b12x":
        return True
    if not isinstance(hf_quant_cfg, dict) or str(hf_quant_cfg.get("quant_method", "")).lower() != "modelopt":
        return False
    try:
        parsed = modelopt.parse_quantization_config(hf_quant_cfg)
    except ValueError:
        if requested or _mentions_ggml(hf_quant_cfg):
            raise
        return False
    return bool(parsed.formats & set(GGML_CODECS)) or requested


def _mentions_ggml(cfg: dict) -> bool:
    body = cfg.get("quantization", cfg)
    layers = body.get("quantized_layers") or {}
    return any(isinstance(e, dict) and e.get("packing") == "ggml" for e in layers.values())
