"""The Triton-backed linear backends (tiles, dequantize + bf16 GEMM, fp8 _scaled_mm), every format × activation mode,
against the b12x-core reference.

On the GPU (marked gpu) each backend alone through a plan of that backend only, at M ∈ {5, 17, 64, 300, 2048},
and the dispatched bc.linear; on CPU the same kernels under TRITON_INTERPRET=1 (conftest.py) on small shapes.

Tolerance: the tiles round each decoded weight to bf16 (exact for e4m3, e2m1·e4m3, e4m3·2^e; one rounding of
d·q for Q8_0 and IQ2) and sum in fp32 in another order than the reference, which rounds once:
|y − y_ref| ≤ 1e-2 · max(|y_ref|, rms(y_ref)) + 2^-7·|y_ref| (one bf16 ulp) elementwise, and no NaN (outputs
are poisoned first).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from closeness import close
from graphs import capture

import b12x_core as bc
import b12x_formats as bf

pytest.importorskip("triton")

from b12x_core import backends, plan, workspace  # noqa: E402
from b12x_core.backends.cublas import DequantGemm, ScaledMM  # noqa: E402
from b12x_core.backends.triton_tiles import TritonTiles, tile_config  # noqa: E402
from b12x_core.weights import DeviceWeights, as_shards, stack  # noqa: E402

# (format, activation, input_scale present); K where the format allows one that is no multiple of 128
CASES = [(f, "bf16", False) for f in bf.FORMATS] + [
    ("FP8", "fp8", True), ("FP8", "fp8", False), ("FP8_BLOCK", "fp8", False), ("MXFP8", "mxfp8", False),
    ("MXFP4", "mxfp8", False), ("NVFP4", "mxfp8", False), ("NVFP4", "nvfp4", True),
]  # fmt: skip
ODD_K = {"FP8": 200, "FP8_BLOCK": 200, "MXFP8": 160, "MXFP4": 160, "NVFP4": 144, "W4A16_NVFP4": 144, "Q8_0": 160}


def make_weight(rng, fmt, n, k, with_input_scale, x, shards=1):
    """Random weight (shards with their own per-tensor scales when shards > 1)."""
    parts = []
    for i in range(shards):
        w = (rng.standard_normal((n, k)) / np.sqrt(k) * (1 + i)).astype(np.float32)
        qw = bf.quantize(w, fmt)
        if with_input_scale:
            amax = float(x.float().abs().max())
            scale = amax / (6 * 448) if fmt.endswith("NVFP4") else amax / 448
            qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(scale * (1 + i))})
        parts.append(qw)
    return parts[0] if shards == 1 else parts


def alone(backend, qw, activation, device, max_tokens, warm=True, layout=None):
    """A plan of one backend for every token count (what bc.prepare_linear builds on `device`, the choice
    forced), and the CPU reference's prepared linear; `layout` (one of backend.reads) makes the backend read that
    copy of the weight, as a plan sharing it with another backend does."""
    lin = bc.prepare_linear(qw, device=device, max_tokens=max_tokens, activation=activation)
    weights = DeviceWeights(as_shards(qw), lin.act_mode, lin.input_scale, lin.device)
    if layout is not None:
        weights.shared_layout = layout
    ref = lin if lin.device.type == "cpu" else bc.prepare_linear(qw, max_tokens=max_tokens, activation=activation)
    return plan.build(lin.plan.query, weights, only=backend, warm=warm), ref


def interpreted(x, qw, activation, bias, backend=TritonTiles):
    """A backend on CPU tensors (interpreter) and the reference: (y, y_ref)."""
    tiles, ref = alone(backend, qw, activation, "cpu", x.shape[0], warm=False)
    return tiles.for_tokens(x.shape[0]).run(x, bias), bc.linear(x, ref, bias)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,activation,with_scale", CASES, ids=str)
def test_interpreted_tiles_match_reference(rng, fmt, activation, with_scale):
    k = ODD_K.get(fmt, 512)
    x = torch.from_numpy(rng.standard_normal((20, k)).astype(np.float32)).to(torch.bfloat16)
    qw = make_weight(rng, fmt, 72, k, with_scale, x)
    bias = torch.from_numpy(rng.standard_normal(72).astype(np.float32)).to(torch.bfloat16)
    close(*interpreted(x, qw, activation, bias))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,activation,with_scale", CASES, ids=str)
def test_interpreted_large_m_paths_match_reference(rng, fmt, activation, with_scale):
    """Dequantize + bf16 GEMM (bf16-exact activations, static fp8 included) and fp8 _scaled_mm (FP8 W8A8), wherever
    they can run the pair."""
    k = ODD_K.get(fmt, 512)
    k += (-k) % 16 if fmt == "FP8" else 0  # _scaled_mm's fp8 layouts want K % 16 == 0
    x = torch.from_numpy(rng.standard_normal((20, k)).astype(np.float32)).to(torch.bfloat16)
    qw = make_weight(rng, fmt, 80, k, with_scale, x)
    bias = torch.from_numpy(rng.standard_normal(80).astype(np.float32)).to(torch.bfloat16)
    mode = bc.prepare_linear(qw, activation=activation).act_mode
    runs = [b for b in (DequantGemm, ScaledMM) if mode in {DequantGemm: ("bf16", "mxfp8", "nvfp4", "fp8_static"),
                                                           ScaledMM: ("fp8_static", "fp8_token")}[b]]  # fmt: skip
    if fmt != "FP8":
        runs = [b for b in runs if b is not ScaledMM]
    if not runs:
        pytest.skip(f"no cuBLAS-backed backend runs {fmt} × {mode}")
    for backend in runs:
        close(*interpreted(x, qw, activation, bias, backend))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt", bf.FORMATS)
def test_interpreted_dequantize_matches_formats(rng, fmt):
    """The large-M path's weight: decode · scales, rounded once to bf16 (FP8_BLOCK: 72 rows, 200 columns)."""
    check_dequantize(rng, fmt, "cpu")


def check_dequantize(rng, fmt, device):
    from b12x_kernels import tiles

    k = ODD_K.get(fmt, 512)
    qw = make_weight(rng, fmt, 72, k, False, None)
    tw = stack([qw], "bf16", None, device)
    out = torch.full((72, k), float("nan"), dtype=torch.bfloat16, device=device)  # poisoned
    tiles.dequantize_tiles(fmt, tw.weight, tw.scales, tw.col_scale, out, grid_table=tw.grid, sign_table=tw.signs)
    expect = torch.from_numpy(bf.dequantize(qw))
    assert not out.isnan().any()
    assert ((out.float().cpu() - expect).abs() <= 2**-8 * expect.abs()).all()  # one bf16 rounding


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests below run the compiled kernels")
@pytest.mark.parametrize("fmt,activation", [("FP8", "fp8"), ("FP8_BLOCK", "bf16"), ("NVFP4", "nvfp4")])
def test_interpreted_fused_shards(rng, fmt, activation):
    """Shards with their own per-tensor scales (72 rows: FP8_BLOCK's 128-row blocks do not line up)."""
    x = torch.from_numpy(rng.standard_normal((17, 256)).astype(np.float32)).to(torch.bfloat16)
    parts = make_weight(rng, fmt, 72, 256, activation != "bf16", x, shards=2)
    close(*interpreted(x, parts, activation, None))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,activation,with_scale", CASES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 17, 64, 300, 2048])  # 1: every format holds (and quantizes) its activations
def test_gpu_backends_match_reference(rng, fmt, activation, with_scale, m):
    """Every backend that can run the pair on this GPU, alone, and the dispatched bc.linear (whatever its plan
    picks at m) against the CPU reference; outputs deterministic."""
    k = ODD_K.get(fmt, 1024) if m < 300 else 2048  # odd K: the backends with alignment rules step aside
    n = 328
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    qw = make_weight(rng, fmt, n, k, with_scale, x)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    gpu = bc.prepare_linear(qw, device="cuda", max_tokens=m, activation=activation)
    cpu = bc.prepare_linear(qw, device="cpu", max_tokens=m, activation=activation)
    expect = bc.linear(x, cpu, bias)
    runnable = [cls for cls in backends.for_op("linear") if cls.can_implement(gpu.plan.query)[0]]
    assert TritonTiles in runnable
    for backend in runnable:
        single, _ = alone(backend, qw, activation, "cuda", m)
        workspace.poison(gpu.device)  # quantized activations and workspace must be written before they are read
        y = single.for_tokens(m).run(x.cuda(), bias.cuda())
        close(y, expect)
        assert torch.equal(single.for_tokens(m).run(x.cuda(), bias.cuda()), y), backend.name  # deterministic
    close(bc.linear(x.cuda(), gpu, bias.cuda()), expect)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", bf.FORMATS)
def test_gpu_dequantize_matches_formats(rng, fmt):
    check_dequantize(rng, fmt, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["Q8_0", "IQ2_XS", "NVFP4", "FP8_BLOCK"])
def test_gpu_tiles_write_every_output_and_replay_in_graphs(rng, fmt):
    from b12x_kernels import tiles

    x = torch.randn(300, 1024, dtype=torch.bfloat16, device="cuda")
    qw = make_weight(rng, fmt, 200, 1024, False, x)
    lin = bc.prepare_linear(qw, device="cuda", max_tokens=300)
    tw = stack([qw], "bf16", None, "cuda")
    y = torch.full((300, 200), float("nan"), dtype=torch.bfloat16, device="cuda")  # poisoned
    tiles.linear_tiles(fmt, x, tw.weight, tw.scales, tw.col_scale, y, grid_table=tw.grid, sign_table=tw.signs,
                       config=tile_config(300, 200, torch.cuda.get_device_properties(0).multi_processor_count))  # fmt: skip
    close(y, bc.linear(x.cpu(), bc.prepare_linear(qw)))
    eager = bc.linear(x, lin)
    graph, out = capture(lambda: bc.linear(x, lin))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fmt,activation", [("FP8", "fp8"), ("FP8_BLOCK", "bf16"), ("NVFP4", "nvfp4"), ("Q8_0", "bf16")]
)
def test_gpu_fused_shards(rng, fmt, activation):
    x = torch.randn(64, 512, dtype=torch.bfloat16)
    parts = make_weight(rng, fmt, 200, 512, activation != "bf16", x, shards=2)
    ref = bc.prepare_linear(parts, activation=activation, max_tokens=64)
    for backend in backends.for_op("linear"):  # each reads the shards' own per-tensor scales
        if backend.can_implement(bc.prepare_linear(parts, device="cuda", activation=activation).plan.query)[0]:
            single, _ = alone(backend, parts, activation, "cuda", 64)
            for m in (3, 64):
                close(single.for_tokens(m).run(x[:m].cuda(), None), bc.linear(x[:m], ref))


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_activation_quantization_kernel_is_bit_exact(rng, mode, device):
    """The fused mxfp8/nvfp4 activation quantizer against b12x_core.activations, bit for bit (zero groups,
    magnitudes over 12 decades)."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter runs without a GPU")
    from b12x_core.activations import nvfp4_values, quantize_activation
    from b12x_kernels import act_quant

    x = torch.from_numpy(rng.standard_normal((37, 384)) * np.logspace(-6, 6, 384)).to(torch.bfloat16)
    x[3], x[5, :32] = 0, 0
    input_scale = float(rng.uniform(1e-3, 1e-1))
    global_scale = float(np.float32(1) / np.float32(input_scale))
    out = torch.full_like(x, float("nan"), device=device)
    act_quant.quantize_activation(x.to(device), mode, out, global_scale)
    expect = quantize_activation(x, mode) if mode == "mxfp8" else nvfp4_values(x, input_scale)
    assert torch.equal(out.cpu(), expect.to(torch.bfloat16))


@pytest.mark.parametrize("mode", ["fp8_static", "fp8_token", "fp8_group128"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("k", [300, 2500])  # within one step of a per-token program, and several with a tail
@pytest.mark.parametrize("m", [5, 70])  # fp8_token: rows split over K slices (few tokens), one program a row
def test_fp8_quantization_kernel_is_bit_exact(rng, mode, device, k, m):
    """The fused fp8 activation quantizer against b12x_core.activations.fp8_operands: codes and scales bit for
    bit (saturation, an all-zero token, K not a multiple of 128)."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter runs without a GPU")
    from b12x_core.activations import fp8_operands
    from b12x_kernels import act_quant

    x = torch.from_numpy(rng.standard_normal((m, k)) * np.logspace(-4, 3, k)).to(torch.bfloat16)
    x[2] = 0
    static = float(np.float32(x.float().abs().max() / 448 / 3))  # a third of the values saturate
    q = torch.full((m, k), 0x7F, dtype=torch.uint8, device=device)  # poisoned: e4m3 NaN
    shape = {"fp8_static": None, "fp8_token": (m,), "fp8_group128": (m, -(-k // 128))}[mode]
    scale = None if shape is None else torch.full(shape, float("nan"))  # poisoned
    scale = None if scale is None else scale.to(device)
    act_quant.quantize_fp8(x.to(device), mode, q, scale, static)
    codes, row, groups = fp8_operands(x, mode, static)
    assert torch.equal(q.cpu().view(torch.float8_e4m3fn).float(), codes.float())
    if scale is not None:
        assert torch.equal(scale.cpu(), row if row is not None else groups)


@pytest.mark.parametrize("mode", ["fp8_static", "fp8_token", "fp8_group128"])
@pytest.mark.parametrize("values", [False, True], ids=["codes", "values"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("m,rows", [(1, 16), (5, 16), (33, 48), (70, 80), (16, 16)])  # 70: one program a token
def test_fp8_quantization_kernel_writes_padding_rows(rng, mode, values, device, m, rows):
    """quantize_fp8(rows=...) in its one launch: rows < M as without it (fp8_operands, bit for bit), rows M..rows-1
    as all-zero tokens (zero codes, unit scales; fp8_static's scale column holds its scale in every row). The
    outputs are poisoned first, so a row the kernel skips fails; fp8_group128's scales are written through the
    transposed (column-major) view BlockScaledMM hands it."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter runs without a GPU")
    from b12x_core.activations import fp8_operands
    from b12x_kernels import act_quant

    k = 300  # a partial last 128-group
    x = torch.from_numpy(rng.standard_normal((m, k)) * np.logspace(-3, 2, k)).to(torch.bfloat16)
    static = float(np.float32(x.float().abs().max() / 448 / 2))
    if values:
        q = torch.full((rows, k), float("nan"), dtype=torch.bfloat16, device=device)
    else:
        q = torch.full((rows, k), 0xFF, dtype=torch.uint8, device=device)  # e4m3 NaN
    if mode == "fp8_group128":
        scale = torch.full((-(-k // 128), rows), float("nan"), device=device).t()  # column-major [rows, groups]
    else:
        scale = torch.full((rows, 1), float("nan"), device=device)
    act_quant.quantize_fp8(x.to(device), mode, q, scale, static, rows=rows)
    codes, row, groups = fp8_operands(x, mode, static)
    got = q.cpu().float() if values else q.cpu().view(torch.float8_e4m3fn).float()
    assert torch.equal(got[:m], codes.float())
    assert torch.equal(got[m:], torch.zeros(rows - m, k))
    scale = scale.cpu()
    if mode == "fp8_static":
        assert torch.equal(scale, torch.full((rows, 1), static))
    else:
        expect = row.reshape(m, 1) if row is not None else groups
        assert torch.equal(scale[:m], expect)
        assert torch.equal(scale[m:], torch.ones(rows - m, scale.shape[1]))


def test_fp8_quantization_kernel_rejects_too_few_rows():
    """rows below M, or outputs shorter than rows, stop before a launch (a kernel would drop tokens or write past
    its buffers)."""
    from b12x_kernels import act_quant

    x = torch.zeros(5, 128, dtype=torch.bfloat16)
    q, scale = torch.zeros(16, 128, dtype=torch.uint8), torch.zeros(16, 1)
    with pytest.raises(ValueError, match=r"rows \(4\) must be at least the 5 tokens"):
        act_quant.quantize_fp8(x, "fp8_token", q, scale, rows=4)
    with pytest.raises(ValueError, match="fewer than the 32 rows"):
        act_quant.quantize_fp8(x, "fp8_token", q, scale, rows=32)
    with pytest.raises(ValueError, match="fewer than the 16 rows"):
        act_quant.quantize_fp8(x, "fp8_token", q, scale[:8], rows=16)
    with pytest.raises(ValueError, match="scale_out is required"):
        act_quant.quantize_fp8(x, "fp8_group128", q, None, rows=16)


def check_fp8_gemm_backends(rng, device, m):
    """ScaledMM (fp8_static, fp8_token) and BlockScaledMM (fp8_group128) alone on fused shards of different
    weight (and input) scales, the workspace poisoned first (a padding row the quantizer skips reads as NaN),
    against the CPU reference, and the GEMM's padding rows (the output's base) exactly the bias; -> the backends
    that ran."""
    from b12x_core.backends.cublas import BlockScaledMM

    k, n = 1024, 256  # K/128 a multiple of 4 and shards in whole 128-blocks (BlockScaledMM's layout rules)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    bias = torch.from_numpy(rng.standard_normal(2 * n).astype(np.float32)).to(torch.bfloat16)
    ran = []
    for fmt, with_scale, backend in (("FP8", True, ScaledMM), ("FP8", False, ScaledMM),
                                     ("FP8_BLOCK", False, BlockScaledMM)):  # fmt: skip
        parts = make_weight(rng, fmt, n, k, with_scale, x, shards=2)
        query = bc.prepare_linear(parts, device=device, max_tokens=m, activation="fp8").plan.query
        if (device == "cpu" and backend is BlockScaledMM) or (device == "cuda" and not backend.can_implement(query)[0]):
            continue  # CPU: torch has row-wise scaled_mm there, not the block-wise one
        single, ref = alone(backend, parts, "fp8", device, m, warm=False)
        for b in (bias, None):
            workspace.poison(torch.device(device))
            y = single.for_tokens(m).run(x.to(device), None if b is None else b.to(device))
            close(y, bc.linear(x, ref, b))
            if y._base is not None:  # the GEMM's padded output: padding rows are zero codes, so bias (or 0) alone
                pad = y._base[m:].float().cpu()
                assert torch.equal(pad, torch.zeros_like(pad) + (0 if b is None else b.float())), backend.name
        ran.append((backend.name, query.act_mode))
    return ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test below runs the compiled kernels")
@pytest.mark.parametrize("m", [1, 7, 16, 33])
def test_interpreted_fp8_gemms_pad_in_the_quantizer(rng, m):
    """On CPU, torch._scaled_mm runs row-wise scales (ScaledMM; the block-wise GEMM is CUDA's only)."""
    ran = check_fp8_gemm_backends(rng, "cpu", m)
    assert ("scaled_mm", "fp8_static") in ran and ("scaled_mm", "fp8_token") in ran


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_static_fp8_takes_tensor_wise_scales_where_one_factor_scales_every_row(rng, device):
    """Static activations and one weight factor: a tensor-wise scaled GEMM; fused shards with their own factors
    (or per-token activations) keep row-wise scales. Both match the reference."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    m, k = 33, 256
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    one = make_weight(rng, "FP8", 64, k, True, x)
    fused = make_weight(rng, "FP8", 64, k, True, x, shards=2)  # weight factors differ by shard
    same = [one, bf.QuantizedWeight.from_tensors("FP8", dict(one.tensors))]  # two shards, one factor
    for qw, tensorwise in ((one, True), (same, True), (fused, False)):
        single, ref = alone(ScaledMM, qw, "fp8", device, m, warm=False)
        backend = single.for_tokens(m).backend
        assert (backend.tensorwise is not None) == tensorwise
        workspace.poison(torch.device(device))
        close(single.for_tokens(m).run(x.to(device), None), bc.linear(x, ref))
    token, ref = alone(ScaledMM, make_weight(rng, "FP8", 64, k, False, x), "fp8", device, m, warm=False)
    assert token.for_tokens(m).backend.tensorwise is None  # per-token: a row-wise scale of the tokens
    close(token.for_tokens(m).run(x.to(device), None), bc.linear(x, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 16, 33, 300])
def test_gpu_fp8_gemms_pad_in_the_quantizer(rng, m):
    """Decode- and prefill-sized calls, padded (7, 33, 300) and not (16), eagerly and replayed in a CUDA graph."""
    from b12x_core.backends.cublas import BlockScaledMM

    ran = check_fp8_gemm_backends(rng, "cuda", m)
    assert ("scaled_mm", "fp8_static") in ran and ("scaled_mm", "fp8_token") in ran
    parts = make_weight(rng, "FP8_BLOCK", 256, 1024, False, None, shards=2)
    for backend, qw in ((ScaledMM, make_weight(rng, "FP8", 256, 1024, False, None)), (BlockScaledMM, parts)):
        if backend.can_implement(bc.prepare_linear(qw, device="cuda", activation="fp8").plan.query)[0]:
            single, _ = alone(backend, qw, "fp8", "cuda", m)
            x = torch.randn(m, 1024, dtype=torch.bfloat16, device="cuda")
            eager = single.for_tokens(m).run(x, None)
            graph, out = capture(lambda single=single, x=x: single.for_tokens(m).run(x, None))
            workspace.poison(torch.device("cuda"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, eager), backend.name
