"""Tiny GGUF models written with gguf.GGUFWriter, for the convert-gguf tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

import b12x_formats as bf

Q = gguf.GGMLQuantizationType


@dataclass
class TinyModel:
    arch: str  # "llama" | "qwen2" | "qwen3" | "qwen3moe"
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 320
    experts: int = 4
    experts_used: int = 2
    expert_intermediate: int = 256
    # gguf tensor-name suffix (e.g. "attn_q") -> type; unlisted 2-D tensors are F16, norms F32
    types: dict[str, Q] = field(default_factory=dict)
    tie_embeddings: bool = False
    metadata_intermediate: int | None = None  # write a wrong feed_forward_length (metadata/tensor mismatch)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies are written in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def bpe_vocab(size: int) -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary: 256 byte tokens, a few merges, two control tokens, padded to `size`."""
    byte_tokens = list(_bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"]
    merged = ["Ġt", "he", "Ġthe", "in", "Ġa", "er"]
    specials = ["<|endoftext|>", "<|im_end|>"]
    tokens = byte_tokens + merged
    tokens += [f"<|extra_{i}|>" for i in range(size - len(tokens) - len(specials))] + specials
    types = [1] * (size - len(specials)) + [3] * len(specials)
    return tokens, merges, types


def _random_weight(rng, shape, qtype) -> np.ndarray:
    w = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    if qtype == Q.F32:
        return w
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype in (Q.IQ2_XS, Q.IQ2_XXS, Q.Q8_0):
        blocks = bf.quantize(w, qtype.name).tensors["weight"]
        return blocks.reshape(*shape[:-1], -1)
    return gguf.quants.quantize(w, qtype)  # e.g. Q4_0: exercised as "other types become bf16"


def write_tiny_gguf(path: Path, model: TinyModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the model; returns gguf tensor name -> the stored array (raw bytes for quantized types)."""
    rng = np.random.default_rng(seed)
    m = model
    w = gguf.GGUFWriter(str(path), m.arch)
    w.add_name(f"tiny-{m.arch}")
    w.add_context_length(256)
    w.add_embedding_length(m.hidden)
    w.add_block_count(m.layers)
    w.add_feed_forward_length(m.metadata_intermediate or m.intermediate)
    w.add_head_count(m.heads)
    w.add_head_count_kv(m.kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_key_length(m.head_dim)
    w.add_value_length(m.head_dim)
    w.add_rope_dimension_count(m.head_dim)
    w.add_vocab_size(m.vocab)
    if m.arch == "qwen3moe":
        w.add_expert_count(m.experts)
        w.add_expert_used_count(m.experts_used)
        w.add_expert_feed_forward_length(m.expert_intermediate)
    tokens, merges, types = bpe_vocab(m.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if m.arch.startswith("qwen") else "llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(m.vocab - 2)
    w.add_eos_token_id(m.vocab - 1)

    stored: dict[str, np.ndarray] = {}

    def tensor(name, shape, default=Q.F16):
        leaf = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        if len(shape) == 1:  # norms and biases
            qtype, data = Q.F32, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            qtype = m.types.get(leaf, default)
            data = _random_weight(rng, shape, qtype)
        stored[name] = data
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)

    h, q_rows, kv_rows = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim
    tensor("token_embd.weight", (m.vocab, h))
    for i in range(m.layers):
        b = f"blk.{i}"
        tensor(f"{b}.attn_norm.weight", (h,))
        tensor(f"{b}.attn_q.weight", (q_rows, h))
        tensor(f"{b}.attn_k.weight", (kv_rows, h))
        tensor(f"{b}.attn_v.weight", (kv_rows, h))
        tensor(f"{b}.attn_output.weight", (h, q_rows))
        if m.arch == "qwen2":
            for proj, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)):
                tensor(f"{b}.{proj}.bias", (rows,))
        if m.arch.startswith("qwen3"):
            tensor(f"{b}.attn_q_norm.weight", (m.head_dim,))
            tensor(f"{b}.attn_k_norm.weight", (m.head_dim,))
        tensor(f"{b}.ffn_norm.weight", (h,))
        if m.arch == "qwen3moe":
            e, ie = m.experts, m.expert_intermediate
            tensor(f"{b}.ffn_gate_inp.weight", (e, h), default=Q.F32)
            tensor(f"{b}.ffn_gate_exps.weight", (e, ie, h))
            tensor(f"{b}.ffn_up_exps.weight", (e, ie, h))
            tensor(f"{b}.ffn_down_exps.weight", (e, h, ie))
        else:
            tensor(f"{b}.ffn_gate.weight", (m.intermediate, h))
            tensor(f"{b}.ffn_up.weight", (m.intermediate, h))
            tensor(f"{b}.ffn_down.weight", (h, m.intermediate))
    tensor("output_norm.weight", (h,))
    if not m.tie_embeddings:
        tensor("output.weight", (m.vocab, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored
