"""Quantize a Hugging Face checkpoint into a ModelOpt mixed-precision one (and decode one back).

The input may already hold layers in b12x formats (a converted GGUF, an earlier `quantize`): those are kept
byte for byte unless a `--layer` rule asks for another format (layer_choice.py).

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
from .api import dequantize, quantize
from .checkpoint import INDEX_NAME, Checkpoint, quantized_tensors, save_checkpoint
from .imatrix import ImportanceMatrix, module_importance, read_imatrix
from .layer_choice import choose_layers, owned_tensors
from .modelopt import QuantizationConfig, is_norm_module
from .output import check_output
from .parallel import Work, in_order
from .quantized import codec_for
from .shards import FLOAT_DTYPES
from .validate import check_checkpoint

# Formats whose quantizer searches with an importance (api.quantize's `importance`); the others ignore one.
USES_IMPORTANCE = ("IQ2_XS", "IQ2_XXS")
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
        if default:
            _known(default, f"--default {default}")
        rules = []
        for rule in layer_rules:
            glob, sep, fmt = rule.rpartition("=")
            if not sep or not glob or not fmt:
                raise ValueError(f"--layer {rule!r}: expected GLOB=FORMAT, e.g. '*.mlp.down_proj=Q8_0'")
            rules.append((glob, _known(fmt, f"--layer {rule!r}")))
        return cls(default, rules, list(keep))

    def format_for(self, prefix: str, shape: tuple[int, ...]) -> str | None:
        return self.rule_for(prefix, shape)[0]

    def rule_for(self, prefix: str, shape: tuple[int, ...]) -> tuple[str | None, str | None]:
        """(format, the option that chose it as the command line spells it: "--default FMT" or
        "--layer 'GLOB=FMT'"), or (None, None) for a module that stays as it is."""
        if len(shape) != 2 or is_norm_module(prefix):
            return None, None
        if any(fnmatch.fnmatchcase(prefix, g) for g in self.keep):
            return None, None
        for glob, fmt in self.rules:
            if fnmatch.fnmatchcase(prefix, glob):
                return fmt, f"--layer '{glob}={fmt}'"
        if _NOT_BY_DEFAULT.search(prefix) or self.default is None:
            return None, None
        return self.default, f"--default {self.default}"

    def check_globs(self, modules: Iterable[str]) -> None:
        """Refuse a --layer / --keep glob that matches no module: a typo would otherwise quantize silently."""
        modules = sorted(set(modules))
        given = [(f"--layer '{g}={f}'", g) for g, f in self.rules] + [(f"--keep '{g}'", g) for g in self.keep]
        for option, glob in given:
            if not any(fnmatch.fnmatchcase(m, glob) for m in modules):
                close = difflib.get_close_matches(glob, modules, n=1, cutoff=0.6)
                hint = f" (closest module: {close[0]!r})" if close else ""
                raise ValueError(f"{option} matches no module of the checkpoint{hint}")


def _known(fmt: str, option: str) -> str:
    try:
        return codec_for(fmt).spec.name
    except ValueError as err:
        raise ValueError(f"{option}: {err}") from None


def side_files(src: Path) -> dict[str, Path]:
    """Files a converted checkpoint carries over unchanged: tokenizer, generation config, chat template..."""
    skip = (INDEX_NAME, "config.json", "hf_quant_config.json")
    return {p.name: p for p in src.iterdir() if p.is_file() and p.suffix != ".safetensors" and p.name not in skip}


def _quantize_layer(where: str, prefix: str, weight: np.ndarray, fmt: str, importance) -> list[tuple[str, np.ndarray]]:
    """One layer's work -> its checkpoint tensors (module level, so a worker process can run it); `where` names
    the file and layer in an error."""
    try:
        qw = quantize(to_float32(weight), fmt, importance=importance)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return list(quantized_tensors(prefix, qw))


def quantize_checkpoint(
    src: str | Path,
    out: str | Path,
    plan: QuantizePlan,
    overwrite: bool = False,
    jobs: int = 1,
    imatrix: str | Path | ImportanceMatrix | None = None,
) -> Path:
    """Read `src` (bf16/fp16/fp32 safetensors, possibly with layers already in b12x formats: layer_choice.py),
    quantize per `plan`, write `out` atomically. `src` is only read.

    `jobs` layers are quantized at once in worker processes (the same bytes as one); `imatrix` is a llama.cpp
    importance matrix (a file, or one read_imatrix read) whose entries weight the IQ2 layers' search.
    """
    src, out = Path(src), Path(out)
    check_output(out, [src], overwrite)  # before minutes of work (and again when writing)
    ckpt = Checkpoint(src)
    check_checkpoint(ckpt)
    choices = choose_layers(ckpt, plan)
    plan.check_globs(name.rpartition(".")[0] for name in ckpt.tensor_names())
    if not any(c.action != "keep" for c in choices.values()):
        raise ValueError(f"{src}: nothing to quantize: the plan's default and rules choose no module to change")
    names = ckpt.tensor_names()
    owned = owned_tensors(ckpt.quantized_layers())

    def choice_of(name: str):
        return choices.get(owned.get(name) or name.removesuffix(".weight"))

    chosen = {p: c.target for p, c in choices.items() if c.action != "keep"}
    importance = importance_for(imatrix, ckpt, chosen) if imatrix is not None else {}

    def work() -> Iterator:  # per tensor: a Work for a worker process, or the tensors to copy as they are
        for name in names:
            choice = choice_of(name)
            if choice is None or choice.action == "keep":
                yield [(name, np.asarray(_finite_input(ckpt, name)))]  # floating as it is, or b12x blocks as stored
            elif name == f"{choice.prefix}.weight":  # a module's other tensors (scales) go with its weight
                if choice.action == "requantize":
                    weight = dequantize(ckpt.quantized_weight(choice.prefix, choice.source))
                else:
                    weight = _finite_input(ckpt, name)
                where = f"{ckpt.file_of(name).path}: layer {choice.prefix!r}"
                args = (where, choice.prefix, weight, choice.target, importance.get(choice.prefix))
                yield Work(_quantize_layer, args, nbytes=weight.nbytes)

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for written in in_order(work(), jobs):
            yield from written

    extra = side_files(src)
    config = dict(ckpt.config)
    config.pop("quantization_config", None)  # replaced by the output's own (save_checkpoint)
    quant = QuantizationConfig(layers={p: c.target for p, c in choices.items()})
    changed = [c for c in choices.values() if c.action != "keep"]
    replaced = sum(1 for n in names if (c := choice_of(n)) is not None and c.action != "keep")
    total = len(names) - replaced + sum(len(codec_for(c.target).spec.required_tensors) for c in changed)
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


def importance_for(imatrix, ckpt: Checkpoint, chosen: dict[str, str], label: str | None = None) -> dict:
    """The imatrix entry [K] of every layer whose format uses one (IQ2); an error names any that is missing.
    `imatrix`: a file or an ImportanceMatrix; `label` names it in errors (default: the file)."""
    widths = {p: ckpt.file_of(f"{p}.weight").shape(f"{p}.weight")[-1] for p in chosen}
    wanted = {p: k for p, k in widths.items() if chosen[p] in USES_IMPORTANCE}
    if not wanted:
        return {}
    matrix = imatrix if isinstance(imatrix, ImportanceMatrix) else read_imatrix(imatrix)
    return module_importance(matrix, ckpt.config, wanted, label or str(imatrix))


def dequantize_checkpoint(src: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """The float twin of a quantized checkpoint: every quantized module decoded exactly, stored as bf16
    (float32 decode rounded once), everything else copied; no quantization_config. `src` is only read."""
    import ml_dtypes

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
