"""The plugin's one setting."""

from __future__ import annotations

import os


def moe_fp4_force_a16() -> bool:
    """VLLM_B12X_MOE_FP4_FORCE_A16=1: run MXFP4 / NVFP4 MoE with bf16 activations."""
    value = os.environ.get("VLLM_B12X_MOE_FP4_FORCE_A16", "0").strip().lower()
    if value not in ("0", "1", "true", "false", ""):
        raise ValueError(f"VLLM_B12X_MOE_FP4_FORCE_A16 must be 0 or 1, got {value!r}")
    return value in ("1", "true")
