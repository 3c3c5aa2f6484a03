"""Quantize a floating-point Hugging Face checkpoint into a ModelOpt mixed-precision one (and decode one back).

Which modules are quantized: every 2-D `<module>.weight` of a linear layer. Norms, biases, MoE routers
(`...mlp.gate`, `...router`), embeddings and `lm_head` stay as they are unless a `--layer` rule names them
(a Q8_0 `embed_tokens` is a supported b12x embedding). `--keep` globs always win; then the first matching
`--layer GLOB=FMT`; then `--default`. Globs match module prefixes (`model.layers.0.mlp.down_proj`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._arrays import to_float32
from .api import quantize
from .checkpoint import INDEX_NAME, Checkpoint, save_checkpoint
from .imatrix import module_importance, read_imatrix
from .modelopt import QuantizationConfig, is_norm_module
from .parallel import Work, in_order
from .quantized import codec_for

# Formats whose quantizer searches with an importance (api.quantize's `importance`); the others ignore one.
_USES_IMPORTANCE = ("IQ2_XS", "IQ2_XXS")
_NOT_BY_DEFAULT = re.compile(r"(^|\.)(embed_tokens|wte|lm_head|gate|router|shared_expert_gate)$")


@dataclass
class QuantizePlan:
    default: str | None
    rules: list[tuple[str, str]] = field(default_factory=list)  # (glob, format), first match wins
    keep: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.default = codec_for(self.default).spec.name if self.default else None
        self.rules = [(glob, codec_for(fmt).spec.name) for glob, fmt in self.rules]

    @classmethod
    def from_cli(cls, default: str | None, layer_rules: list[str], keep: list[str]) -> QuantizePlan:
        rules = []
        for rule in layer_rules:
            glob, sep, fmt = rule.rpartition("=")
            if not sep or not glob or not fmt:
                raise ValueError(f"--layer {rule!r}: expected GLOB=FORMAT, e.g. '*.mlp.down_proj=Q8_0'")
            rules.append((glob, fmt))
        return cls(default, rules, list(keep))

    def format_for(self, prefix: str, shape: tuple[int, ...]) -> str | None:
        if len(shape) != 2 or is_norm_module(prefix):
            return None
        if any(fnmatch.fnmatchcase(prefix, g) for g in self.keep):
            return None
        for glob, fmt in self.rules:
            if fnmatch.fnmatchcase(prefix, glob):
                return fmt
        if _NOT_BY_DEFAULT.search(prefix):
            return None
        return self.default


def side_files(src: Path) -> dict[str, Path]:
    """Files a converted checkpoint carries over unchanged: tokenizer, generation config, chat template..."""
    skip = (INDEX_NAME, "config.json", "hf_quant_config.json")
    return {p.name: p for p in src.iterdir() if p.is_file() and p.suffix != ".safetensors" and p.name not in skip}


def _quantize_layer(prefix: str, weight: np.ndarray, fmt: str, importance) -> list[tuple[str, np.ndarray]]:
    """One layer's work -> its checkpoint tensors (module level, so a worker process can run it)."""
    qw = quantize(to_float32(weight), fmt, importance=importance)
    return [(f"{prefix}.{tname}", array) for tname, array in qw.tensors.items()]


def quantize_checkpoint(
    src: str | Path,
    out: str | Path,
    plan: QuantizePlan,
    overwrite: bool = False,
    jobs: int = 1,
    imatrix: str | Path | None = None,
) -> Path:
    """Read `src` (bf16/fp16/fp32 safetensors), quantize per `plan`, write `out` atomically. `src` is only read.

    `jobs` layers are quantized at once in worker processes (the same bytes as one); `imatrix` is a llama.cpp
    importance matrix file whose entries weight the IQ2 layers' search.
    """
    src, out = Path(src), Path(out)
    if src.resolve() == out.resolve():
        raise ValueError("quantize: OUT_DIR must differ from HF_DIR (inputs are never modified)")
    ckpt = Checkpoint(src)
    if ckpt.quantization is not None:
        raise ValueError(f"{src} is already quantized ({ckpt.config['quantization_config'].get('quant_algo')})")
    names = ckpt.tensor_names()
    chosen: dict[str, str] = {}
    for name in names:
        if name.endswith(".weight"):
            prefix = name[: -len(".weight")]
            fmt = plan.format_for(prefix, ckpt.file_of(name).shape(name))
            if fmt is not None:
                k = ckpt.file_of(name).shape(name)[-1]
                multiple = codec_for(fmt).spec.k_multiple
                if k % multiple:
                    raise ValueError(
                        f"{prefix}: K={k} is not a multiple of {multiple}, the group size of {fmt}; "
                        f"choose another format for it with --layer '{prefix}=FMT' or keep it with --keep"
                    )
                chosen[prefix] = fmt
    if not chosen:
        raise ValueError(f"{src}: no module matched; nothing to quantize")
    importance = _importance(imatrix, ckpt, chosen) if imatrix is not None else {}

    def work() -> Iterator:  # per tensor: a Work for a worker process, or the tensors to copy as they are
        for name in names:
            prefix = name[: -len(".weight")] if name.endswith(".weight") else None
            if prefix in chosen:
                weight = ckpt.get(name)
                args = (prefix, weight, chosen[prefix], importance.get(prefix))
                yield Work(_quantize_layer, args, nbytes=weight.nbytes)
            else:
                yield [(name, np.asarray(ckpt.get(name)))]

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for written in in_order(work(), jobs):
            yield from written

    extra = side_files(src)
    config = dict(ckpt.config)
    quant = QuantizationConfig(layers=chosen)
    total = len(names) + sum(len(codec_for(f).spec.required_tensors) - 1 for f in chosen.values())
    return save_checkpoint(
        out, tensors(), config, quant, extra_files=extra, total=total, overwrite=overwrite, desc="quantizing"
    )


def _importance(path: str | Path, ckpt: Checkpoint, chosen: dict[str, str]) -> dict[str, np.ndarray]:
    """The imatrix entry [K] of every layer whose format uses one (IQ2); an error names any that is missing."""
    widths = {p: ckpt.file_of(f"{p}.weight").shape(f"{p}.weight")[-1] for p in chosen}
    wanted = {p: k for p, k in widths.items() if chosen[p] in _USES_IMPORTANCE}
    return module_importance(read_imatrix(path), ckpt.config, wanted, str(path)) if wanted else {}


def dequantize_checkpoint(src: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """The float twin of a quantized checkpoint: every quantized module decoded exactly, stored as bf16
    (float32 decode rounded once), everything else copied; no quantization_config. `src` is only read."""
    import ml_dtypes

    from .api import dequantize

    src, out = Path(src), Path(out)
    ckpt = Checkpoint(src)
    layers = ckpt.quantized_layers()
    owned = {f"{p}.{t}": p for p, f in layers.items() for t in codec_for(f).spec.tensor_names}

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for prefix in layers:
            yield f"{prefix}.weight", dequantize(ckpt.quantized_weight(prefix)).astype(ml_dtypes.bfloat16)
        for name in ckpt.tensor_names():
            if name not in owned:
                yield name, np.asarray(ckpt.get(name))

    extra = side_files(src)
    config = {k: v for k, v in ckpt.config.items() if k != "quantization_config"}
    total = len(layers) + sum(1 for n in ckpt.tensor_names() if n not in owned)
    return save_checkpoint(
        out, tensors(), config, None, extra_files=extra, total=total, overwrite=overwrite, desc="dequantizing"
    )
