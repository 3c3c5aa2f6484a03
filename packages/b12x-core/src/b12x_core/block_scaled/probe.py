"""The first prepare of the block-scaled GEMM on an SM12x GPU runs one tile of each instruction it prepares against
the CPU reference (a few milliseconds). Nothing here has run the instruction on hardware (docs/architecture.md), so
where the GPU disagrees the process takes the bf16 path for those layers instead: `first_use` raises
BackendWithdrawn, the plan is chosen again without the backend (`failed` makes its can_implement decline), and one
warning names `b12x-selftest`. A wrong instruction model then costs speed, never wrong answers.

The tile: 16 weight rows × 256 K (two units) against 8 tokens (mt 1) and 40 tokens (mt 4: a full and a partial token
tile), random codes and scales from a fixed seed, x quantized by the kernel's own pass; the reference is the float64
product of the decoded operands (layout.decode_x / decode_weight), within the fp32 accumulation's bound. Tests
replace `run_tile` (a CPU emulation, a GPU run) and `corrupt` (a wrong scale byte) to see the fallback.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

from ..errors import BackendWithdrawn
from . import gemm, layout

SEED = 20240612
TILE_K = 2 * layout.UNIT
TILE_N = layout.TILE_ROWS
CALLS = ((8, 1), (40, 4))  # (tokens, mt)
NVFP4_INPUT_SCALE = 1.0 / 256  # x ~ N(0, 1): block scales amax / 6 · 256 stay inside E4M3

force = False  # run the probe off SM12x too (the emulated build: tests)
corrupt: Callable[[layout.BsmmaWeight], None] | None = None  # applied to the tile's layout before it runs (tests)
_verdicts: dict[tuple[str, str], str] = {}  # (device, instruction) -> '' (agreed) or what disagreed
_warned: list[str] = []


def _act_mode(name: str) -> str:
    return "nvfp4" if layout.instruction(name).btype.bits == 4 else "mxfp8"


def _tile(name: str, rng: np.random.Generator) -> layout.BsmmaWeight:
    instr = layout.instruction(name)
    codes = rng.integers(0, 256, (TILE_N, TILE_K * instr.atype.bits // 8), dtype=np.uint8)
    if instr.atype.bits == 8:  # e4m3: no NaN codes
        codes[(codes & 0x7F) == 0x7F] = 0
    if instr.stype.man_bits:  # UE4M3 0.5 .. 4
        scales = rng.integers(0x30, 0x49, (TILE_N, TILE_K // instr.block), dtype=np.uint8)
    else:  # UE8M0 2^-3 .. 2^3
        scales = rng.integers(124, 131, (TILE_N, TILE_K // instr.block), dtype=np.uint8)
    return layout.pack_rows(name, codes, scales, TILE_K)


def run_on_device(w: layout.BsmmaWeight, x: torch.Tensor, act_mode: str, input_scale: float, mt: int,
                  device) -> torch.Tensor:  # fmt: skip
    """The kernel on the tile (row factors 1): y [M, N] float32 on the CPU."""
    x_scale = float(np.float32(1.0) / np.float32(input_scale)) if act_mode == "nvfp4" else 0.0
    shard = gemm.upload(w, np.ones(w.n, np.float32), x_scale, device)
    x = x.to(device)
    buffers = [
        torch.empty(shape, dtype=dtype, device=device)
        for shape, dtype in layout.x_specs(w.instruction, x.shape[0], w.k)
    ]
    y = torch.full((x.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device=device)
    gemm.run(x, shard, y, None, mt, buffers, torch.cuda.current_stream(device).cuda_stream)
    torch.cuda.current_stream(device).synchronize()
    return y.float().cpu()


run_tile: Callable[..., torch.Tensor] = run_on_device  # (w, x, act_mode, input_scale, mt, device) -> y


def check(name: str, device) -> str:
    """'' where the kernel agrees with the reference on the probe tile, else what disagreed."""
    rng = np.random.default_rng(SEED)
    w = _tile(name, rng)
    want_w = layout.decode_weight(w)
    if corrupt is not None:
        corrupt(w)
    act_mode = _act_mode(name)
    for m, mt in CALLS:
        x = torch.from_numpy(rng.standard_normal((m, TILE_K)).astype(np.float32)).to(torch.bfloat16)
        xq = layout.decode_x(*layout.quantize_x(x, act_mode, NVFP4_INPUT_SCALE), act_mode, TILE_K)
        want = xq @ want_w.T
        bound = 2.0**-8 * want.abs() + 2.0**-16 * (xq.abs() @ want_w.abs().T)
        y = run_tile(w, x, act_mode, NVFP4_INPUT_SCALE, mt, device).double()
        bad = ~((y - want).abs() <= bound)
        if bad.any():
            i, j = (int(v) for v in bad.nonzero()[0])
            return (f"{name} at {m} tokens: y[{i}, {j}] = {float(y[i, j]):.6g}, the reference {float(want[i, j]):.6g}"
                    f" ({int(bad.sum())} of {bad.numel()} outputs disagree)")  # fmt: skip
    return ""


def runs_probe(capability: tuple[int, int] | None) -> bool:
    return force or (capability is not None and capability[0] == layout.FAMILY.capability_major)


def failed(device, name: str) -> str:
    """Why the probe withdrew instruction `name` on `device` in this process ('' where it has not)."""
    return _verdicts.get((str(device), name), "")


def first_use(query, name: str) -> None:
    """Runs the probe once per process, device and instruction where it applies (runs_probe); raises
    BackendWithdrawn, after one warning a process, where the GPU disagreed."""
    if not runs_probe(query.device.capability):
        return
    key = (str(query.device.device), name)
    if key not in _verdicts:
        _verdicts[key] = check(name, query.device.device)
        if _verdicts[key] and not _warned:
            _warned.append(_verdicts[key])
            warnings.warn(
                f"b12x: SM12x's block-scaled mma.sync disagreed with the CPU reference on {query.device.device} "
                f"({_verdicts[key]}); this process runs those layers on the bf16 tensor-core path instead. Please "
                "run `b12x-selftest` and report what it prints.", RuntimeWarning, stacklevel=2,
            )  # fmt: skip
    if _verdicts[key]:
        raise BackendWithdrawn(f"the block-scaled GEMM's first-use probe disagreed: {_verdicts[key]}")


def reset() -> None:
    """Forget every verdict and the warning (tests)."""
    _verdicts.clear()
    _warned.clear()
