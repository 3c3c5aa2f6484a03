"""Fused MoE (tensor parallel only) run by b12x_core.

Experts are loaded per (expert, projection) by `weight_loader` (vLLM's expert mapping calls it with
shard ids w1 = gate, w3 = up, w2 = down), slicing this rank's part of the intermediate dimension on whole
quantization blocks. Per-tensor scales get one slot per expert and projection; gate and up stay separate
QuantizedWeights so each keeps its own scales exactly.
"""

from __future__ import annotations

import logging

import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.parameter import ModelWeightParameter

import b12x_core as bc
import b12x_formats as bf

from . import report
from ._params import is_per_tensor, max_tokens_from_vllm, quantized_shards, tensor_layout
from ._reload import keep_addresses
from .env import moe_fp4_force_a16

logger = logging.getLogger("b12x_vllm")
# 4-bit element formats (VLLM_B12X_MOE_FP4_FORCE_A16 applies to them), from the format specs
FP4 = tuple(f for f in bf.FORMATS if bf.spec(f).packing is None and bf.spec(f).bits_per_weight < 5)


class B12xMoEMethod(FusedMoEMethodBase):
    def __init__(self, fmt: str, moe_config, prefix: str):
        super().__init__(moe_config)
        self.format, self.prefix = fmt, prefix
        parallel = moe_config.moe_parallel_config
        if getattr(parallel, "use_ep", False) or getattr(parallel, "ep_size", 1) > 1:
            raise ValueError("b12x MoE: expert parallelism / expert maps are not supported; use tensor parallelism")
        if moe_config.activation not in (MoEActivation.SILU, MoEActivation.RELU2_NO_MUL) or moe_config.has_bias:
            raise ValueError(f"b12x MoE {prefix}: needs bias-free SiLU or ReLU², got {moe_config.activation}")
        if fmt not in bc.MOE_FORMATS:
            raise ValueError(f"b12x MoE {prefix}: {fmt} experts are not supported")
        self.gated = moe_config.activation == MoEActivation.SILU

    # --- weights -------------------------------------------------------------------------------------------
    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra):
        inter = intermediate_size_per_partition
        projections = {"w13": (2 if self.gated else 1, inter, hidden_size), "w2": (1, hidden_size, inter)}
        for role, (parts, n, k) in projections.items():
            k_multiple = bf.spec(self.format).k_multiple
            if k % k_multiple:
                raise ValueError(f"b12x MoE {self.prefix}: {role} K={k} per rank is not a multiple of {k_multiple}")
            for name, (shape, dtype) in tensor_layout(self.format, (num_experts,), n * parts, k).items():
                if is_per_tensor(shape):
                    data = torch.full((num_experts, parts), float("nan"), dtype=torch.float32)
                else:
                    data = torch.empty(shape, dtype=dtype)
                param = ModelWeightParameter(data=data, input_dim=2, output_dim=1, weight_loader=self.weight_loader)
                param.b12x_role, param.b12x_tensor = role, name
                layer.register_parameter(f"{role}_{name}", param)
        layer.b12x_inter = inter

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        if shard_id not in ("w1", "w2", "w3") or (shard_id == "w3" and not self.gated):
            raise ValueError(f"b12x MoE {self.prefix}: unexpected projection {shard_id} for {weight_name}")
        if not 0 <= expert_id < param.shape[0]:
            raise ValueError(f"b12x MoE {self.prefix}: expert {expert_id} out of range for {weight_name}")
        tp_rank, tp_size = self.moe.tp_rank, self.moe.tp_size
        slot = param.data[expert_id]
        if param.b12x_tensor in bf.per_tensor_names(self.format):
            index = {"w1": 0, "w3": 1, "w2": 0}[shard_id]
            slot[index] = loaded_weight.reshape(-1)[0]
        elif shard_id == "w2":  # down: this rank's columns (dim 1, in the tensor's own units)
            cols = slot.shape[1]
            if loaded_weight.shape[1] != cols * tp_size:
                raise ValueError(f"b12x MoE: {weight_name} {list(loaded_weight.shape)} does not split into {tp_size}")
            slot.copy_(loaded_weight.narrow(1, tp_rank * cols, cols))
        else:  # gate (w1) / up (w3): this rank's rows
            rows = self.moe.intermediate_size_per_partition
            if loaded_weight.shape[0] != rows * tp_size:
                raise ValueError(f"b12x MoE: {weight_name} {list(loaded_weight.shape)} does not split into {tp_size}")
            offset = 0 if shard_id == "w1" else rows
            slot.narrow(0, offset, rows).copy_(loaded_weight.narrow(0, tp_rank * rows, rows))
        return True if return_success else None

    def _quantized(self, layer, role: str) -> list[bf.QuantizedWeight]:
        params = {name: getattr(layer, f"{role}_{name}").data for name in bf.spec(self.format).tensor_names}
        inter = layer.b12x_inter
        rows = [inter, inter] if role == "w13" and self.gated else [params["weight"].shape[1]]
        return quantized_shards(self.format, params, rows)

    def process_weights_after_loading(self, layer) -> None:
        w13, w2 = self._quantized(layer, "w13"), self._quantized(layer, "w2")[0]
        device = layer.w2_weight.device
        common = dict(
            activation="silu" if self.gated else "relu2", w13_order="gate_up", max_tokens=max_tokens_from_vllm(),
            top_k=self.moe.experts_per_token, device=device,
        )  # fmt: skip
        # the checkpoint's recipe (b12x_core's plan construction reads it); VLLM_B12X_MOE_FP4_FORCE_A16=1 keeps
        # FP4 experts on bf16 activations
        act_format = "bf16" if self.format in FP4 and moe_fp4_force_a16() else "auto"
        prepared = bc.prepare_moe(w13, w2, act_format=act_format, **common)
        layer.b12x_moe = keep_addresses(getattr(layer, "b12x_moe", None), prepared)
        report.record(self.prefix, layer.b12x_moe)

    def get_fused_moe_quant_config(self, layer):
        return None

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if shared_experts is not None:
            raise NotImplementedError(f"b12x MoE {self.prefix}: fused shared experts are not supported yet")
        return bc.moe(x, topk_weights.to(torch.float32), topk_ids, layer.b12x_moe)


B12xMoEMethod.weight_loader.supports_moe_loading = True  # type: ignore[attr-defined]
