"""The format facts device code needs, in one place: the kernels' format numbering and every block constant
(group sizes, block bytes, field offsets, element tables). C++ and Triton never type them again: `codegen.py`
renders them into `b12x_kernels/csrc/format_facts.h` and `b12x_kernels/format_facts.py` (committed; a test
checks they are current).

Each fact is read from the codec that owns it (its FormatSpec, its class constants), so a format's facts change
in one place. No torch here (b12x_formats imports without it).
"""

from __future__ import annotations

from . import tables
from .elements import E4M3_MAX, E8M0_BIAS
from .quantized import codec_for

# Kernel layout numbers: one per stored layout, families together (e4m3 elements, e2m1 elements, GGML blocks).
# W4A16_NVFP4 stores exactly NVFP4's tensors (only the activation mode differs), so it shares NVFP4's number.
LAYOUTS = ("FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "IQ2_XS")
SAME_LAYOUT = {"W4A16_NVFP4": "NVFP4"}
FORMAT_IDS: dict[str, int] = {name: i for i, name in enumerate(LAYOUTS)}
FORMAT_IDS.update({alias: FORMAT_IDS[target] for alias, target in SAME_LAYOUT.items()})

# Format families, from the specs: raw GGML blocks, and element formats (one value per weight, block scales).
GGML = tuple(name for name in FORMAT_IDS if codec_for(name).spec.packing == "ggml")
ELEMENT = tuple(name for name in FORMAT_IDS if name not in GGML)


def format_id(name: str) -> int:
    """The kernel layout number of a format (name or alias, any case)."""
    return FORMAT_IDS[codec_for(name).spec.name]


def _ggml_facts(name: str) -> list[tuple[str, int]]:
    codec = codec_for(name)
    facts = [(f"{name}_GROUP", codec.spec.group_size), (f"{name}_BYTES", codec.spec.block_bytes),
             (f"{name}_QS_OFFSET", codec.QS_OFFSET)]  # fmt: skip
    if hasattr(codec, "SCALES_OFFSET"):
        facts.append((f"{name}_SCALES_OFFSET", codec.SCALES_OFFSET))
    if codec.grid is not None:
        facts.append((f"{name}_GRID_ENTRIES", len(codec.grid())))
    return facts


def constants() -> list[tuple[str, int | float]]:
    """(NAME, value) of every scalar fact, in the order the generated files list them."""
    facts: list[tuple[str, int | float]] = [(f"FMT_{name}", i) for i, name in enumerate(LAYOUTS)]
    facts += [
        ("FP8_BLOCK_SIZE", codec_for("FP8_BLOCK").spec.group_size),  # 128×128 weight blocks, 1×128 activations
        ("MX_GROUP", codec_for("MXFP8").spec.group_size),
        ("NVFP4_GROUP", codec_for("NVFP4").spec.group_size),
    ]
    for name in GGML:
        facts += _ggml_facts(name)
    facts += [("E8M0_BIAS", E8M0_BIAS), ("E4M3_MAX", float(E4M3_MAX))]
    return facts


E2M1_VALUES = tables.E2M1_VALUES  # magnitudes by code 0..7; bit 3 is the sign


FACTS: dict[str, int | float] = dict(constants())
# The facts Python code in other packages reads directly (the rest reach device code through codegen.py).
FP8_BLOCK_SIZE = FACTS["FP8_BLOCK_SIZE"]
Q8_0_QS_OFFSET = FACTS["Q8_0_QS_OFFSET"]
