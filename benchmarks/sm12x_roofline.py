"""The SM12x roofline: the speed-up each linear mode could have over bf16 on the RTX 5090, the RTX PRO 6000 and the
DGX Spark, worked out on paper from the cards' published rates (docs/results/sm12x_cards.json). A model, not a
measurement: nothing here has run on those GPUs. performance_page.py renders it as a section of docs/performance.md.

The model, per linear of a Llama-3.1-8B decoder layer (plan_check.MODELS["8b"]: qkv, o, gate_up, down) and summed:

    time(M) = max(weight bytes / bandwidth, 2·M·N·K / tensor rate)

- bf16: the bf16 path (cuBLAS), 2 bytes a weight at the bf16 rate.
- A mode "today": its format's bits per weight (b12x_formats spec.bits_per_weight) at the rate of the path the plan
  picks for that M on the card (plan.choose on its DeviceInfo): every b12x SM12x kernel decodes both operands to bf16
  and multiplies in bf16 mma.sync, so the bf16 rate, except where the plan picks torch's FP8 GEMM (scaled_mm,
  block_scaled_mm), whose operands stay FP8: the fp8 rate.
- The same mode "native": on the block-scaled MMA of SM12x: the fp8 rate for FP8 × fp8 (E4M3 mma.sync) and the
  mxfp8 modes (kind::mxf8f6f4), the fp4 rate for NVFP4 × nvfp4 (kind::mxf4nvf4); modes with bf16 activations have
  no such path.

Left out, and so favouring every quantized mode alike: activations and outputs (bytes and their quantization), the
decode's own instructions, kernel launches, partial waves and tails; peak rates and bandwidth are taken as reached.
A card's null tensor rate (not published) gives a time only where the linear is bandwidth-bound even at the card's
FP32 CUDA-core rate, a floor no tensor-core path falls below; elsewhere the cell is unknown.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import plan_check
import torch

import b12x_formats as bf
from b12x_core import plan
from b12x_core.backends import DeviceInfo, Query
from b12x_core.recipe import activation_mode

KIND = "sm12x_roofline"  # the "kind" of a cards file (docs/results/sm12x_cards.json)
MS = (1, 128, 4096)
LAYER = plan_check.MODELS["8b"]  # name -> (N, K)
MAX_TOKENS = max(MS)
FP8_GEMMS = ("scaled_mm", "block_scaled_mm")  # torch's cuBLASLt FP8 GEMMs: FP8 operands, the fp8 rate
NATIVE = {"fp8_static": "fp8", "fp8_token": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}  # mode -> the native MMA's rate


def is_cards(saved: dict) -> bool:
    return saved.get("kind") == KIND


@dataclass(frozen=True)
class Row:
    label: str  # plan_check.label: "NVFP4 × nvfp4"
    bits: float  # bits per weight
    today: tuple[float | None, ...]  # speed-up over bf16 per MS (None: unknown, a rate not published)
    native: tuple[float | None, ...] | None  # the same on the native block-scaled MMA; None: the mode has none


def device(card: dict) -> DeviceInfo:
    """What the plan knows of the card: its capability and SMs; SM12x's 99 KB of shared memory a block; torch's
    block-scaled FP8 GEMM is verified on SM90 only (backends/base.py)."""
    why = "cuBLASLt's block-scaled FP8 GEMM is verified on sm_90 only"
    return DeviceInfo(torch.device("cuda", 0), tuple(card["capability"]), card["sms"], 99, block_scaled_mm=why,
                      name=card["name"])  # fmt: skip


def linear_us(card: dict, n: int, k: int, m: int, bits: float, rate: str) -> float | None:
    """µs of one linear: max(weight bytes / bandwidth, 2·M·N·K / rate); None where the rate is unknown and the
    linear is not bandwidth-bound even at the card's FP32 rate."""
    memory = n * k * bits / 8 / (card["bandwidth_gbs"]["value"] * 1e3)  # bytes / (GB/s) in µs
    flops = 2 * m * n * k
    tflops = card[f"{rate}_tflops"]["value"]
    if tflops is None:
        floor = flops / (card["fp32_tflops"]["value"] * 1e6)
        return memory if floor <= memory else None
    return max(memory, flops / (tflops * 1e6))


@contextlib.contextmanager
def _quiet():
    """The plan says once where this install has no CUDA kernels; the card asked about is not here, so that says
    nothing about it."""
    logger = logging.getLogger("b12x_core")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def today_rate(info: DeviceInfo, fmt: str, activation: str, scaled: bool, n: int, k: int, m: int) -> str:
    """The rate of the path the plan picks for a call of m tokens on the card: fp8 for torch's FP8 GEMMs, else
    bf16 (every b12x SM12x kernel multiplies in bf16)."""
    mode = activation_mode(fmt, activation, scaled)
    query = Query("linear", fmt, activation, mode, info, "auto", n, k, MAX_TOKENS, (n,))
    with _quiet():
        _, _, decisions = plan.choose(query)
    backend = next(d.backend.name for d in decisions if d.lo <= m <= d.hi)
    return "fp8" if backend in FP8_GEMMS else "bf16"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def rows(card: dict) -> list[Row]:
    info = device(card)
    out = []
    for fmt, activation, scaled in plan_check.PAIRS:
        bits, mode = bf.spec(fmt).bits_per_weight, activation_mode(fmt, activation, scaled)
        today, native = [], []
        for m in MS:
            bf16 = _sum(card, m, 16, lambda n, k: "bf16")
            now = _sum(card, m, bits, lambda n, k: today_rate(info, fmt, activation, scaled, n, k, m))
            today.append(_ratio(bf16, now))
            if mode in NATIVE:
                native.append(_ratio(bf16, _sum(card, m, bits, lambda n, k: NATIVE[mode])))
        out.append(
            Row(plan_check.label(fmt, activation, scaled), bits, tuple(today), tuple(native) if native else None)
        )
    return out


def _sum(card: dict, m: int, bits: float, rate_of) -> float | None:
    """µs of the layer's four linears at m tokens; rate_of(n, k) names each one's rate; None if any is unknown."""
    times = [linear_us(card, n, k, m, bits, rate_of(n, k)) for n, k in LAYER.values()]
    return None if None in times else sum(times)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _rates(card: dict) -> str:
    def tflops(key):
        value = card[f"{key}_tflops"]["value"]
        return "not published" if value is None else f"{value:,.0f}"

    return (f"{card['bandwidth_gbs']['value']:,} GB/s; dense TFLOPS bf16 {tflops('bf16')}, fp8 {tflops('fp8')}, "
            f"fp4 {tflops('fp4')}")  # fmt: skip


def section(saved: dict, path: str) -> list[str]:
    """The page's section: the model in words, then a table per card."""
    name = path.rsplit("/", 1)[-1]
    head = " | ".join(f"M={m} today | M={m} native" for m in MS)
    out = [
        "## SM12x roofline (a model, not a measurement)",
        "",
        "No b12x kernel has run on an SM120 or SM121 GPU yet; this is what the cards' published rates",
        f"([`{name}`](results/{name}), each number with its source) say each mode could gain over bf16 on a",
        "Llama-3.1-8B decoder layer's four linears (`benchmarks/sm12x_roofline.py`). Per linear,",
        "time(M) = max(weight bytes / bandwidth, 2·M·N·K / tensor rate), summed over the layer; each cell is the bf16",
        "path's time (2 bytes a weight at the bf16 rate) over the mode's (its format's bits per weight).",
        "",
        "- **today**: at the rate of the path the plan picks on the card at that M. Every b12x SM12x kernel decodes",
        "  both operands to bf16 and multiplies in bf16 `mma.sync`, so the bf16 rate, except where the plan picks",
        "  torch's FP8 GEMM (`scaled_mm`), whose operands stay FP8: the fp8 rate.",
        "- **native**: on SM12x's block-scaled MMA: the fp8 rate for FP8 × fp8 (E4M3 `mma.sync`) and the mxfp8 modes",
        "  (`kind::mxf8f6f4`), the fp4 rate for NVFP4 × nvfp4 (`kind::mxf4nvf4`); · where the mode has none (bf16",
        "  activations, FP8_BLOCK's 128-wide scales).",
        "- Assumed: peak rates and bandwidth reached; activations, outputs, the decode's own instructions, launches",
        "  and tails cost nothing (which flatters the quantized modes); rates are dense with FP32 accumulation.",
        "  A rate no source publishes (—) leaves a cell unknown unless the linear is bandwidth-bound even at the",
        "  card's FP32 CUDA-core rate.",
        "",
    ]
    for card in saved["cards"]:
        out += [f"### {card['name']} (model)", "", f"Inputs: {_rates(card)}.", ""]
        out.append(f"| format × activations | bits/weight | {head} |")
        out.append("|---|---:|" + "---:|---:|" * len(MS))
        for row in rows(card):
            cells = []
            for i in range(len(MS)):
                cells += [_cell(row.today[i]), "·" if row.native is None else _cell(row.native[i])]
            out.append(f"| {row.label} | {row.bits:.2f} | " + " | ".join(cells) + " |")
        out.append("")
    return out
