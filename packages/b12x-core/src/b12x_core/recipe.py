"""Which activation quantization a prepared op runs with: `activation="auto"` / `act_format="auto"` read the
checkpoint's recipe, and every (format, activation) pair maps to one exact mode (activations.py). Part of plan
construction: prepare_* resolves these before the plan is made.
"""

from __future__ import annotations

import b12x_formats as bf

from .errors import UnsupportedError

AUTO = "auto"
# A checkpoint's own activation recipe for dense layers: FP8 and FP8_BLOCK checkpoints are W8A8, MXFP8 is W8A8
# in MX; NVFP4 with an input_scale is W4A4; everything else keeps bf16 activations.
LINEAR_RECIPE = {"FP8": "fp8", "FP8_BLOCK": "fp8", "MXFP8": "mxfp8"}
# Fused MoE: MXFP4 experts run MXFP8 activations (the recipe of MXFP4 MoE checkpoints), NVFP4 with an
# input_scale NVFP4 activations, the rest bf16.
MOE_RECIPE = {"MXFP4": "mxfp8"}


def _recipe(fmt: str, requested: str, has_input_scale: bool, table: dict) -> str:
    if requested != AUTO:
        return requested
    name = bf.spec(fmt).name
    if name == "NVFP4" and has_input_scale:
        return "nvfp4"
    return table.get(name, "bf16")


def linear_activation(fmt: str, requested: str, has_input_scale: bool) -> str:
    return _recipe(fmt, requested, has_input_scale, LINEAR_RECIPE)


def moe_act_format(fmt: str, requested: str, has_input_scale: bool) -> str:
    return _recipe(fmt, requested, has_input_scale, MOE_RECIPE)


def activation_mode(fmt: str, activation: str, has_input_scale: bool) -> str:
    """The activation quantization a format × activation pair runs with (see activations.py)."""
    spec = bf.spec(fmt)
    if activation not in spec.activations:
        raise UnsupportedError(f"{spec.name} weights run with activations {list(spec.activations)}, not {activation!r}")
    if activation == "bf16" or activation == "mxfp8":
        return activation
    if activation == "fp8":
        if spec.name == "FP8_BLOCK":
            return "fp8_group128"
        return "fp8_static" if has_input_scale else "fp8_token"
    if activation == "nvfp4":
        if not has_input_scale:
            raise UnsupportedError(f"{spec.name} with nvfp4 activations needs the checkpoint's input_scale")
        return "nvfp4"
    raise UnsupportedError(f"{spec.name}: unknown activation {activation!r}")
