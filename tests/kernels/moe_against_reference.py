"""The GPU check of one fused-MoE backend against the b12x-core reference (test_bsmma_moe.py, test_cutlass_sm90_moe.py):
a plan of that backend alone beside the reference on the same weights, and a call of it against the reference with
the scratch poisoned first, then repeated bit for bit."""

from __future__ import annotations

import torch
from closeness import close
from test_moe_tiles import alone, bf16_weights, prepared_on_cuda, problem, quantizer_flips

import b12x_core as bc
from b12x_core import workspace


def alone_and_reference(rng, fmt, act, activation, order, t, *, backend, experts=8, top_k=2, hidden=512, inter=192,
                        ids=None):  # fmt: skip
    """(`backend` alone, the reference on the same weights, inputs); `ids`: routing forced instead of drawn."""
    x, w13, w2, weights, drawn = problem(rng, fmt, act, activation, e=experts, h=hidden, inter=inter, t=t,
                                         top_k=top_k)  # fmt: skip
    kw = dict(activation=activation, w13_order=order, max_tokens=t, top_k=top_k, act_format=act)
    mine = alone(prepared_on_cuda(w13, w2, **kw), w13, w2, backend=backend)
    ref = bf16_weights(bc.prepare_moe(w13, w2, **kw))
    return mine, ref, (x, weights, drawn if ids is None else ids)


def check_against_reference(mine, ref, x, weights, ids):
    """A call of T = x.shape[0] tokens on the GPU against the reference (closeness.py's tolerance and the quantizer's
    flips), then again: the same bits."""
    t = x.shape[0]
    row = mine.for_tokens(t)
    xc, wc, ic = x.cuda(), weights.cuda(), ids.cuda()
    workspace.poison(torch.device("cuda"))  # every temporary the kernels read, they must have written first
    y = row.run(xc, wc, ic)
    close(y.cpu(), ref(x, weights, ids), slack=quantizer_flips(x, weights, ids, ref))
    workspace.poison(torch.device("cuda"))
    assert torch.equal(row.run(xc, wc, ic), y)  # bit-identical repeats
