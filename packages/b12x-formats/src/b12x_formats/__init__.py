"""b12x-formats: weight formats, exact quantize/dequantize, ModelOpt checkpoints and GGUF import.

numpy-only at import time; torch tensors are accepted wherever arrays are.
"""

from . import modelopt
from .api import dequantize, formats, per_tensor_names, quantize, spec, tensor_shapes
from .quantized import QuantizedWeight, check_layout
from .slicing import concat_rows, slice_weight
from .spec import PER_TENSOR, FormatSpec, TensorSpec

__version__ = "0.1.0"

FORMATS = formats()

__all__ = [
    "FORMATS",
    "PER_TENSOR",
    "FormatSpec",
    "QuantizedWeight",
    "TensorSpec",
    "check_layout",
    "concat_rows",
    "dequantize",
    "modelopt",
    "per_tensor_names",
    "quantize",
    "slice_weight",
    "spec",
    "tensor_shapes",
]
