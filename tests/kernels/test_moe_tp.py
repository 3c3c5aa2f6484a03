"""Tensor-parallel fused MoE over two GPUs of one host: each rank runs its shard of the
intermediate dimension (whole blocks, bc.shard_moe_weights) with the CUDA MoE path, NCCL all-reduces the
partial outputs, and the sum matches the unsharded MoE run on one GPU."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]
CASES = [("MXFP4", "mxfp8"), ("NVFP4", "bf16"), ("IQ2_XS", "bf16"), ("Q8_0", "bf16")]


def _rank(rank: int, port: int, fmt: str, act: str, seed: int, out: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    w13, w2, x, weights, ids = _problem(fmt, seed)
    s13, s2 = bc.shard_moe_weights(w13, w2, rank, 2)
    p = bc.prepare_moe(s13, s2, max_tokens=x.shape[0], top_k=2, act_format=act, device=f"cuda:{rank}")
    y = bc.moe(x.cuda(rank), weights.cuda(rank), ids.cuda(rank), p).float()
    partials = [torch.empty_like(y) for _ in range(2)]
    dist.all_gather(partials, y)  # for the test's bound only
    dist.all_reduce(y)
    if rank == 0:
        torch.save({"summed": y.cpu(), "partials": [t.cpu() for t in partials]}, out)
    dist.destroy_process_group()


def _problem(fmt: str, seed: int):
    rng = np.random.default_rng(seed)
    e, h, inter, t = 8, 512, 512, 37
    w13 = bf.quantize((rng.standard_normal((e, 2 * inter, h)) / np.sqrt(h)).astype(np.float32), fmt)
    w2 = bf.quantize((rng.standard_normal((e, h, inter)) / np.sqrt(inter)).astype(np.float32), fmt)
    x = torch.from_numpy(rng.standard_normal((t, h)).astype(np.float32)).to(torch.bfloat16)
    weights, ids = bc.route_topk(torch.from_numpy(rng.standard_normal((t, e)).astype(np.float32)), 2)
    return w13, w2, x, weights, ids


@pytest.mark.parametrize("fmt,act", CASES)
def test_two_gpu_shards_all_reduce_to_unsharded(tmp_path, rng, fmt, act):
    import torch.multiprocessing as mp

    seed = int(rng.integers(1 << 30))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "y.pt")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off: not every host's driver allows it
    mp.start_processes(_rank, args=(port, fmt, act, seed, out), nprocs=2, start_method="spawn")
    saved = torch.load(out)
    summed, partials = saved["summed"], saved["partials"]
    w13, w2, x, weights, ids = _problem(fmt, seed)
    full = bc.moe(x.cuda(), weights.cuda(), ids.cuda(), bc.prepare_moe(w13, w2, max_tokens=x.shape[0], top_k=2,
                                                                        act_format=act, device="cuda")).float().cpu()  # fmt: skip
    assert torch.equal(summed, partials[0] + partials[1])
    # each rank and the unsharded run round to bf16 once: half an ulp = 2^-9 of each, doubled for float32
    # reassociation (as tests/core/test_moe.py); the halves see the same activation groups, whole blocks
    bound = 2**-8 * (partials[0].abs() + partials[1].abs() + full.abs())
    assert ((summed - full).abs() <= bound).all(), ((summed - full).abs() - bound).max()
