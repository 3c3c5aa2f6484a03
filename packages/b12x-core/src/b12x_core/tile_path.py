"""The prefill path: b12x_kernels.tiles (Triton) for every format × activation, fed from prepared tensors.

prepare_tiles concatenates the row shards of a fused layer into one weight and folds every per-tensor factor
(FP8 weight_scale, NVFP4 weight_scale_2, a static activation scale) into one float32 scale per output row.
A call quantizes activations the way activations.py defines them (fused Triton passes), then launches one
kernel. From `lin.gemm_from` tokens on, a call whose activations are bf16 values (bf16, mxfp8, nvfp4 modes)
instead decodes the weight to bf16 in a workspace shared by the device's layers and runs the dense bf16 GEMM
(cuBLAS): at large M the decode is a small memory-bound pass and the GEMM runs at the dense speed; FP8 W8A8
with per-tensor or per-token scales runs cuBLASLt's fp8 GEMM (`torch._scaled_mm`) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def triton_unavailable() -> str:
    """Why the Triton tiles cannot run here ('' when they can)."""
    try:
        import triton  # noqa: F401

        from b12x_kernels import tiles  # noqa: F401
    except ImportError as err:
        return f"Triton is not importable ({err})"
    return ""


@dataclass
class TileWeight:
    weight: torch.Tensor  # checkpoint bytes of all shards, stacked along N (fp8 dtype for e4m3 weights)
    scales: torch.Tensor | None  # block scales stacked along N (FP8_BLOCK: float32 expanded to [N, ⌈K/128⌉])
    col_scale: torch.Tensor  # float32 [N]
    grid: torch.Tensor | None  # IQ2 grid (int64)
    signs: torch.Tensor | None  # IQ2 ksigns (uint8 [128])


def checkpoint_tensor(a: np.ndarray) -> torch.Tensor:
    """A checkpoint array as a torch tensor of the same bytes (e4m3 as torch fp8, E8M0 as uint8)."""
    a = np.ascontiguousarray(a)
    if a.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    if a.dtype.name == "float8_e8m0fnu":
        return torch.from_numpy(a.view(np.uint8))
    return torch.from_numpy(a)


def _per_expert(t: dict, name: str | None, experts: int) -> np.ndarray:
    """A per-tensor factor (one scalar, or one per expert of a stack) as float32 [E]; ones when absent."""
    if name is None or name not in t:
        return np.ones(experts, np.float32)
    return np.broadcast_to(np.asarray(t[name], dtype=np.float32).reshape(-1), (experts,)).astype(np.float32)


def prepare_tiles(shards, act_mode: str, input_scale: float | None, device) -> TileWeight:
    """Row shards of one format (a fused qkv / gate_up, or one weight), whole or as expert stacks [E, n, ...]:
    expert e owns rows [e·R, (e+1)·R) of the stacked tensors, R the shards' rows in order (gate then up).
    Which tensor is the block scale and which the per-tensor factor comes from the format's codec."""
    from b12x_formats import tables
    from b12x_formats.quantized import codec_for

    from .cuda_paths import grid_table

    fmt = shards[0].format
    lead = len(shards[0].shape) - 2
    experts = int(np.prod(shards[0].shape[:lead]))
    codec = codec_for(fmt)
    per_tensor = [n for n in codec.per_tensor_names() if n != "input_scale"]
    block = [n for n in codec.spec.required_tensors if n != "weight" and n not in per_tensor]

    def stacked(name: str, expand_rows: int = 1) -> torch.Tensor:
        parts = []
        for p in shards:
            a = p.tensors[name]
            if expand_rows > 1:  # FP8_BLOCK: one row of block scales per output row, so any shard height stacks
                a = np.repeat(a, expand_rows, axis=lead)[(slice(None),) * lead + (slice(0, p.shape[-2]),)]
            t = checkpoint_tensor(a)
            parts.append(t.reshape(experts, p.shape[-2], *t.shape[lead + 1 :]))
        whole = torch.cat(parts, dim=1)
        return whole.reshape(-1, *whole.shape[2:]).contiguous().to(device)

    weight = stacked("weight")
    scales = None
    if block:
        scales = stacked(block[0], expand_rows=128 if fmt == "FP8_BLOCK" else 1)
        scales = scales.float() if fmt == "FP8_BLOCK" else scales
    factor = per_tensor[0] if per_tensor else None
    col = np.concatenate(
        [np.repeat(_per_expert(p.tensors, factor, experts)[:, None], p.shape[-2], axis=1) for p in shards], axis=1
    )
    act_factor = input_scale if act_mode in ("fp8_static", "nvfp4") else 1.0
    col_scale = (torch.from_numpy(np.ascontiguousarray(col).reshape(-1)) * torch.tensor(act_factor)).to(device)
    grid = signs = None
    if fmt.startswith("IQ2"):
        grid = grid_table(fmt, device)
        signs = torch.from_numpy(tables.ksigns_iq2xs().copy()).to(device)
    return TileWeight(weight, scales, col_scale.to(torch.float32), grid, signs)


def scratch_specs(act_mode: str, m: int, k: int) -> list:
    """The temporaries of quantizing [m, k] activations: codes or values, then the scales (see scratch.py)."""
    if act_mode == "bf16":
        return []
    if act_mode in ("mxfp8", "nvfp4"):
        return [((m, k), torch.bfloat16)]
    return [((m, k), torch.uint8), ((m,), torch.float32), ((m, -(-k // 128)), torch.float32)]


def activation_operands(x2: torch.Tensor, act_mode: str, input_scale: float | None):
    """-> (x for the dot: bf16 or e4m3, per-token scale or None, per-token×128 scale or None)."""
    if act_mode == "bf16":
        return x2, None, None
    from b12x_kernels import act_quant

    from . import scratch

    m, k = x2.shape
    buffers = scratch.carve(x2.device, scratch_specs(act_mode, m, k))
    if act_mode.startswith("fp8"):  # one fused pass, the rules of activations.fp8_operands
        codes, row, groups = buffers
        row = row if act_mode == "fp8_token" else None
        groups = groups if act_mode == "fp8_group128" else None
        static = float(np.float32(input_scale)) if act_mode == "fp8_static" else 1.0
        act_quant.quantize_fp8(x2, act_mode, codes, row if row is not None else groups, static)
        return codes.view(torch.float8_e4m3fn), row, groups
    if act_mode in ("mxfp8", "nvfp4"):
        return bf16_valued(x2, act_mode, input_scale, buffers[0]), None, None
    raise ValueError(f"unknown activation mode {act_mode!r}")


def bf16_valued(x: torch.Tensor, act_mode: str, input_scale: float | None, out: torch.Tensor) -> torch.Tensor:
    """x̂ of the modes bf16 holds exactly, written to `out` by one fused pass: mxfp8 (e4m3·2^e) and nvfp4
    without its per-tensor input_scale (e2m1·sf; the caller's col_scale carries it); x itself for bf16."""
    if act_mode == "bf16":
        return x
    from b12x_kernels import act_quant

    global_scale = float(np.float32(1.0) / np.float32(input_scale)) if act_mode == "nvfp4" else 1.0
    return act_quant.quantize_activation(x, act_mode, out, global_scale)


_workspaces: dict[torch.device, list[torch.Tensor]] = {}


def reserve_workspace(device: torch.device, numel: int) -> None:
    """Grow the device's bf16 weight workspace to `numel` (prepare time). Outgrown buffers stay alive: a CUDA
    graph captured earlier may still read them."""
    held = _workspaces.setdefault(device, [])
    if not held or held[-1].numel() < numel:
        held.append(torch.empty(numel, dtype=torch.bfloat16, device=device))


def dense_path(lin) -> bool:
    """Whether large-M calls of `lin` may decode to the workspace and run the dense GEMM."""
    return lin.act_mode in ("bf16", "mxfp8", "nvfp4")


def scaled_mm_path(lin) -> bool:
    """Whether large-M calls of `lin` run cuBLASLt's fp8 GEMM (torch._scaled_mm, row-wise scales): FP8 weights
    with per-tensor (static) or per-token activation scales, dimensions its fp8 layouts accept."""
    return lin.format == "FP8" and lin.act_mode in ("fp8_static", "fp8_token") and lin.k % 16 == 0 and lin.n % 16 == 0


def _scaled_mm(xq: torch.Tensor, row_scale: torch.Tensor | None, lin, bias: torch.Tensor | None) -> torch.Tensor:
    """y = (xq · row_scale) (w · col_scale)ᵀ + bias; rows padded to a multiple of 16 for the fp8 layouts."""
    m = xq.shape[0]
    pad = (-m) % 16
    ones = torch.ones(m + pad, 1, dtype=torch.float32, device=xq.device)
    scale_a = ones if row_scale is None else torch.cat([row_scale, ones[m:, 0]]).reshape(-1, 1)
    if pad:
        xq = torch.cat([xq, torch.zeros(pad, lin.k, dtype=xq.dtype, device=xq.device)])
    y = torch._scaled_mm(xq, lin.tiles.weight.t(), scale_a=scale_a, scale_b=lin.tiles.col_scale.reshape(1, -1),
                         bias=None if bias is None else bias.to(torch.bfloat16), out_dtype=torch.bfloat16)  # fmt: skip
    return y[:m]


def linear_tiles(x: torch.Tensor, lin, bias: torch.Tensor | None) -> torch.Tensor:
    from b12x_kernels import tiles

    tw = lin.tiles
    x2 = x.reshape(-1, lin.k).contiguous()
    xq, row_scale, group_scale = activation_operands(x2, lin.act_mode, lin.input_scale)
    if x2.shape[0] >= lin.gemm_from and scaled_mm_path(lin):
        return _scaled_mm(xq, row_scale, lin, bias).reshape(*x.shape[:-1], lin.n)
    if x2.shape[0] >= lin.gemm_from and dense_path(lin):
        w = _workspaces[lin.device][-1][: lin.n * lin.k].view(lin.n, lin.k)
        tiles.dequantize_tiles(lin.format, tw.weight, tw.scales, tw.col_scale, w, grid_table=tw.grid,
                               sign_table=tw.signs)  # fmt: skip
        y = torch.nn.functional.linear(xq, w, None if bias is None else bias.to(torch.bfloat16))
        return y.reshape(*x.shape[:-1], lin.n)
    y = torch.empty(x2.shape[0], lin.n, dtype=torch.bfloat16, device=x.device)
    tiles.linear_tiles(
        lin.format, xq, tw.weight, tw.scales, tw.col_scale, y, grid_table=tw.grid, sign_table=tw.signs,
        row_scale=row_scale, x_group_scale=group_scale, bias=bias,
    )  # fmt: skip
    return y.reshape(*x.shape[:-1], lin.n)


def reserve_scratch(lin) -> None:
    from . import scratch

    scratch.reserve(lin.device, scratch.nbytes(scratch_specs(lin.act_mode, lin.max_tokens, lin.k)))


def warm(lin) -> None:
    """Compile every tile configuration the calls of `lin` can pick (prepare time, never during capture)."""
    from b12x_kernels import tiles

    # one call per distinct tile configuration between tiles_from and max_tokens
    configs, lo = {}, max(lin.tiles_from, 1)
    for block_m in (16, 32, 64, 128):  # a config depends on BLOCK_M and the number of row tiles
        for rows in range(1, 265):
            m = min(max(block_m * rows, lo), lin.max_tokens)
            config = tiles.default_config(lin.format, m, lin.n)
            configs.setdefault(tuple(sorted(config.items())), m)
            if config["BLOCK_N"] == 128 or m == lin.max_tokens:
                break
    sizes = sorted(configs.values())
    reserve_scratch(lin)
    if dense_path(lin) and lin.max_tokens >= lin.gemm_from:
        reserve_workspace(lin.device, lin.n * lin.k)
    if (dense_path(lin) or scaled_mm_path(lin)) and lin.max_tokens >= lin.gemm_from:
        sizes.append(max(lin.gemm_from, 1))
    for m in sizes:
        linear_tiles(torch.zeros(max(m, 1), lin.k, dtype=torch.bfloat16, device=lin.device), lin, None)
