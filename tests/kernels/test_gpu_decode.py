"""GPU tests of the decode GEMV kernels (GGML block codecs) and the Q8_0 embedding, against the reference.

Tolerance: the kernels and the reference both sum in fp32, in different orders, then round to bf16:
|y − y_ref| ≤ 1e-2 · max(|y_ref|, rms(y_ref)) + 2^-7·|y_ref| (one bf16 ulp) elementwise, and no NaN.
"""

import numpy as np
import pytest
import torch
from closeness import close
from graphs import capture

import b12x_core as bc
import b12x_formats as bf

pytestmark = pytest.mark.gpu
GGML = ["Q8_0", "IQ2_XXS", "IQ2_XS"]


def random_blocks(rng, fmt, n, k):
    """Random valid GGML blocks (any bytes, finite fp16 d): every grid and sign index gets exercised."""
    s = bf.spec(fmt)
    blocks = rng.integers(0, 256, size=(n, k // s.group_size, s.block_bytes), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, size=blocks.shape[:-1]) / np.sqrt(k) / (40 if fmt != "Q8_0" else 100)).astype(np.float16)
    blocks[..., :2] = d[..., None].view(np.uint8).reshape(*blocks.shape[:-1], 2)
    return bf.QuantizedWeight.from_tensors(fmt, {"weight": blocks})


@pytest.mark.parametrize("fmt", GGML)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 37])
@pytest.mark.parametrize("n,k", [(200, 512), (1000, 4096), (72, 2304)])
def test_gemv_matches_reference(rng, fmt, m, n, k):
    qw = random_blocks(rng, fmt, n, k)
    gpu = bc.prepare_linear(qw, device="cuda", max_tokens=64)
    if m <= 16:
        assert gpu.plan.for_tokens(m).backend.name == "cuda_gemv" or "measured" in gpu.plan.basis, bc.explain(gpu)
    cpu = bc.prepare_linear(qw, device="cpu", max_tokens=64)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    y = bc.linear(x.cuda(), gpu, bias.cuda())
    close(y, bc.linear(x, cpu, bias))
    assert torch.equal(bc.linear(x.cuda(), gpu, bias.cuda()), y)  # deterministic


@pytest.mark.parametrize("fmt", GGML)
def test_kernel_writes_every_output(rng, fmt):
    import b12x_kernels
    from b12x_core.weights import grid_table
    from b12x_formats.kernel_facts import format_id
    from b12x_kernels import interface

    qw = random_blocks(rng, fmt, 300, 1024)
    blocks = torch.from_numpy(qw.tensors["weight"]).cuda()
    grid = grid_table(fmt, "cuda")
    x = torch.randn(5, 1024, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def args_for(max_m):
        return interface.pack(interface.GemvGgmlArgs, format=format_id(fmt), w=blocks.data_ptr(),
                              grid=0 if grid is None else grid.data_ptr(), N=300, K=1024, max_m=max_m, pdl=1)  # fmt: skip

    for max_m in (8, 16):  # any bucket that holds the tokens
        y = torch.full((5, 300), float("nan"), dtype=torch.bfloat16, device="cuda")  # poisoned
        b12x_kernels.gemv_ggml(args_for(max_m), x.data_ptr(), 0, y.data_ptr(), 5, stream)
        close(y, bc.linear(x.cpu(), bc.prepare_linear(qw)))
    with pytest.raises(ValueError, match="M must be in 1..max_m=4"):
        b12x_kernels.gemv_ggml(args_for(4), x.data_ptr(), 0, y.data_ptr(), 5, stream)


@pytest.mark.parametrize("fmt", GGML)
def test_cuda_graph_replay_equals_eager(rng, fmt):
    lin = bc.prepare_linear(random_blocks(rng, fmt, 512, 2048), device="cuda", max_tokens=16)
    x = torch.randn(3, 2048, dtype=torch.bfloat16, device="cuda")
    eager = bc.linear(x, lin)
    graph, captured = capture(lambda: bc.linear(x, lin))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_embedding_matches_reference(rng):
    qw = bf.quantize(rng.standard_normal((777, 320)).astype(np.float32), "Q8_0")
    gpu, cpu = bc.prepare_embedding(qw, device="cuda"), bc.prepare_embedding(qw)
    assert gpu.path == "cuda_embedding_q8_0"
    for dtype in (torch.int32, torch.int64):
        ids = torch.from_numpy(rng.integers(0, 777, size=(4, 9))).to(dtype)
        assert torch.equal(bc.embedding(ids.cuda(), gpu).cpu(), bc.embedding(ids, cpu))


ELEMENT = ["FP8", "FP8_BLOCK", "MXFP8", "NVFP4", "W4A16_NVFP4", "MXFP4"]


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 21])
@pytest.mark.parametrize("n,k", [(200, 512), (136, 2048)])
def test_element_gemv_matches_reference(rng, fmt, m, n, k):
    qw = bf.quantize(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k), fmt)
    gpu = bc.prepare_linear(qw, device="cuda", max_tokens=64)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    y = bc.linear(x.cuda(), gpu, bias.cuda())
    close(y, bc.linear(x, bc.prepare_linear(qw), bias))
    assert torch.equal(bc.linear(x.cuda(), gpu, bias.cuda()), y)


@pytest.mark.parametrize("fmt", ["FP8", "NVFP4"])
def test_element_shards_with_their_own_scales(rng, fmt):
    k = 512
    shards = [
        bf.quantize(rng.standard_normal((rows, k)).astype(np.float32) * (i + 1), fmt)
        for i, rows in enumerate((64, 40, 24))
    ]
    x = torch.randn(5, k, dtype=torch.bfloat16)
    bias = torch.randn(128, dtype=torch.bfloat16)
    y = bc.linear(x.cuda(), bc.prepare_linear(shards, device="cuda"), bias.cuda())
    close(y, bc.linear(x, bc.prepare_linear(shards), bias))


QUANTIZED = [("FP8", "fp8", True), ("FP8", "fp8", False), ("FP8_BLOCK", "fp8", False), ("MXFP8", "mxfp8", False),
             ("MXFP4", "mxfp8", False), ("NVFP4", "mxfp8", False), ("NVFP4", "nvfp4", True)]  # fmt: skip


@pytest.mark.parametrize("fmt,activation,with_scale", QUANTIZED, ids=str)
@pytest.mark.parametrize("m", [1, 3, 16, 21])
def test_quantized_activations_run_the_gemv(rng, fmt, activation, with_scale, m):
    """Every activation mode on the GEMV (its operands bf16-exact, activation scales inside the kernel): the
    M=1 path of W8A8 / MX / NVFP4 checkpoints, against the reference."""
    from b12x_core import plan
    from b12x_core.backends.cuda_gemv import CudaGemv
    from b12x_core.weights import DeviceWeights

    k, n = 512, 200
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    qw = bf.quantize(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k), fmt)
    if with_scale:
        scale = float(x.float().abs().max()) / (6 * 448 if fmt == "NVFP4" else 448)
        qw = bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(scale)})
    gpu = bc.prepare_linear(qw, device="cuda", max_tokens=32, activation=activation)
    assert CudaGemv.can_implement(gpu.plan.query)[0]
    gemv = plan.build(gpu.plan.query, DeviceWeights([qw], gpu.act_mode, gpu.input_scale, gpu.device), only=CudaGemv)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    y = gemv.for_tokens(m).run(x.cuda(), bias.cuda())
    close(y, bc.linear(x, bc.prepare_linear(qw, max_tokens=32, activation=activation), bias))


def test_w8a8_at_one_token_takes_the_gemv_and_the_reference_only_on_request(rng):
    qw = bf.quantize(rng.standard_normal((64, 256)).astype(np.float32), "FP8")
    lin = bc.prepare_linear(qw, device="cuda", activation="fp8", max_tokens=16)
    assert lin.plan.for_tokens(1).backend.name == "cuda_gemv" or "measured" in lin.plan.basis, bc.explain(lin)
    assert bc.prepare_linear(qw, device="cuda", activation="fp8", path="reference").path == "reference"
