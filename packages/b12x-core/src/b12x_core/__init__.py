"""b12x torch ops: prepare/run lifecycle, dispatch and the exact CPU reference.

`import b12x_core` registers torch.ops.b12x.{linear, moe, embedding, route_topk}.
"""

from . import ops  # noqa: F401  (registers torch.ops.b12x.*)
from .activations import quantize_activation
from .capabilities import capabilities, explain
from .embedding import PreparedEmbedding, embedding, prepare_embedding
from .errors import UnsupportedError
from .linear import PreparedLinear, linear, prepare_linear
from .moe import MOE_FORMATS, PreparedMoE, moe, prepare_moe, route_topk, shard_moe_weights
from .tied import prepare_tied_linear
from .weights import input_scale_of

__version__ = "0.1.0"

__all__ = [
    "MOE_FORMATS",
    "PreparedEmbedding",
    "PreparedLinear",
    "PreparedMoE",
    "UnsupportedError",
    "capabilities",
    "embedding",
    "explain",
    "input_scale_of",
    "linear",
    "moe",
    "prepare_embedding",
    "prepare_linear",
    "prepare_moe",
    "prepare_tied_linear",
    "quantize_activation",
    "route_topk",
    "shard_moe_weights",
]
