"""One copy of a weight on the device: where the plan runs the tensor-core GEMM (its repacked layout) and dequantize +
cuBLAS, the dequantization reads the repacked layout (b12x_kernels.mma_dequant) instead of the checkpoint layout.

On CPU, in Triton's interpreter: the dequantization from the repacked layout equals the checkpoint-layout dequantization
(tiles.dequantize_tiles) bit for bit, every format, fused shards with their own per-tensor scales, N and K
tails, and both are within one bf16 rounding of the format oracle (b12x_formats.dequantize); dequant_gemm prepared
with the shared layout never builds the checkpoint-layout copy and gives the same output. The plan sets the
shared layout when a chosen backend holds one. On the GPU (marked gpu): a plan of both backends holds one copy and
matches the reference on both sides of its crossover.
"""

from __future__ import annotations

import dataclasses

import fake_args
import numpy as np
import pytest
import torch
from closeness import close, rounding_slack
from fake_args import FAKE

import b12x_core as bc
import b12x_formats as bf
from b12x_core import plan, timings, workspace
from b12x_core.backends import Backend, DeviceInfo, Query
from b12x_core.backends.cublas import DequantGemm
from b12x_core.tensor_core import geometry
from b12x_core.tensor_core import layout as mma_layout
from b12x_core.weights import DeviceWeights
from b12x_formats.kernel_facts import format_id

pytest.importorskip("triton")

from b12x_kernels import tiles  # noqa: E402

FORMATS = list(mma_layout.FORMATS)
CPU = torch.device("cpu")


def shards(rng, fmt: str, rows=(24, 40)) -> list[bf.QuantizedWeight]:
    """Row shards (a fused qkv / gate_up) with their own per-tensor scales; K with a tail past whole chunks; a few
    columns of tiny negative weights (E2M1's negative zero, which both dequantizations give as +0)."""
    k = 2 * geometry.chunk_k(fmt) + max(bf.spec(fmt).k_multiple, 8)  # the tensor-core GEMM needs K % 8 == 0
    out = []
    for n in rows:
        w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.1, 10)
        w[:, rng.integers(0, k, 8)] = -1e-9  # below every format's step: codes of negative zero where they exist
        qw = bf.quantize(w, fmt)
        factor = {"FP8": "weight_scale", "NVFP4": "weight_scale_2", "W4A16_NVFP4": "weight_scale_2"}.get(fmt)
        if factor:
            qw = bf.QuantizedWeight.from_tensors(
                fmt, {**qw.tensors, factor: np.float32(rng.uniform(0.5, 2.0)).reshape(qw.tensors[factor].shape)}
            )
        out.append(qw)
    return out


def poisoned(n: int, k: int) -> torch.Tensor:
    return torch.full((n, k), float("nan"), dtype=torch.bfloat16)


def checkpoint_dequant_and_mma_dequantizer(parts, device):
    """(the checkpoint-layout dequantization of `parts`, stacked: tiles.dequantize_tiles into a poisoned tensor; a
    DequantGemm then set to read the shared tensor-core layout: its _dequantize_mma dequantizes that one)."""
    weights = DeviceWeights(parts, "bf16", None, device)
    n, k = sum(p.shape[0] for p in parts), parts[0].shape[1]
    fmt, stacked = parts[0].format, weights.stacked
    want = tiles.dequantize_tiles(fmt, stacked.weight, stacked.scales, stacked.col_scale, poisoned(n, k).to(device),
                                  grid_table=stacked.grid, sign_table=stacked.signs)  # fmt: skip
    weights.shared_layout = "mma"
    return want, DequantGemm(Query("linear", fmt, "bf16", "bf16", DeviceInfo.of(device), n=n, k=k), weights)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_from_the_repacked_layout_equals_the_checkpoint_dequantize(rng, fmt):
    parts = shards(rng, fmt)
    want, backend = checkpoint_dequant_and_mma_dequantizer(parts, CPU)
    got = poisoned(*want.shape)
    backend._dequantize_mma(got)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    oracle = torch.from_numpy(np.concatenate([bf.dequantize(p) for p in parts]))
    close(got, oracle)


@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4", "FP8_BLOCK", "Q8_0", "IQ2_XS"])
@pytest.mark.parametrize("program", [(32, 2, 4), (64, 3, 8)])
def test_the_dequantize_program_shape_never_changes_a_bit(rng, fmt, program, monkeypatch):
    """Programs of several row tiles and chunks (tuned per GPU) cover tails in N and in the chunks (past the last
    tile or chunk, masked) and dequantize each weight exactly as one tile × one chunk programs do."""
    from b12x_kernels import mma_dequant

    parts = shards(rng, fmt, rows=(24, 40, 8))  # 72 rows: a partial program at both program heights
    want, backend = checkpoint_dequant_and_mma_dequantizer(parts, CPU)
    one_tile, got = poisoned(*want.shape), poisoned(*want.shape)
    monkeypatch.setattr(mma_dequant, "PROGRAM", {fmt: (16, 1, 4)})
    backend._dequantize_mma(one_tile)
    monkeypatch.setattr(mma_dequant, "PROGRAM", {fmt: program})
    backend._dequantize_mma(got)
    assert torch.equal(got.view(torch.int16), one_tile.view(torch.int16))


def test_a_dequantize_program_is_whole_row_tiles():
    from b12x_kernels import mma_dequant

    with pytest.raises(ValueError, match="power of two of 16-row tiles"):
        mma_dequant.dequantize_mma("NVFP4", *([None] * 8), torch.empty(16, 128), 128, 1, program=(24, 1, 4))


@pytest.mark.parametrize("fmt", ["NVFP4", "IQ2_XS", "FP8_BLOCK"])
def test_dequant_gemm_on_the_shared_layout_never_builds_a_second_copy(rng, fmt):
    parts = shards(rng, fmt, rows=(128, 128))
    n, k = 256, parts[0].shape[1]
    q = Query("linear", fmt, "bf16", "bf16", DeviceInfo.of(CPU), n=n, k=k, max_tokens=4, shard_rows=(128, 128))
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32)).to(torch.bfloat16)
    outputs = []
    for layout in (None, "mma"):
        weights = DeviceWeights(parts, "bf16", None, CPU)
        weights.shared_layout = layout
        p = plan.build(q, weights, only=DequantGemm, warm=False)
        workspace.poison(CPU)
        outputs.append(p.for_tokens(3).run(x, None))
        assert ("stacked" in weights.__dict__) == (layout is None)
    assert torch.equal(outputs[0], outputs[1])


class Holder(Backend):
    """A backend that reads only the repacked layout, for the plan's bookkeeping."""

    name, op, reads = "holder", "linear", ("mma",)

    @classmethod
    def can_implement(cls, query):
        return True, "holds"

    def run(self, x2, bias, *, config):
        return x2


def test_the_plan_picks_the_layout_its_backends_share(rng):
    weights = DeviceWeights(shards(rng, "MXFP4"), "bf16", None, CPU)
    q = Query("linear", "MXFP4", "bf16", "bf16", DeviceInfo.of(CPU), n=64, k=288, max_tokens=4)
    plan.build(q, weights, only=Holder, warm=False)
    assert weights.shared_layout == "mma"
    untouched = DeviceWeights(shards(rng, "MXFP4"), "bf16", None, CPU)
    plan.build(q, untouched, only=DequantGemm, warm=False)
    assert untouched.shared_layout == "checkpoint"  # it reads both: the checkpoint's, no repack


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["NVFP4", "MXFP4", "Q8_0", "IQ2_XXS", "FP8"])
def test_gpu_plan_of_tensor_core_and_dequant_gemm_holds_one_copy(rng, fmt):
    """A table where the tensor-core GEMM wins to M=8 and dequantize + cuBLAS above: one device copy, both sides of the
    crossover match the reference, within what the kernels' one bf16 rounding of Q8_0 / IQ2 weights can move a sum
    (closeness.rounding_slack)."""
    parts = shards(rng, fmt, rows=(128, 64))
    n, k = 192, parts[0].shape[1]
    device = DeviceInfo.of(torch.device("cuda"))
    q = Query("linear", fmt, "bf16", "bf16", device, n=n, k=k, max_tokens=64, shard_rows=(128, 64))
    times = {"tensor_core": (1.0, 1.0, 9.0), "dequant_gemm": (9.0, 9.0, 1.0)}
    entry = timings.Entry(device.capability, fmt, "bf16", timings.shape_class(n, k),
                          (1, 8, 64), times, "test")  # fmt: skip
    weights = DeviceWeights(parts, "bf16", None, device.device)
    p = plan.build(q, weights, entries=(entry,))
    assert [d.backend.name for d in p.decisions] == ["tensor_core", "dequant_gemm"]
    assert "stacked" not in weights.__dict__
    ref = bc.prepare_linear(parts, max_tokens=64)
    w = torch.cat([torch.from_numpy(bf.dequantize(part)).double() for part in parts])
    for m in (3, 40):
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
        close(p.for_tokens(m).run(x.cuda(), None).cpu(), bc.linear(x, ref), slack=rounding_slack(fmt, x, w))
    assert "stacked" not in weights.__dict__


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_dequantize_equals_the_checkpoint_dequantize_at_every_program_shape(rng, fmt, monkeypatch):
    """Compiled (not interpreted), the dequantization from the repacked layout gives the checkpoint-layout
    dequantization's bits at the measured program shape and at others (row and chunk tails, fp8 conversion and E2M1 bit
    tricks on the GPU), and so does the CUDA pass (b12x_kernels.mma_dequantize), with each fused shard's own per-tensor
    scale."""
    from b12x_kernels import mma_dequant

    parts = shards(rng, fmt, rows=(24, 37, 8))  # 37: a half tile with rows past the shard's end
    want, backend = checkpoint_dequant_and_mma_dequantizer(parts, torch.device("cuda"))
    for program in (None, (16, 1, 4), (32, 2, 4), (64, 3, 8), "cuda"):
        monkeypatch.setattr(DequantGemm, "CUDA_PASS_FORMATS", (fmt,) if program == "cuda" else ())
        if program and program != "cuda":
            monkeypatch.setattr(mma_dequant, "PROGRAM", {fmt: program})
        got = poisoned(*want.shape).cuda()
        backend._dequantize_mma(got)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), program
    oracle = torch.from_numpy(np.concatenate([bf.dequantize(p) for p in parts]))
    zeros = oracle == 0  # and their signs: E2M1's negative zero dequantizes to -0.0, as in the oracle
    assert torch.equal(torch.signbit(got.cpu()[zeros]), torch.signbit(oracle[zeros]))


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (dict(format=format_id("IQ2_XS"), meta2=16, tables=0), "grid and sign tables"),
        (dict(format=format_id("IQ2_XS"), meta2=0, tables=16), "sub-block scales"),
        (dict(format=99), "unknown format"),
        (dict(K=100), "K % 8"),
        (dict(K=256), "fewer than K columns"),
        (dict(ldy=64), "row stride"),
        (dict(meta=0), "null scale bytes"),
        (dict(codes=8), "misaligned codes"),
        (dict(format=format_id("FP8_BLOCK"), chunks=2), "FP8_BLOCK needs its block scales"),
        (dict(scale_mul=3.0), "power of two"),
    ],
)
def test_the_cuda_pass_refuses_what_it_cannot_dequantize_before_launching(fields, why):
    """b12x_kernels.mma_dequantize checks its argument block before any CUDA call (so on a machine without a GPU too)."""
    import b12x_kernels

    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    with pytest.raises(ValueError, match=why):
        b12x_kernels.mma_dequantize(fake_args.mma_args(**{"ldy": 128, **fields}), FAKE, 0)
    with pytest.raises(ValueError, match="misaligned out"):
        b12x_kernels.mma_dequantize(fake_args.mma_args(ldy=128), 8, 0)


def test_dequant_gemm_previews_need_no_weights():
    q = Query("linear", "NVFP4", "bf16", "bf16", dataclasses.replace(DeviceInfo.of(CPU)), n=64, k=256)
    assert DequantGemm.configs(q, 1, 8) == [(1, 8, {})]
    assert DequantGemm.configs(q, 1, 8, layout="mma") == [(1, 8, {"reads": "the tensor-core layout"})]


def test_explain_reports_one_copy_of_the_weight_when_the_layout_is_shared(rng):
    """The memory a plan holds, as explain prints it: dequant_gemm on the shared repacked layout holds its bytes
    (no bigger than the checkpoint's plus padding), on the checkpoint layout the stacked copy."""
    parts = shards(rng, "MXFP4", rows=(128, 128))
    q = Query("linear", "MXFP4", "bf16", "bf16", DeviceInfo.of(CPU), n=256, k=parts[0].shape[1], max_tokens=4,
              shard_rows=(128, 128))  # fmt: skip
    held = {}
    for layout in (None, "mma"):
        weights = DeviceWeights(parts, "bf16", None, CPU)
        weights.shared_layout = layout
        p = plan.build(q, weights, only=DequantGemm, warm=False)
        held[layout] = p.held_bytes()
        assert f"holds {held[layout] / 1024:.1f} KiB of weights on cpu" in p.explain("h")
    checkpoint = sum(np.asarray(t).nbytes for part in parts for t in part.tensors.values())
    k = parts[0].shape[1]
    padded_k = -(-k // geometry.chunk_k("MXFP4")) * geometry.chunk_k("MXFP4")  # the layout pads K to a chunk
    assert checkpoint <= held["mma"] <= checkpoint * padded_k / k + 256 * 4 + 64  # + row factors, E2M1 fields
    assert checkpoint <= held[None] <= checkpoint + 256 * 4
