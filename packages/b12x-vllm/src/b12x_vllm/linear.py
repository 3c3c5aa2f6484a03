"""Linear layers and the Q8_0 vocabulary embedding, run by b12x_core.

Each checkpoint tensor becomes a vLLM parameter in its own units (packed bytes, blocks, block scales), so
vLLM's loaders place fused shards and tensor-parallel slices; per-tensor scales get one slot per fused
shard. After loading, the parameters become b12x_formats QuantizedWeights (one per shard where shards carry
their own scales) and `bc.prepare_linear` prepares them. The parameters stay, so re-loading weights writes
to the same addresses and is prepared again.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, register_weight_loader_v2_supported_method
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.parameter import BlockQuantScaleParameter, ModelWeightParameter, PerTensorScaleParameter

import b12x_core as bc
import b12x_formats as bf

from . import report
from ._params import is_per_tensor, max_tokens_from_vllm, quantized_shards, tensor_layout
from ._reload import keep_addresses
from .tied import ties_embeddings


def register_tensors(layer, fmt: str, n: int, k: int, shards: int, weight_loader, prefix: str) -> None:
    spec = bf.spec(fmt)
    if k % spec.k_multiple:
        raise ValueError(f"b12x: {prefix} is {fmt} but its K per rank ({k}) is not a multiple of {spec.k_multiple}")
    for name, (shape, dtype) in tensor_layout(fmt, (), n, k).items():
        if is_per_tensor(shape):
            # NaN marks "not in the checkpoint" (input_scale is optional)
            param = PerTensorScaleParameter(
                data=torch.full((shards,), float("nan"), dtype=torch.float32), weight_loader=weight_loader
            )
        elif fmt == "FP8_BLOCK" and name == "weight_scale_inv":
            param = BlockQuantScaleParameter(
                data=torch.empty(shape, dtype=dtype), input_dim=1, output_dim=0, weight_loader=weight_loader
            )
            layer.weight_block_size = [128, 128]  # vLLM's loader converts shard offsets to block rows
        else:
            param = ModelWeightParameter(
                data=torch.empty(shape, dtype=dtype), input_dim=1, output_dim=0, weight_loader=weight_loader
            )
        layer.register_parameter(name, param)


@register_weight_loader_v2_supported_method
class B12xLinearMethod(LinearMethodBase):
    def __init__(self, fmt: str, prefix: str):
        self.format, self.prefix = fmt, prefix

    def create_weights(
        self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size, params_dtype, **extra
    ):
        layer.b12x_partitions = list(output_partition_sizes)
        register_tensors(
            layer, self.format, sum(output_partition_sizes), input_size_per_partition, len(output_partition_sizes),
            extra["weight_loader"], self.prefix,
        )  # fmt: skip

    def process_weights_after_loading(self, layer) -> None:
        params = {name: getattr(layer, name).data for name in bf.spec(self.format).tensor_names}
        shards = quantized_shards(self.format, params, layer.b12x_partitions)
        prepared = bc.prepare_linear(  # activations: the checkpoint's recipe, read by b12x_core's plan construction
            shards, device=layer.weight.device, max_tokens=max_tokens_from_vllm(), activation="auto"
        )
        layer.b12x_linear = keep_addresses(getattr(layer, "b12x_linear", None), prepared)
        report.record(self.prefix, layer.b12x_linear)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return bc.linear(x, layer.b12x_linear, bias)


class B12xEmbeddingMethod(QuantizeMethodBase):
    """Q8_0 `VocabParallelEmbedding` (and, when tied, the LM head that reuses its bytes: tied.py)."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def create_weights(
        self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size, params_dtype, **extra
    ):
        register_tensors(
            layer, "Q8_0", sum(output_partition_sizes), input_size_per_partition, 1, extra["weight_loader"],
            self.prefix or "embed_tokens",
        )  # fmt: skip

    def process_weights_after_loading(self, layer) -> None:
        qw = bf.QuantizedWeight.from_tensors("Q8_0", {"weight": layer.weight.data})
        embedding = bc.prepare_embedding(qw, device=layer.weight.device)
        layer.b12x_embedding = keep_addresses(getattr(layer, "b12x_embedding", None), embedding)
        report.record(self.prefix or "embed_tokens", layer.b12x_embedding)
        if ties_embeddings(layer):  # the LM head reads these bytes too, as a linear layer (tied.py)
            prepared = bc.prepare_tied_linear(layer.b12x_embedding, max_tokens=max_tokens_from_vllm())
            layer.b12x_linear = keep_addresses(getattr(layer, "b12x_linear", None), prepared)
            report.record("lm_head (tied to " + (self.prefix or "embed_tokens") + ")", layer.b12x_linear)

    def embedding(self, layer, input_: torch.Tensor) -> torch.Tensor:
        return bc.embedding(input_, layer.b12x_embedding)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return bc.linear(x, layer.b12x_linear, bias)
