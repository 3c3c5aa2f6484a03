"""Programmatic dependent launch (PDL) of the CUDA kernel families (b12x_kernels' csrc/launch.cuh): on SM90 and SM12x
a kernel may start while the one before it in the stream finishes, so its launch, its setup and its first weight
copies overlap that kernel's tail, which is a large share of a decode-sized call. Every kernel reads only its plan and
its weights before it waits for its predecessor, so results are the same bit for bit, in CUDA graphs too.

`B12X_PDL=0`, read when a plan packs its kernels' argument blocks, launches them plainly: the A/B switch of the
benchmarks, and a way out should a driver refuse programmatic launches in a graph.
"""

from __future__ import annotations

import os


def enabled() -> int:
    """1 when the argument blocks packed now ask for programmatic dependent launch (the default), 0 with B12X_PDL=0."""
    return 0 if os.environ.get("B12X_PDL", "1").strip() == "0" else 1
