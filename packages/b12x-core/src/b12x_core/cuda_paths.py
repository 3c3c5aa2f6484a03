"""CUDA implementations behind the ops: thin adapters from prepared torch tensors to b12x_kernels pointers.

Everything a call needs was made by prepare_* (blocks, grid table); a call allocates only its output and
never synchronises, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

GGML = ("Q8_0", "IQ2_XXS", "IQ2_XS")
ELEMENT = ("FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "W4A16_NVFP4", "MXFP4")
DECODE_MAX_M = 16  # the GEMV kernels take up to 16 tokens per launch


def kernels_unavailable() -> str:
    try:
        import b12x_kernels
    except ImportError as err:
        return f"b12x_kernels is not installed ({err})"
    return b12x_kernels.unavailable_reason()


_warned = False


def warn_if_not_built() -> None:
    """Say once, in one line, that this install has no CUDA kernels and how to get them: on a CUDA device the
    Triton paths still run, the CUDA-only ones (decode GEMV, Q8_0 embedding) then raise or lose to Triton."""
    global _warned
    try:
        import b12x_kernels
    except ImportError:
        return  # kernels_unavailable names it in every refusal
    why = b12x_kernels.not_built_reason()
    if why and not _warned:
        _warned = True
        logging.getLogger("b12x_core").warning("b12x: %s", why)


def grid_table(fmt: str, device) -> torch.Tensor | None:
    """The IQ2 grid as llama.cpp's uint64 entries, from b12x_formats (the single source of the constants)."""
    import numpy as np

    from b12x_formats import tables

    if fmt == "Q8_0":
        return None
    grid = tables.iq2xxs_grid() if fmt == "IQ2_XXS" else tables.iq2xs_grid()
    return torch.from_numpy(tables.iq2_grid_u64(grid).view(np.int64).copy()).to(device)


def _decode_launches(x: torch.Tensor, lin, bias: torch.Tensor | None, launch) -> torch.Tensor:
    """Output allocation and the token loop shared by the GEMV paths: `launch(x_ptr, y_ptr, bias_ptr_or_0,
    tokens, stream)` runs one kernel call for up to DECODE_MAX_M tokens. Until the prefill kernels land, larger M
    runs as consecutive 16-token GEMVs (correct, not fast)."""
    x2 = x.reshape(-1, lin.k).contiguous()
    y = torch.empty(x2.shape[0], lin.n, dtype=torch.bfloat16, device=x.device)
    if bias is not None and bias.dtype != torch.bfloat16:
        bias = bias.to(torch.bfloat16)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    for start in range(0, x2.shape[0], DECODE_MAX_M):
        tokens = min(DECODE_MAX_M, x2.shape[0] - start)
        launch(x2[start], y[start], bias, tokens, stream)
    return y.reshape(*x.shape[:-1], lin.n)


def linear_ggml(x: torch.Tensor, lin, bias: torch.Tensor | None) -> torch.Tensor:
    import b12x_kernels

    grid = lin.grid.data_ptr() if lin.grid is not None else 0

    def launch(x_row, y_row, bias, tokens, stream):
        b12x_kernels.gemv_ggml(
            lin.format, lin.blocks.data_ptr(), grid, x_row.data_ptr(), 0 if bias is None else bias.data_ptr(),
            y_row.data_ptr(), tokens, lin.n, lin.k, stream,
        )  # fmt: skip

    return _decode_launches(x, lin, bias, launch)


@dataclass
class ElementShard:
    """One row shard of an element-format weight, as the kernel reads it."""

    weight: torch.Tensor  # uint8 view of the checkpoint bytes
    scales: torch.Tensor | None  # block scales (uint8 codes, or float32 for FP8_BLOCK)
    tensor_scale: float
    row: int  # first output row
    rows: int


def element_shards(shards, device, stacked=None) -> list[ElementShard]:
    """Upload each shard's checkpoint tensors unchanged (fp8 as its bytes), or take them as row views of the
    tiles' `stacked` copy (one copy of the weight on the GPU). Which tensor is the block scale and which the
    per-tensor factor comes from the format's codec (input_scale scales activations, not W)."""
    from b12x_formats.quantized import codec_for

    codec = codec_for(shards[0].format)
    per_tensor = [n for n in codec.per_tensor_names() if n != "input_scale"]
    block = [n for n in codec.spec.required_tensors if n != "weight" and n not in per_tensor]
    scales, tensor_scale = (block or [None])[0], (per_tensor or [None])[0]
    out, row = [], 0
    for p in shards:
        t = p.tensors
        scale_array = None if scales is None else np.ascontiguousarray(t[scales])
        if scale_array is not None and scale_array.dtype != np.float32:
            scale_array = scale_array.view(np.uint8)
        if stacked is not None:
            weight = stacked.weight[row : row + p.shape[0]].view(torch.uint8)
        else:
            weight = torch.from_numpy(np.ascontiguousarray(t["weight"]).view(np.uint8)).to(device)
        if stacked is not None and scale_array is not None and scale_array.dtype == np.uint8:
            block_scales = stacked.scales[row : row + p.shape[0]].view(torch.uint8)
        else:  # FP8_BLOCK's [⌈n/128⌉, ⌈K/128⌉] float32 (the tiles hold it expanded per row)
            block_scales = None if scale_array is None else torch.from_numpy(scale_array).to(device)
        out.append(
            ElementShard(
                weight=weight,
                scales=block_scales,
                tensor_scale=1.0 if tensor_scale is None else float(np.asarray(t[tensor_scale]).reshape(-1)[0]),
                row=row,
                rows=p.shape[0],
            )
        )
        row += p.shape[0]
    return out


def linear_element(x: torch.Tensor, lin, bias: torch.Tensor | None) -> torch.Tensor:
    import b12x_kernels

    def launch(x_row, y_row, bias, tokens, stream):
        for s in lin.element_shards:  # each shard writes its columns of y (row stride N)
            b12x_kernels.gemv_elem(
                lin.format, s.weight.data_ptr(), 0 if s.scales is None else s.scales.data_ptr(), s.tensor_scale,
                x_row.data_ptr(), 0 if bias is None else bias[s.row :].data_ptr(), y_row[s.row :].data_ptr(),
                lin.n, tokens, s.rows, lin.k, stream,
            )  # fmt: skip

    return _decode_launches(x, lin, bias, launch)


def embedding_q8_0(ids: torch.Tensor, emb) -> torch.Tensor:
    import b12x_kernels

    flat = ids.reshape(-1).contiguous()
    out = torch.empty(flat.numel(), emb.hidden, dtype=torch.bfloat16, device=ids.device)
    b12x_kernels.embedding_q8_0(
        emb.blocks.data_ptr(), flat.data_ptr(), flat.dtype == torch.int64, out.data_ptr(), flat.numel(), emb.vocab,
        emb.hidden, torch.cuda.current_stream(ids.device).cuda_stream,
    )  # fmt: skip
    return out.reshape(*ids.shape, emb.hidden)
