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

TINY_QWEN3_MOE = {
    **TINY_LLAMA,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 256,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
}


ROUTER_SCALE = 8  # the MoE routers' weights, in units of a random linear layer's 1/sqrt(K)


class _Random:
    """bf16 tensors with the scale of a trained layer (weights ~ 1/sqrt(K), norms ~ 1)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def linear(self, n: int, k: int) -> np.ndarray:
        return (self.rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(ml_dtypes.bfloat16)

    def norm(self, size: int) -> np.ndarray:
        return (1 + 0.1 * self.rng.standard_normal(size, dtype=np.float32)).astype(ml_dtypes.bfloat16)


def _decoder(config: dict, seed: int, mlp) -> dict[str, np.ndarray]:
    """Embedding, attention blocks (q/k norms when `qk_norm`), `mlp(random, prefix)` per layer, head."""
    r = _Random(seed)
    h, v = config["hidden_size"], config["vocab_size"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": r.linear(v, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out |= {
            f"{p}.input_layernorm.weight": r.norm(h),
            f"{p}.self_attn.q_proj.weight": r.linear(q, h),
            f"{p}.self_attn.k_proj.weight": r.linear(kv, h),
            f"{p}.self_attn.v_proj.weight": r.linear(kv, h),
            f"{p}.self_attn.o_proj.weight": r.linear(h, q),
            f"{p}.post_attention_layernorm.weight": r.norm(h),
        }
        if config["model_type"].startswith("qwen3"):
            out |= {f"{p}.self_attn.q_norm.weight": r.norm(hd), f"{p}.self_attn.k_norm.weight": r.norm(hd)}
        out |= mlp(r, p)
    out |= {"model.norm.weight": r.norm(h), "lm_head.weight": r.linear(v, h)}
    return out


def llama_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random bf16 weights with the parameter names and shapes of transformers' LlamaForCausalLM."""
    h, i = config["hidden_size"], config["intermediate_size"]

    def mlp(r, p):
        return {
            f"{p}.mlp.gate_proj.weight": r.linear(i, h),
            f"{p}.mlp.up_proj.weight": r.linear(i, h),
            f"{p}.mlp.down_proj.weight": r.linear(h, i),
        }

    return _decoder(config, seed, mlp)


def qwen3_moe_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random bf16 weights with the (per-expert) parameter names of Qwen3MoeForCausalLM checkpoints."""
    h, ie, e = config["hidden_size"], config["moe_intermediate_size"], config["num_experts"]

    def mlp(r, p):
        # A decisive router (ROUTER_SCALE× a random layer's scale), as trained routers are: top-k choices hinge on
        # near ties less often, so comparisons of tiny models are not dominated by routing flips (they still
        # happen: tests that compare two models tell them apart, test_e2e_cpu's routing records).
        gate = r.linear(e, h).astype(np.float32) * ROUTER_SCALE
        out = {f"{p}.mlp.gate.weight": gate.astype(ml_dtypes.bfloat16)}
        for x in range(e):
            out |= {
                f"{p}.mlp.experts.{x}.gate_proj.weight": r.linear(ie, h),
                f"{p}.mlp.experts.{x}.up_proj.weight": r.linear(ie, h),
                f"{p}.mlp.experts.{x}.down_proj.weight": r.linear(h, ie),
            }
        return out

    return _decoder(config, seed, mlp)


EXAMPLES = {"llama": (TINY_LLAMA, llama_tensors), "qwen3_moe": (TINY_QWEN3_MOE, qwen3_moe_tensors)}


def byte_level_tokenizer(vocab_size: int) -> dict[str, bytes]:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE with exactly `vocab_size` tokens (256 bytes,
    merges of letter pairs, then <s> and </s>), so generated ids always decode.

    `tokenizers` is a dependency of b12x-formats; when it is missing anyway (a `--no-deps` install) this
    raises ImportError rather than write a checkpoint without a tokenizer, which vLLM cannot run."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError as err:
        raise ImportError(
            f"writing the example's tokenizer needs the 'tokenizers' package ({err}): pip install tokenizers"
        ) from err
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
    tokenizer = byte_level_tokenizer(config["vocab_size"])
    config = dict(config, bos_token_id=config["vocab_size"] - 2, eos_token_id=config["vocab_size"] - 1)
    tensors = make(config, seed)
    return save_checkpoint(
        out_dir, tensors.items(), config, extra_files=tokenizer, total=len(tensors), overwrite=overwrite
    )
