"""A tied LM head: `prepare_tied_linear` runs the linear over a prepared embedding's bytes."""

import gguf
import numpy as np
import pytest
import torch
from closeness import close

import b12x_core as bc
import b12x_formats as bf


def q8_0(rng, v, h):
    return bf.quantize((rng.standard_normal((v, h)) / np.sqrt(h)).astype(np.float32), "Q8_0")


def test_tied_head_computes_the_embedding_matrix_as_a_linear(rng):
    qw = q8_0(rng, 300, 96)
    emb = bc.prepare_embedding(qw)
    head = bc.prepare_tied_linear(emb, max_tokens=16)
    assert (head.format, head.n, head.k, head.max_tokens) == ("Q8_0", 300, 96, 16)
    x = torch.from_numpy(rng.standard_normal((5, 96)).astype(np.float32)).to(torch.bfloat16)
    y = bc.linear(x, head)
    # oracle: gguf's own Q8_0 decode, float64 matmul; the head rounds once to bf16 (half an ulp, 2^-9 relative)
    table = gguf.quants.dequantize(qw.tensors["weight"].reshape(300, -1), gguf.GGMLQuantizationType.Q8_0)
    ref = x.double().numpy() @ table.astype(np.float64).T
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=2**-8, atol=1e-6)
    # the same result as a head prepared from the checkpoint weight itself
    assert torch.equal(y, bc.linear(x, bc.prepare_linear(qw, max_tokens=16)))


def test_tied_head_rejects_other_inputs(rng):
    with pytest.raises(bc.UnsupportedError, match="takes a PreparedEmbedding, got PreparedLinear"):
        bc.prepare_tied_linear(bc.prepare_linear(q8_0(rng, 8, 32)))


def test_tied_head_plan_keeps_to_backends_that_read_the_shared_bytes():
    """On an H200 the tensor-core GEMM (its own repacked layout) declines a tied head, and explain says why."""
    from b12x_core import plan
    from b12x_core.backends import DeviceInfo, Query

    h200 = DeviceInfo(torch.device("cuda", 0), (9, 0), sms=132, smem_kb=227)
    head = Query("linear", "Q8_0", "bf16", "bf16", h200, "auto", 49152, 576, 256, (49152,), shares_bytes=True)
    _, never, decisions = plan.choose(head)
    assert "tensor_core" not in {d.backend.name for d in decisions}
    assert any(name == "tensor_core" and "shares another op's bytes" in why for name, why in never)


@pytest.mark.gpu
def test_tied_head_shares_the_embedding_bytes_on_cuda(rng):
    """The tied head and a linear of its own run different backends (the own linear may take the tensor-core
    GEMM, which a tied head declines): each is held to the reference on its own, not to the other."""
    qw = q8_0(rng, 4096, 576)  # SmolLM2's hidden size: K = 18 blocks
    emb = bc.prepare_embedding(qw, device="cuda")
    head = bc.prepare_tied_linear(emb, max_tokens=256)
    own = bc.prepare_linear(qw, device="cuda", max_tokens=256)
    reference = bc.prepare_linear(qw, device="cpu", max_tokens=256)
    weights = {id(row.backend.weights) for row in head.plan.rows}
    assert len(weights) == 1
    assert next(iter(head.plan.rows)).backend.weights.stacked.weight.data_ptr() == emb.blocks.data_ptr()
    for m in sorted({1, 7, 256} | {row.lo for row in head.plan.rows}):  # every backend and configuration it runs
        x = torch.from_numpy(rng.standard_normal((m, 576)).astype(np.float32)).to(torch.bfloat16)
        ref = bc.linear(x, reference)
        y_head = bc.linear(x.cuda(), head)
        close(y_head, ref)
        close(bc.linear(x.cuda(), own), ref)
        assert torch.equal(bc.linear(x.cuda(), head), y_head)  # deterministic
