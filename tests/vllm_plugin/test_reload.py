"""Re-loading weights into a b12x layer keeps every prepared tensor's address (CUDA graphs captured before the
reload replay on the new weights) and computes with the new weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

import b12x_core as bc  # noqa: E402
import b12x_formats as bf  # noqa: E402
from b12x_vllm._reload import keep_addresses  # noqa: E402


def tensor_addresses(obj, seen=None) -> list[int]:
    """The data pointer of every tensor reachable from a prepared op (its plan, backends, device layouts)."""
    import dataclasses

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [obj.data_ptr()]
    if id(obj) in seen or isinstance(obj, (type, torch.device, str, bytes)):
        return []
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        return [a for x in obj for a in tensor_addresses(x, seen)]
    if isinstance(obj, dict):
        return [a for x in obj.values() for a in tensor_addresses(x, seen)]
    if dataclasses.is_dataclass(obj):
        return [a for f in dataclasses.fields(obj) for a in tensor_addresses(getattr(obj, f.name), seen)]
    if hasattr(obj, "__dict__"):
        return [a for x in vars(obj).values() for a in tensor_addresses(x, seen)]
    return []


@pytest.mark.parametrize("fmt,activation", [("Q8_0", "bf16"), ("NVFP4", "nvfp4"), ("FP8", "fp8")])
def test_linear_reload_keeps_addresses_and_takes_new_weights(rng, fmt, activation):
    def weight():
        qw = bf.quantize(rng.standard_normal((64, 256)).astype(np.float32), fmt)
        if activation == "bf16":
            return qw
        return bf.QuantizedWeight.from_tensors(fmt, {**qw.tensors, "input_scale": np.float32(rng.uniform(0.001, 0.01))})

    first, second = weight(), weight()
    old = bc.prepare_linear(first, activation=activation)
    addresses, handle = tensor_addresses(old), old.handle
    assert addresses
    kept = keep_addresses(old, bc.prepare_linear(second, activation=activation))
    assert kept is old and tensor_addresses(kept) == addresses and kept.handle == handle
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(bc.linear(x, kept), bc.linear(x, bc.prepare_linear(second, activation=activation)))
    if activation != "bf16":  # host-side fields follow the new weights too
        assert kept.input_scale == pytest.approx(float(second.tensors["input_scale"]))


def test_moe_and_embedding_reload(rng):
    def experts(n, k):
        return bf.quantize(rng.standard_normal((4, n, k)).astype(np.float32), "Q8_0")

    w13, w2 = experts(128, 64), experts(64, 64)
    old = bc.prepare_moe(w13, w2, max_tokens=8, top_k=2)
    addresses = tensor_addresses(old)
    new_w13, new_w2 = experts(128, 64), experts(64, 64)
    kept = keep_addresses(old, bc.prepare_moe(new_w13, new_w2, max_tokens=8, top_k=2))
    assert kept is old and tensor_addresses(kept) == addresses
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w, ids = bc.route_topk(torch.randn(3, 4), 2, True)
    assert torch.equal(
        bc.moe(x, w, ids, kept), bc.moe(x, w, ids, bc.prepare_moe(new_w13, new_w2, max_tokens=8, top_k=2))
    )

    emb = bc.prepare_embedding(bf.quantize(rng.standard_normal((10, 64)).astype(np.float32), "Q8_0"))
    table = bf.quantize(rng.standard_normal((10, 64)).astype(np.float32), "Q8_0")
    kept = keep_addresses(emb, bc.prepare_embedding(table))
    assert kept is emb and torch.equal(
        bc.embedding(torch.tensor([1, 9]), kept), bc.embedding(torch.tensor([1, 9]), bc.prepare_embedding(table))
    )


def test_a_changed_layout_takes_the_new_object(rng):
    old = bc.prepare_linear(bf.quantize(rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"))
    new = bc.prepare_linear(bf.quantize(rng.standard_normal((96, 256)).astype(np.float32), "Q8_0"))
    assert keep_addresses(old, new) is new
