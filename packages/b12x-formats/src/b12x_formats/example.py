"""Tiny random checkpoints (bf16, Llama and Qwen3-MoE style): the README demo's input and the tests'.

Dimensions are multiples of 256 so that every format, IQ2 included, applies to every linear layer.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from .checkpoint import save_checkpoint

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def llama_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random bf16 weights with the parameter names and shapes of transformers' LlamaForCausalLM."""
    rng = np.random.default_rng(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def linear(n, k):
        return (rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(ml_dtypes.bfloat16)

    def norm():
        return (1 + 0.1 * rng.standard_normal(h, dtype=np.float32)).astype(ml_dtypes.bfloat16)

    out = {"model.embed_tokens.weight": linear(v, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out |= {
            f"{p}.input_layernorm.weight": norm(),
            f"{p}.self_attn.q_proj.weight": linear(q, h),
            f"{p}.self_attn.k_proj.weight": linear(kv, h),
            f"{p}.self_attn.v_proj.weight": linear(kv, h),
            f"{p}.self_attn.o_proj.weight": linear(h, q),
            f"{p}.post_attention_layernorm.weight": norm(),
            f"{p}.mlp.gate_proj.weight": linear(i, h),
            f"{p}.mlp.up_proj.weight": linear(i, h),
            f"{p}.mlp.down_proj.weight": linear(h, i),
        }
    out |= {"model.norm.weight": norm(), "lm_head.weight": linear(v, h)}
    return out


TINY_QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 256,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def qwen3_moe_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random bf16 weights with the (per-expert) parameter names of Qwen3MoeForCausalLM checkpoints."""
    rng = np.random.default_rng(seed)
    h, ie, v, e = config["hidden_size"], config["moe_intermediate_size"], config["vocab_size"], config["num_experts"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def linear(n, k):
        return (rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(ml_dtypes.bfloat16)

    def norm(size=h):
        return (1 + 0.1 * rng.standard_normal(size, dtype=np.float32)).astype(ml_dtypes.bfloat16)

    out = {"model.embed_tokens.weight": linear(v, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out |= {
            f"{p}.input_layernorm.weight": norm(),
            f"{p}.self_attn.q_proj.weight": linear(q, h),
            f"{p}.self_attn.k_proj.weight": linear(kv, h),
            f"{p}.self_attn.v_proj.weight": linear(kv, h),
            f"{p}.self_attn.o_proj.weight": linear(h, q),
            f"{p}.self_attn.q_norm.weight": norm(hd),
            f"{p}.self_attn.k_norm.weight": norm(hd),
            f"{p}.post_attention_layernorm.weight": norm(),
            f"{p}.mlp.gate.weight": linear(e, h),
        }
        for x in range(e):
            out |= {
                f"{p}.mlp.experts.{x}.gate_proj.weight": linear(ie, h),
                f"{p}.mlp.experts.{x}.up_proj.weight": linear(ie, h),
                f"{p}.mlp.experts.{x}.down_proj.weight": linear(h, ie),
            }
    out |= {"model.norm.weight": norm(), "lm_head.weight": linear(v, h)}
    return out


EXAMPLES = {"llama": (TINY_LLAMA, llama_tensors), "qwen3_moe": (TINY_QWEN3_MOE, qwen3_moe_tensors)}


def byte_level_tokenizer(vocab_size: int) -> dict[str, bytes] | None:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE with exactly `vocab_size` tokens (256 bytes,
    merges of letter pairs, then <s> and </s>), so generated ids always decode. None without `tokenizers`."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        return None
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    merges = []
    for a in letters:
        for b in letters:
            if len(vocab) >= vocab_size - 2:
                break
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    vocab["<s>"], vocab["</s>"] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def write_example(out_dir: str | Path, overwrite: bool = False, seed: int = 0, arch: str = "llama") -> Path:
    config, make = EXAMPLES[arch]
    tokenizer = byte_level_tokenizer(config["vocab_size"]) or {}
    config = dict(config, bos_token_id=config["vocab_size"] - 2, eos_token_id=config["vocab_size"] - 1)
    tensors = make(config, seed)
    return save_checkpoint(
        out_dir, tensors.items(), config, extra_files=tokenizer, total=len(tensors), overwrite=overwrite
    )
