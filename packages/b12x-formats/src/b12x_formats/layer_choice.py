"""What `quantize` does to each module of its input, floating-point or already (partly) quantized.

A module the input stores in a b12x format (a converted GGUF's Q8_0 embedding, a layer of an earlier
`quantize`) is kept byte for byte: decoding and re-encoding would only add error. It changes only when a
`--layer` rule names it with another format; then it is decoded exactly and quantized again, and the summary
says so. `--keep` keeps it as stored; `--default` applies to floating-point modules only. Floating-point
modules follow the plan's rules as for a float checkpoint (hf_quantize.QuantizePlan).
"""

from __future__ import annotations

import fnmatch
import os
import re
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
    checkpoint.Checkpoint, `plan` a hf_quantize.QuantizePlan. Raises ValueError when K does not fit the chosen
    format, naming the rule, the modules it hits and one glob that gives them all another format."""
    stored = ckpt.quantized_layers()
    choices: dict[str, LayerChoice] = {}
    misfits: dict[str, list[tuple[str, int, str | None]]] = {}  # rule -> (prefix, K, source format)
    rules: dict[str, str] = {}  # prefix -> the rule that chose its format
    for prefix, source in stored.items():
        target, rule = _rule_for_quantized(prefix, source, plan)
        k = ckpt.quantized_weight(prefix, source).shape[-1]
        if target != source and k % codec_for(target).spec.k_multiple:
            misfits.setdefault(rule, []).append((prefix, k, source))
        choices[prefix], rules[prefix] = LayerChoice(prefix, source, target), rule
    owned = owned_tensors(stored)
    for name in ckpt.tensor_names():
        if name in owned or not name.endswith(".weight"):
            continue
        prefix = name[: -len(".weight")]
        shape = ckpt.file_of(name).shape(name)
        target, rule = plan.rule_for(prefix, shape)
        if target is None:
            continue
        if shape[-1] % codec_for(target).spec.k_multiple:
            misfits.setdefault(rule, []).append((prefix, shape[-1], None))
        choices[prefix], rules[prefix] = LayerChoice(prefix, None, target), rule
    if misfits:
        rule, hit = next(iter(misfits.items()))
        others = sum(len(v) for v in misfits.values()) - len(hit)
        raise ValueError(_misfit_message(rule, hit, choices, rules, others, bool(plan.rules)))
    return choices


def owned_tensors(stored: dict[str, str]) -> dict[str, str]:
    """Checkpoint tensor name -> the quantized module prefix it belongs to."""
    return {f"{p}.{t}": p for p, f in stored.items() for t in codec_for(f).spec.tensor_names}


def _rule_for_quantized(prefix: str, source: str, plan) -> tuple[str, str | None]:
    if any(fnmatch.fnmatchcase(prefix, g) for g in plan.keep):
        return source, None
    for glob, fmt in plan.rules:
        if fnmatch.fnmatchcase(prefix, glob):
            return fmt, f"--layer '{glob}={fmt}'"
    return source, None


# What a module whose K misses a format's group is offered instead, in this order (the first whose group divides it)
_FALLBACKS = ("NVFP4", "MXFP4", "Q8_0", "FP8")


def _misfit_message(rule: str, hit: list, choices: dict, rules: dict, others: int, layer_rules: bool) -> str:
    """One line: the rule, how many modules it gives a format their K does not fit, and one rule that fixes them."""
    fmt = choices[hit[0][0]].target
    multiple = codec_for(fmt).spec.k_multiple
    prefixes = [prefix for prefix, _, _ in hit]
    ks = sorted({k for _, k, _ in hit})
    fits = [f for f in _FALLBACKS if f != fmt and all(k % codec_for(f).spec.k_multiple == 0 for k in ks)]
    fine = [p for p, r in rules.items() if r == rule and p not in set(prefixes)]  # the rule's modules that fit
    glob = covering_glob(prefixes, fine)
    if rule.startswith("--default"):
        where = " after the other --layer rules" if layer_rules else ""
    else:
        where = f" before {rule}"
    many = len(hit) > 1
    where_hit = f"{len(hit)} modules ({prefixes[0]}, ...)" if many else prefixes[0]
    instead = fits[0] if fits else "FMT"
    text = (
        f"{rule}: K={'/'.join(map(str, ks))} is not a multiple of {multiple}, the group size of {fmt}, in "
        f"{where_hit}; give {'them all' if many else 'it'} another format with one rule{where}: "
        f"--layer '{glob}={instead}'"
    )
    kept = [p for p in choices if p not in set(prefixes)]
    if not any(fnmatch.fnmatchcase(p, glob) for p in kept):
        how = "as stored" if {source for _, _, source in hit} != {None} else "in floating point"
        text += f", or keep {'them' if many else 'it'} {how} with --keep '{glob}'"
    if others:
        text += f" ({others} more modules under other rules miss their format's group too)"
    return text


def covering_glob(names: list[str], avoid: list[str]) -> str:
    """One glob, as short as can be, that matches every name of `names` and none of `avoid`: the module itself for
    one; else the names' longest common dotted prefix + ".*" (model.layers.*); else the names with layer numbers
    folded (model.layers.*.mlp.gate_proj); else the names part by part, differing parts as "*" or, where "*" would
    also match a name to avoid, as a class of their first letters and their common ending ([gu]*_proj). When no
    such glob separates them, the last form, which matches every name."""
    if len(names) == 1:
        return names[0]

    def separates(glob: str) -> bool:
        return all(fnmatch.fnmatchcase(n, glob) for n in names) and not any(fnmatch.fnmatchcase(a, glob) for a in avoid)

    split = [n.split(".") for n in names]
    common = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    candidates = [".".join(common) + ".*"] if common else []
    folded = {re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n) for n in names}
    if len(folded) == 1:
        candidates.append(folded.pop())
    for glob in candidates:
        if separates(glob):
            return glob
    if len({len(s) for s in split}) != 1:
        return candidates[0] if candidates else "*"
    columns = [sorted(set(parts)) for parts in zip(*split, strict=False)]
    star = [c[0] if len(c) == 1 else "*" for c in columns]
    glob = ".".join(star)
    for i in reversed(range(len(columns))):  # narrow the last differing parts first
        if separates(glob) or len(columns[i]) == 1:
            continue
        star[i] = _letters(columns[i])
        glob = ".".join(star)
    return glob


def _letters(words: list[str]) -> str:
    """A glob for exactly these words' kind: their first letters as a class, then "*", then their common ending."""
    ending = os.path.commonprefix([w[::-1] for w in words])[::-1]
    ending = ending[: min(len(w) for w in words) - 1] if ending else ""
    first = sorted({w[0] for w in words})
    head = first[0] if len(first) == 1 else f"[{''.join(first)}]"
    return f"{head}*{ending}"


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
