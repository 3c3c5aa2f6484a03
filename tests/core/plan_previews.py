"""The plans a GPU that is not here would run, as text: every linear format × activation mode on the Llama-3.1-8B
and 70B decoder layers' four linears, and every MoE format × activation mode on the Qwen3-30B-A3B-, gpt-oss- and
DeepSeek-V3-like layers, for Hopper, SM120 and SM121 (previews: nothing is prepared).

test_plan_previews.py compares this text with the saved copy in data/plan_previews.txt, so a change that moves
any plan (a backend, a configuration, a range, a reason) shows as a diff. After a change that is meant to move
them, write the new copy and read its diff:

    python tests/core/plan_previews.py > tests/core/data/plan_previews.txt && git diff tests/core/data
"""

from __future__ import annotations

import torch

import b12x_formats as bf
from b12x_core import plan
from b12x_core.backends import DeviceInfo, MoEShape, Query
from b12x_core.moe import MOE_FORMATS
from b12x_core.recipe import activation_mode

CUDA = torch.device("cuda", 0)
DEVICES = {  # compute capability, SMs and shared memory a block of each GPU (Hopper: the two measured, by name)
    "h200": DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H200"),
    "h100": DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H100 80GB HBM3"),
    "sm120": DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99, block_scaled_mm="not verified here"),
    "sm121": DeviceInfo(CUDA, (12, 1), sms=48, smem_kb=99, block_scaled_mm="not verified here"),
}
LAYERS = {  # a decoder layer's linears as vLLM runs them (qkv and gate_up fused): name -> rows of each shard, K
    "8b": {"qkv": ((4096, 1024, 1024), 4096), "o": ((4096,), 4096), "gate_up": ((14336, 14336), 4096),
           "down": ((4096,), 14336)},
    "70b": {"qkv": ((8192, 1024, 1024), 8192), "o": ((8192,), 8192), "gate_up": ((28672, 28672), 8192),
            "down": ((8192,), 28672)},
}  # fmt: skip
MOE_LAYERS = {"qwen3": (128, 8, 2048, 768), "gptoss": (128, 4, 2880, 2880), "dsv3": (256, 8, 7168, 2048)}
# (format, activation, has input_scale): every format with bf16 activations, then every quantized activation mode
LINEAR_PAIRS = [(f, "bf16", False) for f in bf.FORMATS] + [
    ("FP8", "fp8", True), ("FP8", "fp8", False), ("FP8_BLOCK", "fp8", False), ("MXFP8", "mxfp8", False),
    ("MXFP4", "mxfp8", False), ("NVFP4", "mxfp8", False), ("NVFP4", "nvfp4", True),
]  # fmt: skip
MAX_TOKENS = 4096


def linear_query(fmt, activation, scaled, device, shards, k) -> Query:
    mode = activation_mode(fmt, activation, scaled)
    return Query("linear", fmt, activation, mode, device, "auto", sum(shards), k, MAX_TOKENS, shards)


def moe_query(fmt, activation, device, experts, top_k, hidden, inter) -> Query:
    mode = activation_mode(fmt, activation, fmt == "NVFP4" and activation == "nvfp4")
    shape = MoEShape(experts, hidden, inter, top_k, "silu", "gate_up", mode, fmt)
    return Query("moe", fmt, activation, mode, device, "auto", 2 * inter, hidden, MAX_TOKENS, moe=shape)


def _text(query: Query, header: str) -> str:
    try:
        return plan.preview(query).explain(header)
    except ValueError as err:  # UnsupportedError: no backend can run it here; the reason is part of the plan
        return f"{header}\n  refused: {err}"


def previews() -> str:
    out = []
    for dev_name, device in DEVICES.items():
        for model, linears in LAYERS.items():
            for fmt, activation, scaled in LINEAR_PAIRS:
                for name, (shards, k) in linears.items():
                    header = f"== {dev_name} {model}.{name} {fmt} × {activation}{' static' if scaled else ''}"
                    out.append(_text(linear_query(fmt, activation, scaled, device, shards, k), header))
        for layer, (experts, top_k, hidden, inter) in MOE_LAYERS.items():
            for fmt, activations in MOE_FORMATS.items():
                for activation in activations:
                    header = f"== {dev_name} {layer} MoE {fmt} × {activation}"
                    out.append(_text(moe_query(fmt, activation, device, experts, top_k, hidden, inter), header))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(previews(), end="")
