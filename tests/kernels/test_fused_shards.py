"""A fused linear (qkv / gate_up row shards, each with its own per-tensor factor) on the tensor-core GEMM is one
launch per call where its shards' layouts concatenate (tensor_core.layout.merge_blocker): one MmaShard over every
row, each shard's factor per row (row_scale, alpha 1), bit-identical to one launch per shard.

On CPU: which shard sets merge and which keep a launch per shard; the merged shard holds exactly the shards' bytes
and each shard's factor (the per-shard launch's alpha) over its rows; a call launches one kernel (mma.sync and
wgmma forms, kernel entry points replaced by counters) whose argument block covers every row; the merged layout
decodes, in the numpy model of the kernel's lanes, to the shards' weights bit for bit, and dequantize + cuBLAS on the
shared layout (Triton's interpreter) to the checkpoint dequantization bit for bit. On the GPU (marked gpu), 3 shards
with their own factors: the merged shard (into an output poisoned with NaN) and the tensor_core backend's call (one
launch) equal the per-shard launches bit for bit at M ∈ {1, 5, 37}; the same for the wgmma backend on an sm_90 GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mma_emulator import effective_weight

import b12x_formats as bf
import b12x_kernels
from b12x_core import plan, workspace
from b12x_core.backends import DeviceInfo, Query
from b12x_core.backends.cublas import DequantGemm
from b12x_core.backends.tensor_core import TensorCoreGemm
from b12x_core.backends.tensor_core_wgmma import TensorCoreWgmma
from b12x_core.tensor_core import gemm, geometry, wgmma
from b12x_core.tensor_core import layout as mma_layout
from b12x_core.weights import DeviceWeights, input_scale_of, mma_activation_factor, scale_names
from b12x_kernels import interface

FORMATS = list(mma_layout.FORMATS)
CPU = torch.device("cpu")
# a fused layer whose shards merge: the last shard's rows need not fill a tile (FP8_BLOCK: boundaries on 128 rows)
ROWS = {"FP8_BLOCK": (128, 128, 40)}
DEFAULT_ROWS = (32, 16, 24)


def fused(rng, fmt: str, rows, k: int | None = None, input_scale: bool = False, magnitudes=None):
    """Row shards of `fmt` with their own per-tensor factors (formats that have one: random, distinct), K past
    one chunk. Every shard's largest weight is the same (4, the rest within ±3), so their block-scale ranges (the
    layout's scale_mul) agree, unless `magnitudes` scales the shards apart."""
    k = k or math.lcm(2 * geometry.chunk_k(fmt), bf.spec(fmt).k_multiple)
    _, factor = scale_names(fmt)
    out = []
    for i, n in enumerate(rows):
        w = np.clip(rng.standard_normal((n, k)), -3, 3).astype(np.float32)
        w[0, 0] = 4.0
        if magnitudes is not None:
            w *= np.float32(magnitudes[i])
        qw = bf.quantize(w, fmt)
        extra = {}
        if factor is not None:
            extra[factor] = np.float32(rng.uniform(0.25, 4.0)).reshape(np.shape(qw.tensors[factor]))
        if input_scale:
            extra["input_scale"] = np.float32(rng.uniform(0.01, 0.1))
        out.append(bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, **extra}) if extra else qw)
    return out


def row_factors(shard: gemm.MmaShard) -> np.ndarray:
    """float32 [n]: what multiplies each row's sums in the kernel's epilogue (alpha, then row_scale)."""
    rs = np.ones(shard.n, np.float32) if shard.row_scale is None else shard.row_scale.cpu().numpy()
    return np.float32(shard.alpha) * rs


def counting(monkeypatch, name: str, call_through: bool = False) -> list:
    """Replace b12x_kernels.<name> by a recorder of its calls (and, on a GPU, call the kernel too)."""
    calls, kernel = [], getattr(b12x_kernels, name, None)

    def entry(args_bytes, *args, **kw):
        calls.append((args_bytes, args))
        if call_through:
            kernel(args_bytes, *args, **kw)

    monkeypatch.setattr(b12x_kernels, name, entry, raising=False)
    return calls


def mode_of(fmt: str) -> tuple[str, bool]:
    """An activation mode that leaves a per-tensor activation scale to the weight's factors, where the format has
    one (so that scale joins every shard's factor), else bf16; and whether the shards carry input_scale."""
    return {"FP8": ("fp8_static", True), "NVFP4": ("nvfp4", True)}.get(fmt, ("bf16", False))


@pytest.mark.parametrize("fmt", FORMATS)
def test_compatible_shards_are_one_shard_with_each_shards_factor_over_its_rows(rng, fmt, monkeypatch):
    rows = ROWS.get(fmt, DEFAULT_ROWS)
    mode, with_scale = mode_of(fmt)
    parts = fused(rng, fmt, rows, input_scale=with_scale)
    scale = input_scale_of(parts)
    act = mma_activation_factor(mode, scale)
    (merged,) = DeviceWeights(parts, mode, scale, CPU).mma
    separate = gemm.prepare(parts, CPU, act, merge=False)
    assert len(separate) == len(rows)
    assert (merged.row, merged.n, merged.k, merged.chunks) == (0, sum(rows), separate[0].k, separate[0].chunks)
    assert {s.scale_mul for s in separate} == {merged.scale_mul}

    # each row's factor is its shard's: the per-shard launch's alpha as the kernel reads it (float32)
    want = np.concatenate([np.full(s.n, np.float32(s.alpha)) for s in separate])
    np.testing.assert_array_equal(row_factors(merged), want)
    _, factor = scale_names(fmt)
    if fmt == "FP8":  # FP8's alpha is its weight_scale times the static activation scale (no decode shift)
        direct = [np.float32(float(np.asarray(p.tensors[factor]).reshape(-1)[0]) * act) for p in parts]
        np.testing.assert_array_equal(want, np.repeat(direct, rows))
    if factor is not None:  # distinct per-tensor factors: carried per row, alpha 1
        assert merged.alpha == 1.0 and merged.row_scale.dtype == torch.float32
    # the shards' bytes, in order, once
    for name in ("codes", "meta", "meta2", "block_scale"):
        got, parts_of = getattr(merged, name), [getattr(s, name) for s in separate]
        if got is None:
            assert all(p is None for p in parts_of)
        else:
            assert torch.equal(got, torch.cat(parts_of))
    if fmt.startswith("IQ2"):
        assert torch.equal(merged.tables, separate[0].tables)

    # a call: one launch over every row, the row factors in its argument block
    m, n, k = 3, sum(rows), merged.k
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    y = torch.zeros(m, n, dtype=torch.bfloat16)
    config = gemm.MmaConfig(1, 2)
    ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, CPU)
    calls = counting(monkeypatch, "mma_gemm")
    gemm.run(x, [merged], y, None, config, ws, 0)
    assert len(calls) == 1
    block = interface.MmaArgs.from_buffer_copy(calls[0][0])
    assert (block.N, block.ldy, block.alpha) == (n, n, np.float32(merged.alpha))
    assert block.row_scale == (0 if merged.row_scale is None else merged.row_scale.data_ptr())
    assert calls[0][1][2] == y.data_ptr()  # the whole output, from column 0
    calls.clear()
    gemm.run(x, separate, y, None, config, ws, 0)
    assert len(calls) == len(rows)

    staged = torch.empty(wgmma.staged_bytes(fmt, m, k), dtype=torch.uint8)
    wcalls = counting(monkeypatch, "wgmma_gemm")
    wgmma.run(x, [merged], y, None, config, ws, staged, 0)
    assert len(wcalls) == 1
    assert interface.MmaArgs.from_buffer_copy(wcalls[0][0]).row_scale == block.row_scale


@pytest.mark.parametrize(
    "fmt,rows,magnitudes,why",
    [
        ("FP8", (32, 40, 16), None, "multiple of 16"),  # a tile would straddle the 2nd and 3rd shards
        ("IQ2_XS", (16, 8, 16), None, "multiple of 16"),
        ("FP8_BLOCK", (64, 64), None, "multiple of 128"),  # a 128-row scale block would straddle the shards
        # block-scale ranges so far apart that no one scale_mul keeps both shards' decodes exact
        ("MXFP4", (32, 32), (2.0**-110, 2.0**20), "scale_mul"),
    ],
)
def test_shards_whose_layouts_cannot_concatenate_keep_a_launch_each(rng, fmt, rows, magnitudes, why, monkeypatch):
    parts = fused(rng, fmt, rows, magnitudes=magnitudes)
    packed = mma_layout.share_scale_mul([mma_layout.pack(p) for p in parts])
    assert why in mma_layout.merge_blocker(packed)
    with pytest.raises(ValueError, match=why):
        mma_layout.concat_rows(packed)
    shards = DeviceWeights(parts, "bf16", None, CPU).mma
    assert [(s.row, s.n) for s in shards] == [(sum(rows[:i]), r) for i, r in enumerate(rows)]
    assert all(s.row_scale is None for s in shards)
    m, n, k = 2, sum(rows), shards[0].k
    calls = counting(monkeypatch, "mma_gemm")
    config = gemm.MmaConfig(1, 1)
    y = torch.zeros(m, n, dtype=torch.bfloat16)
    gemm.run(torch.zeros(m, k, dtype=torch.bfloat16), shards, y, None, config, None, 0)
    assert [c[1][2] for c in calls] == [y[:, s.row :].data_ptr() for s in shards]  # each its own columns


@pytest.mark.parametrize("fmt", ["MXFP4", "MXFP8"])
def test_shards_with_block_scale_ranges_apart_share_one_scale_mul(rng, fmt):
    """Shards whose largest block scales differ (their own scale_mul differ) still merge: every shard decodes
    exactly under the smallest scale_mul, its products smaller by a power of two its row factor makes up."""
    parts = fused(rng, fmt, DEFAULT_ROWS, magnitudes=(1.0, 4096.0, 2.0**-8))
    separate = gemm.prepare(parts, CPU, merge=False)
    assert len({s.scale_mul for s in separate}) > 1
    (merged,) = gemm.prepare(parts, CPU)
    assert merged.scale_mul == min(s.scale_mul for s in separate)
    want = np.concatenate([np.full(s.n, np.float32(s.alpha * (s.scale_mul / merged.scale_mul))) for s in separate])
    np.testing.assert_array_equal(row_factors(merged), want)
    # what the kernel multiplies by, times each row's factor: the shards' own, bit for bit
    packed = [mma_layout.pack(p) for p in parts]
    whole = mma_layout.concat_rows(mma_layout.share_scale_mul(packed))
    got = effective_weight(whole, None) * row_factors(merged)[:, None].astype(np.float64)
    own = np.concatenate([effective_weight(p, None) * np.float64(np.float32(p.alpha)) for p in packed])
    np.testing.assert_array_equal(got, own)


@pytest.mark.parametrize("fmt", FORMATS)
def test_merged_layout_decodes_to_its_shards_weights_bit_for_bit(rng, fmt):
    """In the numpy model of the kernel's lanes (what it multiplies by, before the factors) and losslessly."""
    parts = fused(rng, fmt, ROWS.get(fmt, DEFAULT_ROWS))
    packed = [mma_layout.pack(p) for p in parts]
    whole = mma_layout.concat_rows(packed)
    tables = mma_layout.iq2_tables(fmt) if fmt.startswith("IQ2") else None
    got = effective_weight(whole, tables)
    want = np.concatenate([effective_weight(p, tables) for p in packed])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    back = mma_layout.unpack(whole)
    for name, value in back.items():
        np.testing.assert_array_equal(value, np.concatenate([mma_layout.unpack(p)[name] for p in packed]))


@pytest.mark.parametrize("fmt", ["FP8", "FP8_BLOCK", "NVFP4", "MXFP4", "Q8_0", "IQ2_XS"])
def test_dequant_gemm_on_a_merged_layout_equals_the_checkpoint_dequantization(rng, fmt):
    """dequantize + cuBLAS reading the shared layout dequantizes the merged shard (per-row factors from the checkpoint)."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip(
            "the Triton interpreter runs without a GPU (the GPU tests hold dequantize + cuBLAS to the reference)"
        )
    from b12x_kernels import tiles

    parts = fused(rng, fmt, ROWS.get(fmt, DEFAULT_ROWS))
    n, k = sum(p.shape[0] for p in parts), parts[0].shape[1]
    weights = DeviceWeights(parts, "bf16", None, CPU)
    stacked = weights.stacked
    want = tiles.dequantize_tiles(fmt, stacked.weight, stacked.scales, stacked.col_scale,
                                  torch.full((n, k), float("nan"), dtype=torch.bfloat16), grid_table=stacked.grid,
                                  sign_table=stacked.signs)  # fmt: skip
    weights.shared_layout = "mma"
    backend = DequantGemm(Query("linear", fmt, "bf16", "bf16", DeviceInfo.of(CPU), n=n, k=k), weights)
    assert len(backend.shards) == 1
    got = torch.full((n, k), float("nan"), dtype=torch.bfloat16)
    backend._dequantize_mma(got)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


GPU_ROWS = (256, 64, 64)
GPU_K = 512
GPU_MS = (1, 5, 37)


def _gpu_case(rng, fmt, backend_class, magnitudes=None):
    parts = fused(rng, fmt, GPU_ROWS, k=GPU_K, magnitudes=magnitudes)
    n = sum(GPU_ROWS)
    device = DeviceInfo.of(torch.device("cuda"))
    q = Query("linear", fmt, "bf16", "bf16", device, n=n, k=GPU_K, max_tokens=max(GPU_MS), shard_rows=GPU_ROWS)
    weights = DeviceWeights(parts, "bf16", None, device.device)
    p = plan.build(q, weights, only=backend_class)
    assert len(weights.mma) == 1  # merged: these shards' layouts concatenate
    return p, weights.mma, gemm.prepare(parts, "cuda", merge=False)


def _poisoned(m, n):
    return torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")


APART = (1.0, 4096.0, 2.0**-8)  # block-scale ranges apart: the shards merge under one shared scale_mul


def _one_launch_equals_the_per_shard_launches(rng, fmt, magnitudes, monkeypatch, backend_class, kernel, launch):
    """The backend's call of a merged fused linear: one `kernel` launch, bit for bit the per-shard launches'
    result (launch(x, shards, y, config, m) runs either list of shards through the backend's form)."""
    p, merged, separate = _gpu_case(rng, fmt, backend_class, magnitudes)
    n = sum(GPU_ROWS)
    for m in GPU_MS:
        x = torch.from_numpy(rng.standard_normal((m, GPU_K)).astype(np.float32)).to("cuda", torch.bfloat16)
        row = p.for_tokens(m)
        config = gemm.MmaConfig.of_plan_row(row.config)
        want, whole = _poisoned(m, n), _poisoned(m, n)
        for shards, y in ((separate, want), (merged, whole)):
            launch(x, shards, y, config, m)
        torch.cuda.synchronize()
        assert not torch.isnan(want).any()
        assert torch.equal(whole.view(torch.int16), want.view(torch.int16)), f"{fmt} M={m} {config}"
        workspace.poison(x.device)
        with monkeypatch.context() as patched:
            calls = counting(patched, kernel, call_through=True)
            got = row.run(x, None)
        torch.cuda.synchronize()
        assert len(calls) == 1, f"{fmt} M={m}: {len(calls)} launches"
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{fmt} M={m} {config}"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,magnitudes", [("FP8", None), ("NVFP4", None), ("MXFP4", None), ("Q8_0", None),
                                            ("IQ2_XS", None), ("MXFP4", APART), ("MXFP8", APART)])  # fmt: skip
def test_gpu_fused_linear_is_one_launch_equal_to_the_per_shard_launches(rng, fmt, magnitudes, monkeypatch):
    def launch(x, shards, y, config, m):
        ws = gemm.MmaWorkspace.create(m, sum(GPU_ROWS), config.splits, config.mt, "cuda", row_tiles=config.tiles)
        gemm.run(x, shards, y, None, config, ws, torch.cuda.current_stream().cuda_stream)

    _one_launch_equals_the_per_shard_launches(rng, fmt, magnitudes, monkeypatch, TensorCoreGemm, "mma_gemm", launch)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,magnitudes", [("FP8", None), ("NVFP4", None), ("MXFP4", None), ("Q8_0", None),
                                            ("MXFP4", APART)])  # fmt: skip
def test_gpu_wgmma_fused_linear_is_one_launch_equal_to_the_per_shard_launches(rng, fmt, magnitudes, monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma_gemm runs on sm_90 (Hopper) only")

    def launch(x, shards, y, config, m):
        ws = gemm.MmaWorkspace.create(m, sum(GPU_ROWS), config.splits, config.mt, "cuda")
        staged = torch.empty(wgmma.staged_bytes(fmt, m, GPU_K), dtype=torch.uint8, device="cuda")
        wgmma.run(x, shards, y, None, config, ws, staged, torch.cuda.current_stream().cuda_stream)

    _one_launch_equals_the_per_shard_launches(rng, fmt, magnitudes, monkeypatch, TensorCoreWgmma, "wgmma_gemm", launch)
