"""Programmatic dependent launch (PDL) of the CUDA kernel families (b12x_kernels' csrc/launch.cuh): on SM90 and SM12x
a kernel may start while the one before it in the stream finishes, so its launch, its setup and its first weight
copies overlap that kernel's tail. Every kernel reads only its argument block and its weights before it waits for its
predecessor, so results are the same bit for bit, in CUDA graphs too (tests/kernels/test_pdl.py).

Off unless `B12X_PDL=1`, read when a plan packs its kernels' argument blocks: a Llama-3.1-8B layer's four linears
back to back ran faster with it in IQ2_XS and about the same in NVFP4 and FP8 (`python benchmarks/mma_linear.py
--model 8b --pdl-ab`), but a whole 8B decode step ran slightly slower in NVFP4 and the same in FP8: in a model most
linears follow a torch kernel, which never lets its successor start early. The measured tables (timings.json) were
taken without it, so the plans stay consistent with what runs.
"""

from __future__ import annotations

import os


def enabled() -> int:
    """1 when the argument blocks packed now ask for programmatic dependent launch (B12X_PDL=1), else 0."""
    return 1 if os.environ.get("B12X_PDL", "0").strip() == "1" else 0
