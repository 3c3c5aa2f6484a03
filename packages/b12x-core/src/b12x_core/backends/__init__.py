"""Every backend b12x_core can run, in order of preference where no measurement decides (the conservative default
plan). A new backend is one module with a `Backend` subclass and one line here; see docs/architecture.md."""

from __future__ import annotations

from .base import Backend, Config, DeviceInfo, MoEShape, Overrides, Query
from .block_scaled_mma import BlockScaledMma
from .block_scaled_mma_moe import BlockScaledMmaMoE
from .cublas import BlockScaledMM, DequantGemm, ScaledMM
from .cuda_gemv import CudaGemv
from .cutlass_sm90 import CutlassSm90, CutlassSm90Checkpoint
from .cutlass_sm90_moe import CutlassSm90MoE
from .embedding import CudaEmbeddingQ8_0
from .fragment_mma import FragmentMma
from .reference import ReferenceEmbedding, ReferenceLinear, ReferenceMoE
from .tensor_core import TensorCoreGemm
from .tensor_core_moe import TensorCoreMoE, TensorCoreMoEWgmma
from .tensor_core_wgmma import TensorCoreWgmma
from .triton_moe import TritonMoE
from .triton_tiles import TritonTiles

REGISTRY: tuple[type[Backend], ...] = (
    # SM12x only (elsewhere it declines): its quantized-activation pairs on the block-scaled mma.sync, first at every
    # token count while nothing is measured there (its first prepare probes the instruction; block_scaled/probe.py)
    BlockScaledMma,
    TensorCoreGemm,
    CudaGemv,
    ScaledMM,
    BlockScaledMM,
    DequantGemm,
    TritonTiles,
    TensorCoreWgmma,  # after the others: chosen only where measurements (timings.json) say it is faster
    CutlassSm90,  # likewise
    CutlassSm90Checkpoint,  # likewise
    FragmentMma,  # likewise: the few-token calls on CutlassSm90's copy
    # SM12x only, like BlockScaledMma: the MoE pairs with a block-scaled mode (NVFP4 × nvfp4, MXFP4 × mxfp8)
    BlockScaledMmaMoE,
    # First where nothing is measured (an SM12x GPU, whose mma.sync kernels are the ones measured on SM90 as their
    # proxy): on SM90 it ran faster than the Triton MoE at every measured token count, format and shape
    # (timings.json; `python benchmarks/moe.py --backends tensor_core_moe,triton_moe`). The Triton MoE runs what
    # it cannot (no CUDA extension, the interpreter).
    TensorCoreMoE,
    TritonMoE,
    TensorCoreMoEWgmma,  # after the others: chosen only where the measured MoE table says it is faster
    CutlassSm90MoE,  # likewise
    CudaEmbeddingQ8_0,
    ReferenceLinear,
    ReferenceMoE,
    ReferenceEmbedding,
)


def for_op(op: str) -> tuple[type[Backend], ...]:
    return tuple(cls for cls in REGISTRY if cls.op == op)


__all__ = ["REGISTRY", "Backend", "Config", "DeviceInfo", "MoEShape", "Overrides", "Query", "for_op"]
