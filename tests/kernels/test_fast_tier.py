"""The fast GPU tier (`nox -s gpu -- --fast`, marked `fast`): every backend alone on every format it serves (and on
each copy of the weight it can read), one activation mode each (bf16 where it runs it, else its first quantized
mode), at two token counts, against the CPU reference; the dispatched linear and MoE replayed in a CUDA graph; two
streams at once.

The cases are listed from the registry and an H200's device facts, so a new backend or format joins the tier
without an edit here; on the device each case asks its backend again, with the real device's facts, and skips
(saying why) where it cannot run there. Tolerances as the full tests (closeness.py): both sides sum in fp32 in
different orders and round to bf16; MoE is held to the reference on the weights the kernels multiply
(test_moe_tiles.bf16_weights) with the quantizer flips bounded (test_moe_tiles.quantizer_flips).
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

from test_mma_moe import kernel_reference  # noqa: E402
from test_moe_tiles import alone as moe_alone  # noqa: E402
from test_moe_tiles import bf16_weights, problem, quantizer_flips  # noqa: E402
from test_tiles import alone as linear_alone  # noqa: E402
from test_tiles import make_weight  # noqa: E402

from b12x_core import backends, workspace  # noqa: E402
from b12x_core.backends import DeviceInfo, MoEShape, Query  # noqa: E402
from b12x_core.backends.tensor_core_moe import TensorCoreMoE  # noqa: E402
from b12x_core.moe import MOE_FORMATS  # noqa: E402
from b12x_core.recipe import activation_mode  # noqa: E402
from b12x_core.tensor_core import layout as mma_layout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.fast]

H200 = DeviceInfo(torch.device("cuda", 0), (9, 0), sms=132, smem_kb=227)
N, K = 256, 512  # a small layer (the tensor-core GEMM may split no K: no scratch at all for bf16 activations)
LINEAR_MS = (1, 37)
E, H, INTER, TOP_K = 8, 512, 256, 2
MOE_TS = (1, 37)
QUANTIZED_MODES = ("fp8", "mxfp8", "nvfp4")


def _scaled(fmt: str, activation: str) -> bool:
    """Whether the case's checkpoint carries an input_scale: nvfp4 needs one, FP8 × fp8 runs static with it."""
    return activation == "nvfp4" or (activation == "fp8" and fmt == "FP8")


def _linear_query(fmt: str, activation: str, device: DeviceInfo) -> Query:
    mode = activation_mode(fmt, activation, _scaled(fmt, activation))
    return Query("linear", fmt, activation, mode, device, "auto", N, K, max(LINEAR_MS), (N,))


def _linear_activation(cls, fmt: str, device: DeviceInfo) -> str | None:
    """bf16 where the backend runs the format with it, else its first quantized mode; None if none."""
    for activation in ("bf16", *QUANTIZED_MODES):
        if activation in bf.spec(fmt).activations and cls.can_implement(_linear_query(fmt, activation, device))[0]:
            return activation
    return None


def _linear_cases():
    """(backend, format, activation, layout): a backend that reads more than one copy of the weight (dequantize +
    cuBLAS: the checkpoint layout, or the tensor-core layout another backend of the plan holds) runs on each;
    layout None is the backend's own first one."""
    for cls in backends.for_op("linear"):
        if cls.name.startswith("reference"):
            continue
        for fmt in bf.FORMATS:
            activation = _linear_activation(cls, fmt, H200)
            if activation is None:
                continue
            yield pytest.param(cls, fmt, activation, None, id=f"{cls.name}-{fmt}-{activation}")
            for layout in cls.reads[1:]:
                if layout != "mma" or fmt in mma_layout.FORMATS:
                    yield pytest.param(cls, fmt, activation, layout, id=f"{cls.name}@{layout}-{fmt}-{activation}")


def _moe_query(fmt: str, device: DeviceInfo) -> Query:
    shape = MoEShape(E, H, INTER, TOP_K, "silu", "gate_up", "bf16", fmt)
    return Query("moe", fmt, "bf16", "bf16", device, "auto", 2 * INTER, H, max(MOE_TS), moe=shape)


def _moe_cases():
    for cls in backends.for_op("moe"):
        if cls.name.startswith("reference"):
            continue
        for fmt in MOE_FORMATS:
            if cls.can_implement(_moe_query(fmt, H200))[0]:
                yield pytest.param(cls, fmt, id=f"{cls.name}-{fmt}")


def _skip_unless_here(query: Query, cls) -> None:
    ok, why = cls.can_implement(query)
    if not ok:
        pytest.skip(f"{cls.name} cannot run here: {why}")


@pytest.mark.parametrize("cls,fmt,activation,layout", list(_linear_cases()))
def test_every_linear_backend_on_every_format(rng, cls, fmt, activation, layout):
    x = torch.from_numpy(rng.standard_normal((max(LINEAR_MS), K)).astype(np.float32)).to(torch.bfloat16)
    qw = make_weight(rng, fmt, N, K, _scaled(fmt, activation), x)
    _skip_unless_here(_linear_query(fmt, activation, DeviceInfo.of(torch.device("cuda", 0))), cls)
    gpu, ref = linear_alone(cls, qw, activation, "cuda", max(LINEAR_MS), layout=layout)
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
    for m in LINEAR_MS:
        workspace.poison(torch.device("cuda"))  # temporaries must be written before they are read
        row = gpu.for_tokens(m)
        y = row.run(x[:m].cuda(), bias.cuda())
        close(y, bc.linear(x[:m], ref, bias))
        assert torch.equal(row.run(x[:m].cuda(), bias.cuda()), y)  # deterministic


@pytest.mark.parametrize("cls,fmt", list(_moe_cases()))
def test_every_moe_backend_on_every_format(rng, cls, fmt):
    x, w13, w2, weights, ids = problem(rng, fmt, "bf16", "silu", e=E, h=H, inter=INTER, t=max(MOE_TS), top_k=TOP_K)
    kw = dict(activation="silu", max_tokens=max(MOE_TS), top_k=TOP_K, act_format="bf16")
    dispatched = bc.prepare_moe(w13, w2, device="cuda", **kw)
    _skip_unless_here(dispatched.plan.query, cls)
    gpu = moe_alone(dispatched, w13, w2, backend=cls)
    cpu = bc.prepare_moe(w13, w2, **kw)
    # the reference on the weights the kernels multiply (both tensor-core MoE forms decode IQ2 their own way)
    ref = kernel_reference(cpu, gpu.rows[0].backend) if issubclass(cls, TensorCoreMoE) else bf16_weights(cpu)
    for t in MOE_TS:
        args = (x[:t], weights[:t], ids[:t])
        workspace.poison(torch.device("cuda"))
        row = gpu.for_tokens(t)
        y = row.run(*(a.cuda() for a in args))
        close(y.cpu(), ref(*args), slack=quantizer_flips(*args, ref))
        assert torch.equal(row.run(*(a.cuda() for a in args)), y)


def test_embedding_on_the_gpu(rng):
    qw = bf.quantize(rng.standard_normal((300, 256)).astype(np.float32), "Q8_0")
    gpu, cpu = bc.prepare_embedding(qw, device="cuda"), bc.prepare_embedding(qw)
    ids = torch.from_numpy(rng.integers(0, 300, size=(3, 5)))
    assert torch.equal(bc.embedding(ids.cuda(), gpu).cpu(), bc.embedding(ids, cpu))


def test_dispatched_linear_and_moe_replay_in_one_graph(rng):
    """What vLLM captures: the plans' own picks, replayed on new inputs, equal to eager calls."""
    x = torch.from_numpy(rng.standard_normal((3, K)).astype(np.float32)).to(torch.bfloat16).cuda()
    lin = bc.prepare_linear(make_weight(rng, "NVFP4", N, K, False, x), device="cuda", max_tokens=16)
    xm, w13, w2, weights, ids = problem(rng, "MXFP4", "bf16", "silu", e=E, h=H, inter=INTER, t=3, top_k=TOP_K)
    moe = bc.prepare_moe(w13, w2, device="cuda", activation="silu", max_tokens=16, top_k=TOP_K)
    xm, weights, ids = xm.cuda(), weights.cuda(), ids.cuda()
    graph, (y_lin, y_moe) = capture(lambda: (bc.linear(x, lin), bc.moe(xm, weights, ids, moe)))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        xm.copy_(torch.randn_like(xm))
        ids.copy_(torch.randint(0, E, ids.shape, device="cuda", dtype=ids.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_lin, bc.linear(x, lin))
        assert torch.equal(y_moe, bc.moe(xm, weights, ids, moe))
