"""The one-launch top-k routing kernel (b12x_kernels.topk_route) against b12x_core's reference (softmax in fp32,
stable descending sort, slice, renormalise).

On CPU the kernel runs in Triton's interpreter (conftest.py) on small shapes; on the GPU (marked gpu) through
bc.route_topk, directly and replayed in a CUDA graph with new logits. Ids must be equal exactly; the logits are
random each run with forced ties (duplicated logits, rows of a few levels, distinct logits whose probabilities
round equal), where ties must go to the lower id as in the reference.

Weights: both sides compute the same formula in fp32 but not the same roundings (exp: numpy's or libdevice's
against torch's, each within 2 ulp; the row sum in another order). Each side's relative error is at most
(2E + k + 16)·2⁻²⁴ (exp 4u in the numerator and in every summand, E − 1 for a sum of E positive terms, u per
division, doubled by renormalising, k − 1 for its sum), so they may differ by twice that: loose against the
one-ulp differences seen, but a wrong expert's weight or a missed renormalisation is off by far more.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from graphs import capture

import b12x_core as bc

pytest.importorskip("triton")

from b12x_core.moe import route_topk_reference  # noqa: E402
from b12x_kernels import topk_route  # noqa: E402

MOE = importlib.import_module("b12x_core.moe")  # the module: `b12x_core.moe` is also the function bc.moe
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rtol(e: int, k: int) -> float:
    return 2 * (2 * e + k + 16) * 2.0**-24


def fused(logits: torch.Tensor, k: int, renormalize: bool):
    """The kernel on poisoned outputs: a slot it fails to write keeps NaN / an id past the experts."""
    t, e = logits.shape
    weights = torch.full((t, k), float("nan"), device=logits.device)
    ids = torch.full((t, k), e + 7, dtype=torch.int32, device=logits.device)
    topk_route.topk_route(logits, k, renormalize, weights, ids)
    return weights, ids


def check(logits: torch.Tensor, k: int, renormalize: bool) -> None:
    weights, ids = fused(logits, k, renormalize)
    ref_w, ref_ids = route_topk_reference(logits, k, renormalize)
    assert torch.equal(ids, ref_ids), (logits, ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=rtol(logits.shape[1], k), atol=0)


def tied_logits(rng, t: int, e: int) -> np.ndarray:
    """Normal logits with ties forced in: random columns copied onto others (ties at every rank, the top
    included), one row of equal logits (every expert ties) and one of a few levels."""
    x = rng.standard_normal((t, e)).astype(np.float32) * rng.uniform(0.5, 4)
    for row in x:
        dst = rng.choice(e, size=rng.integers(1, e // 2 + 2), replace=True)
        row[dst] = row[rng.choice(e, size=dst.size)]
        row[rng.integers(e)] = row.max()  # a tie at the top (or the max itself)
    x[rng.integers(t)] = rng.standard_normal()
    x[rng.integers(t)] = rng.integers(0, 3, size=e)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3, 8])  # 3: padding slots (renormalised over k, not 4)
@pytest.mark.parametrize("e", [8, 60, 128, 256])
def test_matches_reference_with_ties(rng, e, k, renormalize, dtype):
    t = int(rng.choice([1, 5, 19]))  # 19 rows: several programs and a partial last one once E ≥ 256
    logits = torch.from_numpy(tied_logits(rng, t, e)).to(DTYPES[dtype]).to(DEVICE)
    check(logits, k, renormalize)


@pytest.mark.parametrize("e", [8, 128])
def test_few_levels_tie_everywhere(rng, e):
    """Every row draws from four levels: almost every pick is a tie broken by id."""
    logits = torch.from_numpy(rng.integers(0, 4, size=(9, e)).astype(np.float32)).to(DEVICE)
    check(logits, min(8, e), True)


def test_distinct_logits_with_equal_probabilities_go_to_the_lower_id(rng):
    """A logit x and its fp32 successor, far below a row max M of 8–16: x − M rounds the same for both, so their
    probabilities are equal and the reference takes the lower id, which here holds the smaller logit. A kernel
    that ranked logits (not probabilities) would take the higher id."""
    t, e, k = 6, 16, 3
    x = np.full((t, e), -30.0, np.float32)
    low, high = np.zeros(t, int), np.zeros(t, int)
    for r in range(t):
        x[r, 0] = top = np.float32(rng.uniform(8, 16))
        while True:  # a pair whose differences from the max round equal (a rounding boundary rarely splits them)
            base = np.float32(rng.uniform(-0.5, 0.5))
            succ = np.nextafter(base, np.float32(1))
            if base - top == succ - top:
                break
        low[r] = rng.integers(1, e - 1)
        high[r] = rng.integers(low[r] + 1, e)
        x[r, low[r]], x[r, high[r]] = base, succ
    logits = torch.from_numpy(x).to(DEVICE)
    probs, rows = torch.softmax(logits, -1), torch.arange(t)
    assert torch.equal(probs[rows, low], probs[rows, high])  # the construction: equal probabilities
    assert route_topk_reference(logits, k, False)[1][:, 1:].tolist() == np.stack([low, high], 1).tolist()
    check(logits, k, False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf − inf
def test_non_finite_rows_rank_as_the_reference():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[nan, 1, 2, 3], [1, inf, 2, 3], [-inf] * 4, [1, 2, 3, -inf], [-inf, 0, -inf, 0]])
    weights, ids = fused(logits.to(DEVICE), 2, True)
    ref_w, ref_ids = route_topk_reference(logits.to(DEVICE), 2, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, equal_nan=True, rtol=rtol(4, 2), atol=0)


def test_argument_checks_and_empty_batch():
    logits = torch.zeros(3, 4, device=DEVICE)
    w, ids = torch.empty(3, 2, device=DEVICE), torch.empty(3, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="top_k=5 must be in 1..4"):
        topk_route.topk_route(logits, 5, True, w, ids)
    with pytest.raises(ValueError, match=r"ids_out must be a contiguous int32 \[3, 2\]"):
        topk_route.topk_route(logits, 2, True, w, ids.long())
    with pytest.raises(ValueError, match=r"weights_out must be a contiguous float32 \[3, 2\]"):
        topk_route.topk_route(logits, 2, True, w[:2], ids)
    topk_route.topk_route(logits[:0], 2, True, w[:0], ids[:0])  # no launch


def test_strided_logits(rng):
    """Logits as a column slice of a wider tensor (row stride ≠ E) or transposed (column stride ≠ 1)."""
    wide = torch.from_numpy(tied_logits(rng, 7, 96)).to(DEVICE)
    check(wide[:, 16:80], 4, True)
    check(torch.from_numpy(tied_logits(rng, 64, 7)).to(DEVICE).t(), 2, False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test below covers route_topk on CUDA")
def test_route_topk_on_cpu_is_the_reference(rng, monkeypatch):
    monkeypatch.setattr(topk_route, "topk_route", None)  # would raise if called
    logits = torch.from_numpy(tied_logits(rng, 5, 60))
    for got, want in zip(bc.route_topk(logits, 8, True), route_topk_reference(logits, 8, True), strict=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_route_topk_runs_the_kernel_and_replays_in_graphs(rng, monkeypatch, dtype):
    def refuse(*args):
        raise AssertionError("route_topk ran the torch reference on CUDA")

    for e, k, t in ((8, 2, 1), (60, 4, 7), (128, 8, 300), (256, 8, 4096), (512, 10, 33), (4096, 8, 3)):
        logits = torch.from_numpy(tied_logits(rng, t, e)).to(DTYPES[dtype]).cuda()
        for renormalize in (True, False):
            ref_w, ref_ids = route_topk_reference(logits, k, renormalize)
            with monkeypatch.context() as m:
                m.setattr(MOE, "route_topk_reference", refuse)
                w, ids = bc.route_topk(logits, k, renormalize)
                again = bc.route_topk(logits, k, renormalize)
            assert torch.equal(ids, ref_ids), (e, k, t)
            torch.testing.assert_close(w, ref_w, rtol=rtol(e, k), atol=0)
            assert torch.equal(again[0], w) and torch.equal(again[1], ids)  # deterministic
    logits = torch.from_numpy(tied_logits(rng, 64, 128)).to(DTYPES[dtype]).cuda()
    graph, (w, ids) = capture(lambda: bc.route_topk(logits, 8, True))  # a host sync would fail the capture
    for _ in range(3):
        logits.copy_(torch.from_numpy(tied_logits(rng, 64, 128)).to(DTYPES[dtype]))
        w.fill_(float("nan"))
        ids.fill_(-1)
        graph.replay()
        ref_w, ref_ids = route_topk_reference(logits, 8, True)
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(w, ref_w, rtol=rtol(128, 8), atol=0)
