"""torch.ops.b12x.* check their arguments as the Python functions do: a float32 or integer x, a tensor on the
wrong device or more tokens than max_tokens raise the same error from the raw op as from bc.linear / bc.moe /
bc.embedding (on CUDA a wrongly typed pointer would otherwise be read as bf16)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf


def same_error(python_call, raw_call):
    with pytest.raises(ValueError) as expected:
        python_call()
    with pytest.raises(type(expected.value), match=f"^{__import__('re').escape(str(expected.value))}$"):
        raw_call()
    return expected.value


@pytest.fixture
def lin(rng):
    qw = bf.quantize(rng.standard_normal((16, 64)).astype(np.float32), "Q8_0")
    return bc.prepare_linear(qw, max_tokens=4)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(2, 64),  # float32
        torch.zeros(2, 64, dtype=torch.int32),
        torch.zeros(2, 64, dtype=torch.bfloat16, device="meta"),  # another device
        torch.zeros(5, 64, dtype=torch.bfloat16),  # more tokens than max_tokens
        torch.zeros(2, 32, dtype=torch.bfloat16),  # wrong K
    ],
    ids=["float32", "int32", "meta", "5-tokens", "K=32"],
)
def test_raw_linear_validates_like_bc_linear(lin, x):
    same_error(lambda: bc.linear(x, lin), lambda: torch.ops.b12x.linear(x, lin.handle, None))


def test_raw_linear_checks_bias(lin):
    x, bias = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    same_error(lambda: bc.linear(x, lin, bias), lambda: torch.ops.b12x.linear(x, lin.handle, bias))


def test_raw_moe_and_embedding_validate_like_python(rng):
    w13 = bf.quantize(rng.standard_normal((2, 64, 32)).astype(np.float32), "Q8_0")
    w2 = bf.quantize(rng.standard_normal((2, 32, 32)).astype(np.float32), "Q8_0")
    moe = bc.prepare_moe(w13, w2, top_k=1, max_tokens=2)
    weights, ids = torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.int32)
    for x in (torch.zeros(2, 32), torch.zeros(3, 32, dtype=torch.bfloat16)):
        n = x.shape[0]
        same_error(lambda x=x, n=n: bc.moe(x, weights[:n], ids[:n], moe),
                   lambda x=x, n=n: torch.ops.b12x.moe(x, weights[:n], ids[:n], moe.handle))  # fmt: skip
    emb = bc.prepare_embedding(bf.quantize(rng.standard_normal((10, 32)).astype(np.float32), "Q8_0"))
    ids = torch.zeros(3)
    same_error(lambda: bc.embedding(ids, emb), lambda: torch.ops.b12x.embedding(ids, emb.handle))
