"""Quantize a floating-point Hugging Face checkpoint into a ModelOpt mixed-precision one (and decode one back).

Which modules are quantized: every 2-D `<module>.weight` of a linear layer. Norms, biases, MoE routers
(`...mlp.gate`, `...router`), embeddings and `lm_head` stay as they are unless a `--layer` rule names them
(a Q8_0 `embed_tokens` is a supported b12x embedding). `--keep` globs always win; then the first matching
`--layer GLOB=FMT`; then `--default`. Globs match module prefixes (`model.layers.0.mlp.down_proj`).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._arrays import require_finite, to_float32
from .api import quantize
from .checkpoint import INDEX_NAME, Checkpoint, save_checkpoint
from .modelopt import QuantizationConfig, is_norm_module
from .output import check_output
from .quantized import codec_for
from .shards import FLOAT_DTYPES
from .validate import check_checkpoint

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

    def check_globs(self, modules: Iterable[str]) -> None:
        """Refuse a --layer / --keep glob that matches no module: a typo would otherwise quantize silently."""
        modules = sorted(set(modules))
        given = [(f"--layer '{g}={f}'", g) for g, f in self.rules] + [(f"--keep '{g}'", g) for g in self.keep]
        for option, glob in given:
            if not any(fnmatch.fnmatchcase(m, glob) for m in modules):
                close = difflib.get_close_matches(glob, modules, n=1, cutoff=0.6)
                hint = f" (closest module: {close[0]!r})" if close else ""
                raise ValueError(f"{option} matches no module of the checkpoint{hint}")


def side_files(src: Path) -> dict[str, Path]:
    """Files a converted checkpoint carries over unchanged: tokenizer, generation config, chat template..."""
    skip = (INDEX_NAME, "config.json", "hf_quant_config.json")
    return {p.name: p for p in src.iterdir() if p.is_file() and p.suffix != ".safetensors" and p.name not in skip}


def quantize_checkpoint(src: str | Path, out: str | Path, plan: QuantizePlan, overwrite: bool = False) -> Path:
    """Read `src` (bf16/fp16/fp32 safetensors), quantize per `plan`, write `out` atomically. `src` is only read."""
    src, out = Path(src), Path(out)
    check_output(out, [src], overwrite)  # before minutes of work (and again when writing)
    ckpt = Checkpoint(src)
    check_checkpoint(ckpt)
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
    plan.check_globs(name.rpartition(".")[0] for name in names)
    if not chosen:
        raise ValueError(f"{src}: no module matched; nothing to quantize")

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for name in names:
            prefix = name[: -len(".weight")] if name.endswith(".weight") else None
            array = _finite_input(ckpt, name)
            if prefix in chosen:
                try:
                    qw = quantize(to_float32(array), chosen[prefix])
                except ValueError as err:
                    raise ValueError(
                        f"{ckpt.file_of(name).path}: layer {prefix!r} {list(array.shape)}: {err}"
                    ) from None
                for tname, qarray in qw.tensors.items():
                    yield f"{prefix}.{tname}", qarray
            else:
                yield name, np.asarray(array)

    extra = side_files(src)
    config = dict(ckpt.config)
    quant = QuantizationConfig(layers=chosen)
    total = len(names) + sum(len(codec_for(f).spec.required_tensors) - 1 for f in chosen.values())
    return save_checkpoint(
        out, tensors(), config, quant, extra_files=extra, total=total, overwrite=overwrite, desc="quantizing",
        inputs=[src],
    )  # fmt: skip


def _finite_input(ckpt: Checkpoint, name: str) -> np.ndarray:
    """A source tensor; floating ones must be finite (a NaN would be quantized or copied into the output)."""
    array = ckpt.get(name)
    file = ckpt.file_of(name)
    if file.dtype_name(name) in FLOAT_DTYPES:
        require_finite(f"{file.path}: tensor {name!r}", array, "only finite weights can be quantized or copied")
    return array


def dequantize_checkpoint(src: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """The float twin of a quantized checkpoint: every quantized module decoded exactly, stored as bf16
    (float32 decode rounded once), everything else copied; no quantization_config. `src` is only read."""
    import ml_dtypes

    from .api import dequantize

    src, out = Path(src), Path(out)
    check_output(out, [src], overwrite)
    ckpt = Checkpoint(src)
    check_checkpoint(ckpt)
    layers = ckpt.quantized_layers()
    owned = {f"{p}.{t}": p for p, f in layers.items() for t in codec_for(f).spec.tensor_names}

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for prefix in layers:
            try:
                decoded = dequantize(ckpt.quantized_weight(prefix)).astype(ml_dtypes.bfloat16)
                # float32 values within 0.4% of its maximum round past bf16's
                require_finite("bf16 weight", decoded, "the decoded values overflow bf16")
            except ValueError as err:
                raise ValueError(f"{src}: layer {prefix!r}: {err}") from None
            yield f"{prefix}.weight", decoded
        for name in ckpt.tensor_names():
            if name not in owned:
                yield name, np.asarray(_finite_input(ckpt, name))

    extra = side_files(src)
    config = {k: v for k, v in ckpt.config.items() if k != "quantization_config"}
    total = len(layers) + sum(1 for n in ckpt.tensor_names() if n not in owned)
    return save_checkpoint(
        out, tensors(), config, None, extra_files=extra, total=total, overwrite=overwrite, desc="dequantizing",
        inputs=[src],
    )  # fmt: skip
