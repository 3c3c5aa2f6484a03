"""What `quantize` does to each module of its input, floating-point or already (partly) quantized.

A module the input stores in a b12x format (a converted GGUF's Q8_0 embedding, a layer of an earlier
`quantize`) is kept byte for byte: decoding and re-encoding would only add error. It changes only when a
`--layer` rule names it with another format; then it is decoded exactly and quantized again, and the summary
says so. `--keep` keeps it as stored; `--default` applies to floating-point modules only. Floating-point
modules follow the plan's rules as for a float checkpoint (hf_quantize.QuantizePlan).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass

from .quantized import codec_for


@dataclass(frozen=True)
class LayerChoice:
    prefix: str
    source: str | None  # the input's format; None: floating point
    target: str  # the output's format

    @property
    def action(self) -> str:
        if self.source is None:
            return "quantize"
        return "keep" if self.source == self.target else "requantize"


def choose_layers(ckpt, plan) -> dict[str, LayerChoice]:
    """Module prefix -> LayerChoice for every module the output stores quantized. `ckpt` is a
    checkpoint.Checkpoint, `plan` a hf_quantize.QuantizePlan. Raises ValueError naming the module and rule when
    K does not fit the chosen format."""
    stored = ckpt.quantized_layers()
    choices: dict[str, LayerChoice] = {}
    for prefix, source in stored.items():
        target = _rule_for_quantized(prefix, source, plan)
        if target != source:
            _check_k(prefix, ckpt.quantized_weight(prefix, source).shape[-1], target, source)
        choices[prefix] = LayerChoice(prefix, source, target)
    owned = owned_tensors(stored)
    for name in ckpt.tensor_names():
        if name in owned or not name.endswith(".weight"):
            continue
        prefix = name[: -len(".weight")]
        shape = ckpt.file_of(name).shape(name)
        target = plan.format_for(prefix, shape)
        if target is not None:
            _check_k(prefix, shape[-1], target, None)
            choices[prefix] = LayerChoice(prefix, None, target)
    return choices


def owned_tensors(stored: dict[str, str]) -> dict[str, str]:
    """Checkpoint tensor name -> the quantized module prefix it belongs to."""
    return {f"{p}.{t}": p for p, f in stored.items() for t in codec_for(f).spec.tensor_names}


def _rule_for_quantized(prefix: str, source: str, plan) -> str:
    if any(fnmatch.fnmatchcase(prefix, g) for g in plan.keep):
        return source
    for glob, fmt in plan.rules:
        if fnmatch.fnmatchcase(prefix, glob):
            return fmt
    return source


def _check_k(prefix: str, k: int, fmt: str, source: str | None) -> None:
    multiple = codec_for(fmt).spec.k_multiple
    if k % multiple:
        keep = f"keep its {source} with --keep '{prefix}'" if source else "keep it with --keep"
        raise ValueError(
            f"{prefix}: K={k} is not a multiple of {multiple}, the group size of {fmt}; "
            f"choose another format for it with --layer '{prefix}=FMT' or {keep}"
        )


def summary(choices: dict[str, LayerChoice]) -> str:
    """A few lines: how many modules were quantized, kept byte-exact and re-quantized, per format, and which
    modules were decoded and re-quantized."""

    def counts(action: str, key) -> str:
        c = Counter(key(x) for x in choices.values() if x.action == action)
        return ", ".join(f"{fmt} {n}" for fmt, n in sorted(c.items())) or "none"

    lines = [
        f"quantized from floating point: {counts('quantize', lambda x: x.target)}",
        f"kept byte-exact: {counts('keep', lambda x: x.source)}",
    ]
    requantized = [x for x in choices.values() if x.action == "requantize"]
    if requantized:
        lines.append(f"decoded and re-quantized ({len(requantized)}), as a --layer rule asked:")
        lines += [f"  {x.prefix}: {x.source} -> {x.target}" for x in requantized]
    return "\n".join(lines)
