"""Parameters for a format's checkpoint tensors, and the QuantizedWeight(s) they hold after loading."""

from __future__ import annotations

import torch

import b12x_formats as bf

TORCH_DTYPES = {"uint8": torch.uint8, "float8_e4m3fn": torch.float8_e4m3fn, "float32": torch.float32}


def tensor_layout(fmt: str, lead: tuple[int, ...], n: int, k: int) -> dict[str, tuple[tuple | str, torch.dtype]]:
    """name -> (shape or PER_TENSOR, torch dtype) for every tensor the format may store."""
    shapes = bf.tensor_shapes(fmt, lead, n, k)
    return {t.name: (shapes[t.name], TORCH_DTYPES[t.dtype]) for t in bf.spec(fmt).tensors}


def is_per_tensor(shape) -> bool:
    return isinstance(shape, str) and shape == bf.PER_TENSOR


def max_tokens_from_vllm() -> int:
    """The most tokens one forward can carry: the prepared ops' workspace size."""
    from vllm.config import get_current_vllm_config

    config = get_current_vllm_config()
    scheduler = config.scheduler_config
    sizes = [scheduler.max_num_batched_tokens or 0, scheduler.max_num_seqs or 0]
    sizes += list(config.compilation_config.cudagraph_capture_sizes or [])
    return max(sizes + [1])


def quantized_shards(fmt: str, params: dict[str, torch.Tensor], rows: list[int]) -> list:
    """Loaded parameters -> QuantizedWeights, one per row shard when per-tensor scales were loaded.

    `params` maps tensor names to data; per-tensor scales hold one slot per shard in their last dim
    ([shards] for a linear layer, [E, shards] for experts), NaN where the checkpoint has none."""
    scalar_names = bf.per_tensor_names(fmt)
    tensors = {n: t for n, t in params.items() if n not in scalar_names}
    scalars = {n: t for n, t in params.items() if n in scalar_names and not torch.isnan(t).all()}
    if not scalars:
        return [bf.QuantizedWeight.from_tensors(fmt, tensors)]
    shards, start = [], 0
    for i, count in enumerate(rows):
        whole = bf.QuantizedWeight.from_tensors(fmt, {**tensors, **{n: t[..., i] for n, t in scalars.items()}})
        shards.append(whole if len(rows) == 1 else bf.slice_weight(whole, rows=(start, start + count)))
        start += count
    return shards
