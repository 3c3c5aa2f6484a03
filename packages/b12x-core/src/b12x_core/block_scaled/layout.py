"""The block-scaled GEMM's operands (csrc/bsmma_gemm.cu): the weight repacked once at prepare into the order the
lanes load their A registers (lossless: `unpack` gives the checkpoint bytes back), and the exact CPU form of the
activation pass (`quantize_x`), which the probe and the tests hold the kernel's pass to.

K is cut into units of BSMMA.unit_k (128) and each unit into the instruction's k-steps (two of m16n8k64 for NVFP4,
four of m16n8k32 for MXF8 / MXF4_MXF8); weight and activations are padded with zero codes to whole units. K keeps
its order: step s of unit u is K [128u + k·s, 128u + k·(s + 1)), so every instruction scale block is one real scale
block of both operands.

The weight's fragment order. The PTX fragment tables (b12x_kernels.block_scaled_mma.FRAGMENTS) give lane
l = 4g + t (g = l / 4, t = l % 4) of a 16-row tile, in both shapes, four A registers: r = 2c + h holds row g + 8h,
the t-th quarter of half c of the step's K (NVFP4: 8 e2m1 codes; MXF8: 4 e4m3 codes; MXF4_MXF8: 4 e2m1 codes in
byte containers). In a row's checkpoint bytes that quarter is `step_bytes / 8` consecutive bytes at
(step_bytes / 2)·c + (step_bytes / 8)·t of the step, so the repack only moves bytes:

    codes [tile][unit][lane][step][c][h][quarter bytes]    (a lane's unit in 16-byte loads, its registers in order)

MXF4_MXF8's e2m1 stays two a byte (its quarter is 2 bytes; the kernel widens each into the byte containers), so
the layout is no larger than the checkpoint. Scales: under thread-id-a 0 lane 4g + h supplies scale-a-data of row
g + 8h (block_scaled_mma.SCALE_A_LANE), so each (row, unit) has one word slot: NVFP4's 8 E4M3 bytes (byte-id 0,
4X: word s holds step s's four blocks), the 1X instructions' 4 E8M0 bytes (byte s is step s's; the kernel shifts it
into byte 0):

    scales [tile][unit][slot 2g + h][bytes of the row's unit]

The activations stay in K order per token (e2m1 two a byte, low nibble first; e4m3 a byte) with one scale byte a
block: a lane's B registers of a step are 4 bytes at 4t and 16 + 4t of the token's 32 bytes of that step in both
shapes, its scale-b-data the token's word of the step (NVFP4) or unit (1X).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import b12x_formats as bf

from .. import activations
from ..kernels import block_scaled_mma as bsm
from ..kernels import interface

FAMILY = interface.BSMMA

UNIT = FAMILY.unit_k
TILE_ROWS = 16


def sm12x_reason(q) -> str:
    """Why the device does not issue the block-scaled instructions (linear and grouped alike); "" where it does."""
    capability = q.device.capability
    if capability is None or capability[0] != FAMILY.capability_major:
        return (f"issues SM12x's block-scaled mma.sync (compute capability {FAMILY.capability_major}.x); "
                "elsewhere only its exact model runs, when asked for by name")  # fmt: skip
    return ""


def instruction_of(fmt: str, act_mode: str) -> str | None:
    """The instruction (block_scaled_mma.DEVICE_INSTRUCTIONS' name) that runs this weight × activation pair, or None."""
    return FAMILY.instructions.get((fmt, act_mode))


FP8 = "FP8"  # the plain E4M3 mma.sync m16n8k32 (FP8 × fp8): MXF8's fragments and code layout, no block scales


def instruction(name: str) -> bsm.BlockScaledMma:
    """The model of instruction `name`; FP8's fragments and element types are MXF8's (its scales are none)."""
    return bsm.DEVICE_INSTRUCTIONS["MXF8" if name == FP8 else name]


def scaled(name: str) -> bool:
    """Whether the instruction takes block scales (all but FP8)."""
    return name != FP8


def packed_a(name: str) -> bool:
    """Whether the weight's e2m1 codes stay two a byte where the instruction takes them one a byte (MXF4_MXF8)."""
    instr = instruction(name)
    return instr.atype == bsm.E2M1 and instr.a_slot.per_reg == 4


def steps(name: str) -> int:
    """Instructions a unit of K."""
    return UNIT // instruction(name).k


def step_bytes(name: str) -> int:
    """A weight row's stored bytes of one step (e2m1 two a byte)."""
    return instruction(name).k * instruction(name).atype.bits // 8


def scale_bytes(name: str) -> int:
    """A row's (or a token's) scale bytes of one unit: one a block (none for FP8)."""
    return UNIT // instruction(name).block if scaled(name) else 0


def x_bytes(name: str) -> int:
    """A token's code bytes of one unit."""
    return UNIT * instruction(name).btype.bits // 8


def units_of(k: int) -> int:
    return -(-k // UNIT)


def x_specs(name: str, m: int, k: int) -> list:
    """The activation pass's buffers of m tokens: codes and scale bytes (workspace.carve specs); FP8's: the fp8
    pass's e4m3 codes [m, k] and per-token scales [m] (b12x_kernels.act_quant)."""
    units = units_of(k)
    if not scaled(name):
        return [((m, k), torch.uint8), ((m,), torch.float32)]
    return [((m * units * x_bytes(name),), torch.uint8), ((m * units * scale_bytes(name),), torch.uint8)]


@dataclass
class BsmmaWeight:
    """A weight in the kernel's layout (host side)."""

    instruction: str
    n: int
    k: int
    units: int
    codes: np.ndarray  # uint8 [ceil(N/16) · units · 32 · steps · step_bytes / 2]
    scales: np.ndarray  # uint8 [ceil(N/16) · units · 16 · scale_bytes] (empty for FP8)


def _pad(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=np.uint8)
    out[: a.shape[0], : a.shape[1]] = a
    return out


def _code_axes(name: str, n16: int, units: int) -> tuple:
    """The row-major bytes [16·n16, units · steps · step_bytes] as [tile, h, g, unit, step, c, t, quarter]."""
    q = step_bytes(name) // 8
    return (n16, 2, 8, units, steps(name), 2, 4, q)


_TO_LANES = (0, 3, 2, 6, 4, 5, 1, 7)  # -> [tile, unit, g, t, step, c, h, quarter]: lane 4g + t, register 2c + h
_TO_SLOTS = (0, 3, 2, 1, 4)  # [tile, h, g, unit, bytes] -> [tile, unit, g, h, bytes]: slot 2g + h


def pack_rows(name: str, weight: np.ndarray, scales: np.ndarray, k: int) -> BsmmaWeight:
    """Checkpoint bytes of N rows, codes [N, K·bits/8] and block-scale bytes [N, K/block], -> the layout."""
    n = weight.shape[0]
    n16, units = -(-n // TILE_ROWS), units_of(k)
    codes = _pad(weight, n16 * TILE_ROWS, units * steps(name) * step_bytes(name))
    codes = codes.reshape(_code_axes(name, n16, units)).transpose(_TO_LANES)
    sc = _pad(scales if scaled(name) else np.zeros((n, 0), np.uint8), n16 * TILE_ROWS, units * scale_bytes(name))
    sc = sc.reshape(n16, 2, 8, units, scale_bytes(name)).transpose(_TO_SLOTS)
    return BsmmaWeight(name, n, k, units, np.ascontiguousarray(codes).reshape(-1),
                       np.ascontiguousarray(sc).reshape(-1))  # fmt: skip


def _rows(shards: list[bf.QuantizedWeight], tensor: str, expert: int | None) -> np.ndarray:
    """A tensor's bytes of every shard (of one expert of a stack), one row a weight row."""
    parts = []
    for p in shards:
        a = np.ascontiguousarray(p.tensors[tensor] if expert is None else p.tensors[tensor][expert])
        parts.append(a.view(np.uint8).reshape(p.shape[-2], -1))
    return np.concatenate(parts)


def pack(shards: list[bf.QuantizedWeight], act_mode: str, expert: int | None = None) -> BsmmaWeight:
    """Row shards of one format (a fused qkv / gate_up, or one weight; of expert `expert` of [E, N, K] stacks)
    stacked along N -> the layout; each shard's per-tensor factor stays the caller's (per row: weights.row_factors).
    FP8's per-tensor weight_scale is such a factor: its layout holds the codes alone."""
    fmt = shards[0].format
    name = instruction_of(fmt, act_mode)
    dims = 2 if expert is None else 3
    if name is None or any(len(p.shape) != dims for p in shards):
        raise ValueError(f"the block-scaled GEMM takes {'[N, K]' if dims == 2 else '[E, N, K]'} weights of "
                         f"{sorted(FAMILY.instructions)}, got {fmt} × {act_mode} "
                         f"{[tuple(p.shape) for p in shards]}")  # fmt: skip
    k = shards[0].shape[-1]
    scales = _rows(shards, "weight_scale", expert) if scaled(name) else None
    return pack_rows(name, _rows(shards, "weight", expert), scales, k)


def pack_experts(shards: list[bf.QuantizedWeight], act_mode: str) -> list[BsmmaWeight]:
    """[E, N, K] stacks (a gate / up pair, or one) -> each expert's layout (the grouped GEMM's experts, which it
    finds `len(codes)` and `len(scales)` bytes apart)."""
    return [pack(shards, act_mode, e) for e in range(shards[0].shape[0])]


def unpack(w: BsmmaWeight) -> dict[str, np.ndarray]:
    """The checkpoint bytes back: {"weight": [N, K·bits/8], "weight_scale": [N, K/block]} (uint8)."""
    n16 = -(-w.n // TILE_ROWS)
    axes = _code_axes(w.instruction, n16, w.units)
    lanes = tuple(axes[i] for i in _TO_LANES)
    codes = w.codes.reshape(lanes).transpose(np.argsort(_TO_LANES)).reshape(n16 * TILE_ROWS, -1)
    sc = w.scales.reshape(n16, w.units, 8, 2, scale_bytes(w.instruction)).transpose(np.argsort(_TO_SLOTS))
    sc = sc.reshape(n16 * TILE_ROWS, -1)
    instr = instruction(w.instruction)
    if not scaled(w.instruction):
        return {"weight": codes[: w.n, : w.k]}
    return {"weight": codes[: w.n, : w.k * instr.atype.bits // 8], "weight_scale": sc[: w.n, : w.k // instr.block]}


# ----------------------------------------------------------------------------------------------- the activations
_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _blocks(x: torch.Tensor, units: int, block: int) -> torch.Tensor:
    """[M, K] float32 -> [M, units·UNIT / block, block], zeros past K (zeros change no amax)."""
    m, k = x.shape
    padded = torch.zeros(m, units * UNIT, dtype=torch.float32)
    padded[:, :k] = x
    return padded.reshape(m, units * UNIT // block, block)


def quantize_x(x: torch.Tensor, act_mode: str, input_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes uint8 [M, units · x_bytes], scale bytes uint8 [M, units · scale_bytes]) as the kernel's
    activation pass writes them, by b12x_core.activations' rules (CPU, float32): decoded, codes × scales is the
    mode's x̂ (nvfp4: without its per-tensor input_scale)."""
    x = x.detach().to("cpu", torch.float32)
    units = units_of(x.shape[1])
    if act_mode == "nvfp4":
        if input_scale is None:
            raise ValueError("nvfp4 activations need the checkpoint's input_scale")
        g = _blocks(x, units, 16)
        gs = float(np.float32(1.0) / np.float32(input_scale))
        amax = g.abs().amax(dim=2, keepdim=True)
        sf = activations.round_e4m3(amax / torch.full_like(amax, 6.0) * gs)
        out = torch.where(sf > 0, torch.full_like(sf, gs) / sf, torch.zeros_like(sf))
        q = activations.round_e2m1(g * out)
        mag = torch.searchsorted(_E2M1_VALUES, q.abs()).to(torch.uint8)
        code = mag | (torch.signbit(q).to(torch.uint8) << 3)
        code = code.reshape(x.shape[0], -1, 2)
        codes = code[..., 0] | (code[..., 1] << 4)
        scales = sf.to(torch.float8_e4m3fn).view(torch.uint8)
    elif act_mode == "mxfp8":
        g = _blocks(x, units, 32)
        amax = g.abs().amax(dim=2, keepdim=True)
        _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
        exponent = torch.where(amax > 0, e - 1 - 8, torch.full_like(e, -127)).clamp(-127, 127)
        codes = activations.round_e4m3(torch.ldexp(g, -exponent)).to(torch.float8_e4m3fn).view(torch.uint8)
        scales = (exponent + 127).to(torch.uint8)
    else:
        raise ValueError(f"the block-scaled GEMM quantizes nvfp4 or mxfp8 activations, not {act_mode!r}")
    return codes.reshape(x.shape[0], -1).contiguous(), scales.reshape(x.shape[0], -1).contiguous()


def decode_x(codes: torch.Tensor, scales: torch.Tensor, act_mode: str, k: int) -> torch.Tensor:
    """quantize_x's bytes -> x̂ float64 [M, K] (nvfp4: without input_scale), by the model's element decodes."""
    codes, scales = codes.cpu().numpy(), scales.cpu().numpy()
    m = codes.shape[0]
    if act_mode == "nvfp4":
        elems = np.stack([codes & 15, codes >> 4], axis=-1).reshape(m, -1)
        values, sv, block = bsm.decode(bsm.E2M1, elems), bsm.decode(bsm.UE4M3, scales), 16
    else:
        values, sv, block = bsm.decode(bsm.E4M3, codes), bsm.decode(bsm.UE8M0, scales), 32
    return torch.from_numpy(values * np.repeat(sv, block, axis=1))[:, :k]


def decode_weight(w: BsmmaWeight) -> torch.Tensor:
    """The layout's weight [N, K] float64, without per-tensor factors (the model's decodes of unpack's bytes)."""
    t = unpack(w)
    instr = instruction(w.instruction)
    codes = t["weight"]
    if not scaled(w.instruction):
        return torch.from_numpy(bsm.decode(bsm.E4M3, codes))
    if instr.atype == bsm.E2M1:
        codes = np.stack([codes & 15, codes >> 4], axis=-1).reshape(w.n, -1)
    scales = bsm.decode(bsm.UE4M3 if instr.stype == bsm.UE4M3 else bsm.UE8M0, t["weight_scale"])
    return torch.from_numpy(bsm.decode(instr.atype, codes) * np.repeat(scales, instr.block, axis=1))
