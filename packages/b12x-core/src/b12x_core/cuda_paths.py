"""CUDA implementations behind the ops: thin adapters from prepared torch tensors to b12x_kernels pointers.

Everything a call needs was made by prepare_* (blocks, grid table); a call allocates only its output and
never synchronises, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

GGML = ("Q8_0", "IQ2_XXS", "IQ2_XS")
DECODE_MAX_M = 16  # the GEMV kernels take up to 16 tokens per launch


def kernels_unavailable() -> str:
    try:
        import b12x_kernels
    except ImportError as err:
        return f"b12x_kernels is not installed ({err})"
    return b12x_kernels.unavailable_reason()


def grid_table(fmt: str, device) -> torch.Tensor | None:
    """The IQ2 grid as llama.cpp's uint64 entries, from b12x_formats (the single source of the constants)."""
    import numpy as np

    from b12x_formats import tables

    if fmt == "Q8_0":
        return None
    grid = tables.iq2xxs_grid() if fmt == "IQ2_XXS" else tables.iq2xs_grid()
    return torch.from_numpy(tables.iq2_grid_u64(grid).view(np.int64).copy()).to(device)


def linear_ggml(x: torch.Tensor, lin, bias: torch.Tensor | None) -> torch.Tensor:
    import b12x_kernels

    x2 = x.reshape(-1, lin.k).contiguous()
    y = torch.empty(x2.shape[0], lin.n, dtype=torch.bfloat16, device=x.device)
    if bias is not None and bias.dtype != torch.bfloat16:
        bias = bias.to(torch.bfloat16)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    grid = lin.grid.data_ptr() if lin.grid is not None else 0
    # Until the prefill kernels land, larger M runs as consecutive 16-token GEMVs (correct, not fast).
    for start in range(0, x2.shape[0], DECODE_MAX_M):
        rows = min(DECODE_MAX_M, x2.shape[0] - start)
        b12x_kernels.gemv_ggml(
            lin.format, lin.blocks.data_ptr(), grid, x2[start].data_ptr(), 0 if bias is None else bias.data_ptr(),
            y[start].data_ptr(), rows, lin.n, lin.k, stream,
        )  # fmt: skip
    return y.reshape(*x.shape[:-1], lin.n)


def embedding_q8_0(ids: torch.Tensor, emb) -> torch.Tensor:
    import b12x_kernels

    flat = ids.reshape(-1).contiguous()
    out = torch.empty(flat.numel(), emb.hidden, dtype=torch.bfloat16, device=ids.device)
    b12x_kernels.embedding_q8_0(
        emb.blocks.data_ptr(), flat.data_ptr(), flat.dtype == torch.int64, out.data_ptr(), flat.numel(), emb.vocab,
        emb.hidden, torch.cuda.current_stream(ids.device).cuda_stream,
    )  # fmt: skip
    return out.reshape(*ids.shape, emb.hidden)
