"""Broken copies of the tiny models (tiny_models.py), one per start-up fault, each with the one line b12x must
end the server with (b12x_vllm/preflight.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from b12x_formats.cli import main as formats_cli


@dataclass(frozen=True)
class Bad:
    model: Path
    flags: tuple[str, ...]  # server flags beyond the backend ones
    line: str  # the one error line, exactly


def truncated(models, tmp: Path) -> Bad:
    """The Llama's safetensors file cut in the middle of one tensor's bytes."""
    model = shutil.copytree(models["llama"].quantized, tmp / "truncated")
    (path,) = model.glob("*.safetensors")
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    name = "model.layers.1.self_attn.o_proj.weight"
    start, end = header[name]["data_offsets"]
    cut = 8 + header_len + (start + end) // 2
    path.write_bytes(raw[:cut])
    info = header[name]
    return Bad(model, (), f"{path}: tensor {name!r} {info['shape']} {info['dtype']} ends at byte {8 + header_len + end} "
                          f"but the file has only {cut} bytes: the file is truncated (its header lists more data "
                          "than it holds)")  # fmt: skip


def wrong_block_payload_bytes(models, tmp: Path) -> Bad:
    """An IQ2_XS layer's quantized_layers entry says 66-byte blocks (IQ2_XXS's) instead of 74."""
    model = shutil.copytree(models["llama"].quantized, tmp / "payload")
    config = json.loads((model / "config.json").read_text())
    layers = config["quantization_config"]["quantized_layers"]
    prefix = next(p for p, e in layers.items() if e["quant_algo"] == "IQ2_XS")
    layers[prefix]["block_payload_bytes"] = 66
    (model / "config.json").write_text(json.dumps(config))
    return Bad(model, (), f"{model / 'config.json'}: quantized_layers[{prefix!r}]: block_payload_bytes 66 is wrong "
                          "for IQ2_XS; each block of 256 weights is 74 bytes")  # fmt: skip


def fp8_experts(models, tmp: Path) -> Bad:
    """The MoE's layer-0 experts in FP8, a linear format b12x's fused MoE does not run."""
    import b12x_core as bc

    hf = models["qwen3_moe"].quantized.parent / "hf"
    model = tmp / "fp8_experts"
    args = ["quantize", str(hf), str(model), "--default", "Q8_0", "--layer", "model.layers.0.mlp.experts.*=FP8"]
    assert formats_cli(args) == 0
    config = json.loads((model / "config.json").read_text())
    prefix = next(p for p, e in config["quantization_config"]["quantized_layers"].items() if e["quant_algo"] == "FP8")
    path, shape = stored(model, f"{prefix}.weight")
    return Bad(model, (), f"{path}: tensor {prefix}.weight {shape} is FP8, an MoE expert; b12x's fused MoE runs "
                          f"experts in {', '.join(sorted(bc.MOE_FORMATS))} only")  # fmt: skip


def shard_breaks_a_block(models, tmp: Path) -> Bad:
    """The Llama all IQ2_XS over two tensor-parallel ranks: o_proj's K = 256 splits into 128 per rank, half an
    IQ2_XS block (256 weights)."""
    hf = models["llama"].quantized.parent / "hf"
    model = tmp / "iq2_tp2"
    assert formats_cli(["quantize", str(hf), str(model), "--default", "IQ2_XS"]) == 0
    config = json.loads((model / "config.json").read_text())
    prefix = next(p for p in config["quantization_config"]["quantized_layers"] if p.endswith("o_proj"))
    path, shape = stored(model, f"{prefix}.weight")  # [N, K / 256 blocks, 74 bytes]
    k = config["num_attention_heads"] * config["head_dim"]
    assert k == 256 and shape[1:] == [1, 74]
    return Bad(
        model,
        ("--tensor-parallel-size", "2"),
        f"{path}: tensor {prefix}.weight {shape} is IQ2_XS with K={k}; over 2 tensor-parallel ranks each "
        f"rank's shard holds K={k // 2}, which breaks IQ2_XS's blocks (K per rank must be a multiple of 256)",
    )


def stored(model: Path, name: str) -> tuple[Path, list[int]]:
    """(file, shape) of a tensor as its safetensors header has it."""
    from b12x_formats.checkpoint import Checkpoint

    file = Checkpoint(model).file_of(name)
    return file.path, list(file.shape(name))


CASES: dict[str, Callable] = {
    "truncated safetensors": truncated,
    "wrong block_payload_bytes": wrong_block_payload_bytes,
    "MoE experts in FP8": fp8_experts,
    "a shard breaks a block": shard_breaks_a_block,
}
