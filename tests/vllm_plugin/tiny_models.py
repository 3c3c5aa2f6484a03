"""The tiny mixed-precision models of the CPU end-to-end tests, each built once per test session (conftest's
`tiny_models` fixture): test_e2e_cpu.py holds them to their float twins offline, test_server.py serves them.

A model is a random bf16 checkpoint (b12x_formats.example) quantized with `b12x-formats quantize` into the mix
below, and its float twin (`b12x-formats dequantize`). The seed is drawn afresh per session; B12X_SEED replays it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from b12x_formats.cli import main as formats_cli

LLAMA_LAYERS = [
    "model.layers.0.self_attn.[qkv]_proj=MXFP4", "model.layers.1.self_attn.[qkv]_proj=FP8",
    "model.layers.0.self_attn.o_proj=NVFP4", "model.layers.1.self_attn.o_proj=Q8_0",
    "model.layers.0.mlp.down_proj=Q8_0", "model.layers.1.mlp.down_proj=NVFP4",
    "model.layers.1.mlp.*=IQ2_XXS", "model.embed_tokens=Q8_0", "lm_head=Q8_0",
]  # fmt: skip
MOE_LAYERS = [
    "model.layers.0.mlp.experts.*=IQ2_XS", "model.layers.1.mlp.experts.*=MXFP4",
    "model.layers.0.self_attn.*=IQ2_XXS", "model.layers.1.self_attn.*=NVFP4", "model.embed_tokens=Q8_0", "lm_head=Q8_0",
]  # fmt: skip
MIXES = {"llama": ("IQ2_XS", LLAMA_LAYERS), "qwen3_moe": ("Q8_0", MOE_LAYERS)}  # arch -> (--default, --layer rules)


def build(tmp: Path, arch: str, default: str, layers: list[str], seed: int) -> tuple[Path, Path]:
    """-> (quantized checkpoint, its float twin) under `tmp`."""
    from b12x_formats.example import write_example

    write_example(tmp / "hf", arch=arch, seed=seed)
    args = ["quantize", str(tmp / "hf"), str(tmp / "b12x"), "--default", default]
    for rule in layers:
        args += ["--layer", rule]
    assert formats_cli(args) == 0
    assert formats_cli(["dequantize", str(tmp / "b12x"), str(tmp / "float")]) == 0
    return tmp / "b12x", tmp / "float"


@dataclass(frozen=True)
class TinyModel:
    arch: str
    quantized: Path
    floating: Path


class TinyModels:
    """arch -> TinyModel, each built on first use (a test run that needs one model builds one)."""

    def __init__(self, root: Path, seed: int | None = None):
        self.root = root
        self.seed = int(os.environ.get("B12X_SEED", np.random.SeedSequence().entropy % 2**32)) if seed is None else seed
        self._built: dict[str, TinyModel] = {}

    def __getitem__(self, arch: str) -> TinyModel:
        if arch not in self._built:
            # one model seed per arch from the session's seed: B12X_SEED replays every model
            seed = int(np.random.default_rng([self.seed, list(MIXES).index(arch)]).integers(1 << 30))
            default, layers = MIXES[arch]
            self._built[arch] = TinyModel(arch, *build(self.root / arch, arch, default, layers, seed))
        return self._built[arch]
