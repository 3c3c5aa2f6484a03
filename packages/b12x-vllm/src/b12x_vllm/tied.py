"""LM heads tied to a b12x embedding (Llama-3.2 1B/3B, Qwen2.5 ≤ 3B, Gemma, SmolLM, ...).

vLLM ties a head by calling its quantization method's `tie_weights(head, embed_tokens)`, which by default makes
the head's `weight` the embedding's parameter. For a b12x embedding that parameter holds GGML blocks, which
vLLM's float head cannot multiply; so a head the checkpoint leaves unquantized gets `B12xLMHeadMethod`: vLLM's
own method while untied, and once tied to a b12x embedding a b12x linear over the embedding's prepared bytes
(`bc.prepare_tied_linear`: no second copy). The embedding prepares that linear (B12xEmbeddingMethod), so it
exists whichever of the two layers vLLM processes first, and a weight reload refreshes both at once. Models
that call the embedding itself as their head (Gemma) reach the same prepared linear through
`B12xEmbeddingMethod.apply`.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod

import b12x_core as bc


class B12xLMHeadMethod(UnquantizedLinearMethod):
    """A `ParallelLMHead` absent from the checkpoint's quantized layers."""

    def tie_weights(self, layer, embed_tokens):
        from .linear import B12xEmbeddingMethod

        if not isinstance(getattr(embed_tokens, "quant_method", None), B12xEmbeddingMethod):
            return super().tie_weights(layer, embed_tokens)
        layer.weight = embed_tokens.weight  # what vLLM expects of a tied head (shape, device, dtype checks)
        layer.b12x_tied_to = (embed_tokens,)  # in a tuple, so torch does not register it as a submodule
        embed_tokens.b12x_tied_heads = getattr(embed_tokens, "b12x_tied_heads", 0) + 1
        return layer

    def process_weights_after_loading(self, layer) -> None:
        if not hasattr(layer, "b12x_tied_to"):
            super().process_weights_after_loading(layer)
        # tied: the embedding prepares the linear this head runs

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not hasattr(layer, "b12x_tied_to"):
            return super().apply(layer, x, bias)
        return bc.linear(x, layer.b12x_tied_to[0].b12x_linear, bias)


def ties_embeddings(embedding) -> bool:
    """Whether an embedding layer also serves as the LM head: a head was tied to it, or the model's config
    ties them (models that call the embedding as their head never call tie_weights)."""
    if getattr(embedding, "b12x_tied_heads", 0):
        return True
    from vllm.config import get_current_vllm_config

    model_config = get_current_vllm_config().model_config
    if model_config is None:
        return False
    # (vLLM clears the flag when the checkpoint brings its own lm_head)
    return bool(getattr(model_config.hf_text_config, "tie_word_embeddings", False))
