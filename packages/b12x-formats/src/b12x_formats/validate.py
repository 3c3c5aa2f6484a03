"""Checks of a checkpoint as a whole, beyond each tensor's own validity: every quantized-looking tensor
belongs to a quantized layer, and layer shapes agree with what `config.json` implies (vLLM builds its layers
from the config, so a mismatch loads nowhere).

Shapes are checked for the model types whose module shapes follow from these keys alone (SHAPE_CHECKED:
Llama, Mistral, Qwen2/3 and their MoE forms); other model types (e.g. DeepSeek's attention, whose o_proj
width is heads × v_head_dim) and configs without the needed keys are not shape-checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .shards import FLOAT_DTYPES

SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale")
SHAPE_CHECKED = ("llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _dims(c: dict) -> dict[str, int]:
    heads = c.get("num_attention_heads")
    d = {
        "hidden": c.get("hidden_size"),
        "vocab": c.get("vocab_size"),
        "ffn": c.get("intermediate_size"),
        "moe_ffn": c.get("moe_intermediate_size"),
        "shared_ffn": c.get("shared_expert_intermediate_size"),
        "experts": c.get("num_experts", c.get("num_local_experts")),
    }
    head_dim = c.get("head_dim")
    if head_dim is None and _ints(d["hidden"], heads) and heads > 0:
        head_dim = d["hidden"] // heads
    kv = c.get("num_key_value_heads", heads)
    if _ints(heads, kv, head_dim):
        d["q"], d["kv"] = heads * head_dim, kv * head_dim
    return {k: v for k, v in d.items() if _ints(v)}


def _ints(*values) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


# module name pattern -> (rows, columns) in terms of _dims' keys
_SHAPES: list[tuple[re.Pattern, tuple[str, str]]] = [
    (re.compile(p), dims)
    for p, dims in [
        (r"(^|.*\.)embed_tokens", ("vocab", "hidden")),
        (r"lm_head", ("vocab", "hidden")),
        (r".*\.self_attn\.q_proj", ("q", "hidden")),
        (r".*\.self_attn\.[kv]_proj", ("kv", "hidden")),
        (r".*\.self_attn\.o_proj", ("hidden", "q")),
        (r".*\.mlp\.(gate|up)_proj", ("ffn", "hidden")),
        (r".*\.mlp\.down_proj", ("hidden", "ffn")),
        (r".*\.mlp\.experts\.\d+\.(gate|up)_proj", ("moe_ffn", "hidden")),
        (r".*\.mlp\.experts\.\d+\.down_proj", ("hidden", "moe_ffn")),
        (r".*\.mlp\.shared_expert\.(gate|up)_proj", ("shared_ffn", "hidden")),
        (r".*\.mlp\.shared_expert\.down_proj", ("hidden", "shared_ffn")),
        (r".*\.mlp\.gate", ("experts", "hidden")),
    ]
]


def config_shapes(config: dict) -> Callable[[str], tuple[tuple[int, int], str] | None]:
    """A function: module prefix -> ((rows, columns) config.json implies, which keys say so), or None."""
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    dims = _dims(config) if config.get("model_type") in SHAPE_CHECKED else {}
    names = {"q": "num_attention_heads × head_dim", "kv": "num_key_value_heads × head_dim", "hidden": "hidden_size",
             "vocab": "vocab_size", "ffn": "intermediate_size", "moe_ffn": "moe_intermediate_size",
             "shared_ffn": "shared_expert_intermediate_size", "experts": "num_experts"}  # fmt: skip

    def expected(prefix: str):
        for pattern, (rows, cols) in _SHAPES:
            if pattern.fullmatch(prefix):
                if rows in dims and cols in dims:
                    return (dims[rows], dims[cols]), f"{names[rows]} × {names[cols]}"
                return None
        return None

    return expected


def check_checkpoint(ckpt) -> None:
    """ValueError naming the tensor or layer and the rule: quantized-looking tensors outside any quantized
    layer, non-float weights of unquantized modules, layer shapes that disagree with config.json."""
    layers = ckpt.quantized_layers()
    expected = config_shapes(ckpt.config)
    for name in ckpt.tensor_names():
        prefix, _, leaf = name.rpartition(".")
        if prefix in layers:
            continue
        file = ckpt.file_of(name)
        if leaf in SCALE_SUFFIXES:
            raise ValueError(
                f"{file.path}: tensor {name!r} is a quantization scale, but {prefix!r} is not a quantized layer "
                "of the checkpoint's quantization_config"
            )
        if leaf == "weight":
            dtype, shape = file.dtype_name(name), file.shape(name)
            if dtype not in FLOAT_DTYPES:
                raise ValueError(
                    f"{file.path}: tensor {name!r} {list(shape)} is {dtype}, but {prefix!r} is not a quantized "
                    "layer of the checkpoint's quantization_config; unquantized weights are floating point"
                )
            _check_shape(ckpt, prefix, shape, expected)
    for prefix, fmt in layers.items():
        qw = ckpt.quantized_weight(prefix, fmt)
        _check_shape(ckpt, prefix, qw.shape, expected)


def _check_shape(ckpt, prefix: str, shape: tuple[int, ...], expected) -> None:
    want = expected(prefix)
    if want is not None and len(shape) == 2 and tuple(shape) != want[0]:
        raise ValueError(
            f"{ckpt.directory}: layer {prefix!r} has shape {list(shape)}, but config.json implies "
            f"{list(want[0])} ({want[1]})"
        )
