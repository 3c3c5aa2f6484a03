"""Q8_0 embedding, capabilities and the registered ops."""

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf


def test_embedding_matches_dequantized_rows(rng):
    qw = bf.quantize(rng.standard_normal((100, 64)).astype(np.float32), "Q8_0")
    emb = bc.prepare_embedding(qw)
    table = torch.from_numpy(bf.dequantize(qw)).to(torch.bfloat16)
    for dtype in (torch.int32, torch.int64):
        ids = torch.from_numpy(rng.integers(0, 100, size=(3, 5))).to(dtype)
        y = bc.embedding(ids, emb)
        assert y.dtype == torch.bfloat16 and y.shape == (3, 5, 64)
        assert torch.equal(y, table[ids.long()])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 100\), got \[0, 100\]"):
        bc.embedding(torch.tensor([0, 100]), emb)
    with pytest.raises(ValueError, match="ids .* has dtype torch.float32"):
        bc.embedding(torch.tensor([0.0]), emb)
    with pytest.raises(bc.UnsupportedError, match=r"embedding supports Q8_0 weights \[V, H\], got IQ2_XS"):
        bc.prepare_embedding(bf.quantize(rng.standard_normal((8, 256)).astype(np.float32), "IQ2_XS"))
    compiled = torch.compile(lambda i: bc.embedding(i, emb), fullgraph=True, backend="aot_eager")
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(compiled(ids), bc.embedding(ids, emb))


def test_capabilities_cpu_lists_everything_as_reference():
    caps = bc.capabilities("cpu")
    linear = {(c.format, c.activation) for c in caps if c.op == "linear"}
    assert linear == {(f, a) for f in bf.FORMATS for a in bf.spec(f).activations}
    assert {(c.format, c.activation) for c in caps if c.op == "moe"} >= {
        ("MXFP4", "mxfp8"),
        ("NVFP4", "nvfp4"),
        ("IQ2_XS", "bf16"),
    }
    assert ("embedding", "Q8_0", "bf16") in {(c.op, c.format, c.activation) for c in caps}
    assert all(c.path == "reference" for c in caps)
    text = repr(caps)
    assert all(f in text for f in bf.FORMATS)


def test_ops_are_registered():
    for name in ("linear", "moe", "embedding", "route_topk"):
        assert hasattr(torch.ops.b12x, name)


def test_plan_is_logged_once_per_layer_kind(rng, caplog):
    import logging

    n = int(rng.integers(8, 4096)) * 32  # a shape no other test prepares: its first plan logs
    qw = bf.QuantizedWeight.from_tensors("Q8_0", {"weight": np.zeros((1, n // 32, 34), np.uint8)})
    with caplog.at_level(logging.INFO, logger="b12x_core"):
        bc.prepare_linear(qw, max_tokens=3)  # max_tokens does not change the plan: one line
        bc.prepare_linear(qw, max_tokens=5)
    lines = [r.getMessage() for r in caplog.records if "linear Q8_0 × bf16" in r.getMessage()]
    assert len(lines) == 1 and "-> reference" in lines[0]
