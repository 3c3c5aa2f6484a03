"""The plan: properties that hold whatever the measurements say. Every token count maps to exactly one row, and
every row is warmed at prepare; explain lists every row; measured ranges go to the fastest capable backend
(against a brute-force oracle on random tables); an unmeasured GPU gets the defaults, marked as such; each
backend's can_implement says why not. Plans for GPUs that are not here are worked out from a DeviceInfo."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, plan, timings
from b12x_core.backends import Backend, DeviceInfo, Overrides, Query

H200 = DeviceInfo(torch.device("cuda", 0), (9, 0), sms=132, smem_kb=227)
SM120 = DeviceInfo(torch.device("cuda", 0), (12, 0), sms=170, smem_kb=99, block_scaled_mm="not verified here")
CPU = DeviceInfo.of(torch.device("cpu"))
PAIRS = [(f, "bf16") for f in bf.FORMATS] + [("FP8", "fp8_static"), ("FP8", "fp8_token"), ("FP8_BLOCK", "fp8_group128"),
         ("MXFP8", "mxfp8"), ("MXFP4", "mxfp8"), ("NVFP4", "mxfp8"), ("NVFP4", "nvfp4")]  # fmt: skip


def query(fmt, mode, device, max_tokens=4096, n=10240, k=8192, shards=None):
    activation = {"fp8_static": "fp8", "fp8_token": "fp8", "fp8_group128": "fp8"}.get(mode, mode)
    return Query("linear", fmt, activation, mode, device, "auto", n, k, max_tokens, shards or (n,))


@pytest.mark.parametrize("device", [H200, SM120, CPU], ids=lambda d: d.arch)
@pytest.mark.parametrize("fmt,mode", PAIRS, ids=str)
def test_decisions_tile_every_token_count_with_capable_backends(fmt, mode, device):
    max_tokens = 1 + 4096 * (device is not CPU)
    basis, never, decisions = plan.choose(query(fmt, mode, device, max_tokens))
    assert decisions[0].lo == 1 and decisions[-1].hi == max_tokens
    assert all(a.hi + 1 == b.lo for a, b in zip(decisions, decisions[1:], strict=False))
    unable = {name for name, _ in never}
    for d in decisions:
        assert d.backend.can_implement(query(fmt, mode, device, max_tokens))[0] and d.backend.name not in unable
        assert d.why and all(why for _, why in d.lost)
    if device is SM120:  # nothing measured there: the defaults, and the explain basis says so
        assert basis.startswith("conservative defaults")


class Recorder(Backend):
    """A backend that splits its range into configurations of 5 tokens and records the token counts it runs."""

    name, op = "recorder", "linear"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.calls = []

    @classmethod
    def can_implement(cls, query):
        return True, "records"

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return [(a, min(a + 4, hi), {"chunk": (a - 1) // 5}) for a in range(lo, hi + 1, 5)]

    def run(self, x2, bias, *, config):
        self.calls.append((x2.shape[0], config["chunk"]))
        return x2


def test_every_token_count_maps_to_a_warmed_row_and_explain_lists_every_row(rng):
    max_tokens = int(rng.integers(20, 60))
    p = plan.build(query("FP8", "bf16", CPU, max_tokens, n=8, k=8), None, only=Recorder)
    warmed = {chunk for _, chunk in p.rows[0].backend.calls}
    for m in range(1, max_tokens + 1):
        row = p.for_tokens(m)
        assert row.lo <= m <= row.hi and row.config["chunk"] in warmed
    with pytest.raises(bc.UnsupportedError):
        p.for_tokens(max_tokens + 1)
    text = p.explain("header")
    assert all(f"{row.lo}-{row.hi} " in text for row in p.rows)
    m = int(rng.integers(1, max_tokens + 1))
    row = p.for_tokens(m)
    # Decision lines read "lo-hi tokens -> backend"; configuration lines start with their row's range alone.
    config_lines = [
        line.strip()
        for line in p.explain("h", m).splitlines()
        if line.strip()[:1].isdigit() and "tokens ->" not in line
    ]
    assert len(config_lines) == 1 and config_lines[0].startswith(f"{row.lo}-{row.hi} ")


def test_measured_ranges_go_to_the_fastest_capable_backend(rng, monkeypatch):
    """A random table: at each measured M the row's backend is the brute-force minimum over capable backends
    (two weight copies allowed: speed alone decides)."""
    monkeypatch.setenv("B12X_WEIGHT_COPIES", "2")
    ms = tuple(sorted(set(int(v) for v in rng.integers(1, 2000, size=8))))
    names = [cls.name for cls in backends.for_op("linear")] + ["not_a_backend"]
    us = {name: tuple(float(v) for v in rng.uniform(10, 100, size=len(ms))) for name in names}
    entry = timings.Entry((9, 0), "MXFP4", "bf16", "8192x8192", ms, us, "random")
    q = query("MXFP4", "bf16", H200, max_tokens=2048)
    basis, _, decisions = plan.choose(q, entries=(entry,))
    assert basis.startswith("measured")
    able = {cls.name for cls in backends.for_op("linear") if cls.can_implement(q)[0]}
    for p in ms:
        best = min(able, key=lambda name: us[name][ms.index(p)])
        assert next(d for d in decisions if d.lo <= p <= d.hi).backend.name == best, (p, decisions)


def random_table(rng, fmt="MXFP4"):
    ms = tuple(sorted(set(int(v) for v in rng.integers(1, 2000, size=8))))
    names = [cls.name for cls in backends.for_op("linear")]
    us = {name: tuple(float(v) for v in rng.uniform(10, 100, size=len(ms))) for name in names}
    return timings.Entry((9, 0), fmt, "bf16", "8192x8192", ms, us, "random")


@pytest.mark.parametrize("fmt", ["MXFP4", "FP8", "IQ2_XS"])
def test_a_plan_keeps_one_copy_of_the_weight_losing_least(rng, fmt):
    """A random table: the plan's backends share one weight layout, and of the layouts' families it keeps the
    one whose worst ratio to the fastest backend, over the measured M, is smallest (brute force); explain names
    the backends left out and the cost."""
    entry = random_table(rng, fmt)
    q = query(fmt, "bf16", H200, max_tokens=2048)
    able = [cls for cls in backends.for_op("linear") if cls.can_implement(q)[0]]
    basis, _, decisions = plan.choose(q, entries=(entry,))
    chosen = {d.backend for d in decisions}
    assert plan.shared_layout(list(chosen)) is not None

    def fastest(names, p):
        return min(entry.us[name][entry.ms.index(p)] for name in names)

    points = [p for p in entry.ms if p <= 2048]
    everyone = [cls.name for cls in able]
    worst = {}
    for layout in {r for cls in able for r in cls.reads}:
        family = [cls.name for cls in able if layout in cls.reads]
        worst[layout] = max(fastest(family, p) / fastest(everyone, p) for p in points)
    if "one weight copy" in basis:
        got = max(fastest([d.backend.name for d in decisions if d.lo <= p <= d.hi], p) / fastest(everyone, p)
                  for p in points)  # fmt: skip
        assert got == pytest.approx(min(worst.values()))
        left_out = {name for d in decisions for name, why in d.lost if "second copy of the weight" in why}
        assert left_out and left_out.isdisjoint(cls.name for cls in chosen)
    else:  # the fastest per range already shares a layout
        assert all(fastest([d.backend.name], p) == fastest(everyone, p) for p in points for d in decisions
                   if d.lo <= p <= d.hi)  # fmt: skip


def test_a_layout_whose_backends_are_unmeasured_never_wins_the_one_copy_choice(rng):
    """A family measured nowhere must not look free: with every backend of one layout (the CUTLASS GEMM's own, "sm90")
    left out of a random table, the plan keeps a measured family, however the measured ones compare."""
    entry = random_table(rng)
    entry = dataclasses.replace(entry, us={k: v for k, v in entry.us.items() if k != "cutlass_sm90"})
    q = query("MXFP4", "bf16", H200, max_tokens=2048)
    assert any("sm90" in cls.reads for cls in backends.for_op("linear") if cls.can_implement(q)[0])
    _, _, decisions = plan.choose(q, entries=(entry,))
    assert all("sm90" not in d.backend.reads for d in decisions), decisions


def test_two_weight_copies_when_asked_for(rng, monkeypatch):
    entry = random_table(rng)
    entry = dataclasses.replace(entry, us={**entry.us, "tensor_core": (1.0,) + (1e3,) * (len(entry.ms) - 1),
                                           "cuda_gemv": (1e3,) + (1.0,) * (len(entry.ms) - 1)})  # fmt: skip
    q = query("MXFP4", "bf16", H200, max_tokens=2048)
    _, _, one = plan.choose(q, entries=(entry,))
    assert plan.shared_layout(list({d.backend for d in one})) is not None
    monkeypatch.setenv("B12X_WEIGHT_COPIES", "2")
    basis, _, two = plan.choose(q, entries=(entry,))
    assert [d.backend.name for d in two][:2] == ["tensor_core", "cuda_gemv"] and "one weight copy" not in basis


def test_an_unmeasured_key_gets_the_defaults_and_explain_says_so():
    q = query("FP8_BLOCK", "fp8_group128", SM120)
    basis, _, decisions = plan.choose(q, entries=())
    assert "conservative defaults" in basis and "sm_120" in basis
    assert decisions[0].backend.name == "cuda_gemv" and decisions[0].hi == 16  # M=1: the GEMV
    _, _, fp8 = plan.choose(query("FP8", "fp8_token", SM120), entries=())  # FP8 × fp8: SM12x's mma.sync at every M
    assert {d.backend.name for d in fp8} == {"block_scaled_mma"}


@pytest.mark.parametrize("fmt,mode", PAIRS, ids=str)
def test_the_defaults_say_whose_range_covers_which_tokens_and_each_reason_once(fmt, mode):
    """Unmeasured (an RTX 5090), each range's reason names tokens the winner's default range covers, or says that
    no default range of the backends it chose among (those on the plan's copy of the weight) covers them; a loser's
    reason spanning two merged ranges says nothing twice."""
    q = query(fmt, mode, SM120, max_tokens=8192)
    by_name = {cls.name: cls for cls in backends.for_op("linear")}

    def covers(cls, m):
        first, last = cls.default_tokens
        return first <= m and (last is None or m <= last)

    for d in plan.choose(q, entries=())[2]:
        rivals = [by_name[name] for name, why in d.lost if "second copy" not in why]
        for lo, hi, whose in re.findall(r"default (?:order )?for (\d+)(?:-(\d+))? tokens(, which no)?", d.why):
            span = range(int(lo), int(hi or lo) + 1)
            if whose:
                assert not any(covers(cls, m) for cls in [d.backend, *rivals] for m in span), (d.why, d.backend)
            else:
                assert covers(d.backend, span[0]) and covers(d.backend, span[-1]), (d.why, d.backend)
        for loser, why in d.lost:
            parts = why.split(", ")
            assert len(parts) == len(set(parts)), (loser, why)


def test_a_prepared_plan_on_cpu_is_the_reference_and_explain_prints_it(rng):
    qw = bf.quantize(rng.standard_normal((16, 256)).astype(np.float32), "MXFP4")
    lin = bc.prepare_linear(qw, max_tokens=8, activation="mxfp8")
    assert [(r.lo, r.hi, r.backend.name) for r in lin.plan.rows] == [(1, 8, "reference")]
    assert "1-8 tokens -> reference" in bc.explain(lin) and "cuda_gemv: needs a CUDA device" in bc.explain(lin)


CANNOT = [  # (backend, query, what its reason must say)
    ("cuda_gemv", query("FP8", "bf16", H200, k=12), r"K % 8 == 0, K is 12"),
    ("cuda_gemv", query("Q8_0", "fp8_token", H200), r"GGML formats with bf16"),
    ("scaled_mm", query("NVFP4", "nvfp4", H200), r"runs FP8 × fp8_static / fp8_token"),
    ("scaled_mm", query("FP8", "fp8_token", H200, n=72), r"multiples of 16"),
    ("block_scaled_mm", query("FP8_BLOCK", "fp8_group128", H200, shards=(72, 10168)), r"whole 128-blocks"),
    ("block_scaled_mm", query("FP8_BLOCK", "fp8_group128", SM120), r"not verified here"),
    ("block_scaled_mm", query("FP8_BLOCK", "fp8_group128", H200, k=640), r"K/128 a multiple of 4"),
    ("dequant_gemm", query("FP8", "fp8_token", H200), r"bf16-exact activations"),
    ("tensor_core", query("FP8", "fp8_token", H200), r"bf16-exact activations"),
    ("tensor_core", query("NVFP4", "bf16", H200, k=12), r"K % 8 == 0, K is 12"),
    ("tensor_core", query("Q8_0", "bf16", CPU), r"needs a CUDA device, the op is on cpu"),
    ("triton_tiles", query("IQ2_XS", "bf16", CPU), r"needs a CUDA device, the op is on cpu"),
    ("reference", query("IQ2_XS", "bf16", H200), r"only when asked for with path='reference'"),
]


@pytest.mark.parametrize("name,q,reason", CANNOT, ids=[f"{c[0]}-{c[2][:20]}" for c in CANNOT])
def test_can_implement_says_why_not(name, q, reason):
    cls = next(cls for cls in backends.for_op(q.op) if cls.name == name)
    ok, why = cls.can_implement(q)
    assert not ok and re.search(reason, why), why


def test_tensor_core_configurations_cover_the_range_and_size_their_tickets(rng):
    """Token tiles of 8/16/32 that hold the call (or tile it), K splits within the weight's chunks, and enough
    split-K tickets for the largest split call's output tiles."""
    from b12x_core.backends.tensor_core import TensorCoreGemm
    from b12x_core.tensor_core import geometry

    n, k = int(rng.integers(1, 400)) * 16, int(rng.integers(1, 64)) * 128
    q = query("NVFP4", "bf16", H200, max_tokens=300, n=n, k=k)
    ranges = TensorCoreGemm.configs(q, 1, 300)
    assert (
        ranges[0][0] == 1
        and ranges[-1][1] == 300
        and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    )
    chunks = -(-k // geometry.chunk_k("NVFP4"))
    for _, hi, config in ranges:
        assert config["tokens"] in (8, 16, 32) and (hi <= config["tokens"] or config["tokens"] == 32)
        assert 1 <= config["splits"] <= max(1, chunks // 4)
        rows = config.get("rows", 128)  # rows a CTA
        assert rows in (96, 112, 128) and (rows == 128 or config["tokens"] == 8)
        if config["splits"] > 1:  # a ticket per output tile of the CTA height the row runs
            assert TensorCoreGemm.tickets(q, ranges) >= -(-hi // config["tokens"]) * -(-n // rows)


@pytest.mark.parametrize("fmt", ["NVFP4", "IQ2_XS", "FP8", "MXFP8", "Q8_0"])
def test_plans_hold_activations_resident_only_at_one_token_tiles_that_fit(rng, fmt):
    """MmaConfig.resident (one-token tiles with the split's activations held whole in shared memory) is a plan's
    choice only at one-token tiles, past one token only for the formats measured faster with it there
    (configure.RESIDENT_FORMATS), and only where the call's live rows over the split's K stay within
    configure.RESIDENT_MAX_BYTES; every format takes it for one token over a K of at most 4096 (measured there), and the
    formats of RESIDENT_FORMATS for four. A plan row naming it reads back as written."""
    from b12x_core.backends.tensor_core import TensorCoreGemm
    from b12x_core.tensor_core import configure, gemm, geometry

    n, k = int(rng.integers(1, 400)) * 128, int(rng.integers(4, 64)) * 256
    q = query(fmt, "bf16", H200, max_tokens=300, n=n, k=k)
    chunks = -(-k // geometry.chunk_k(fmt))
    for lo, hi, config in TensorCoreGemm.configs(q, 1, 300):
        if config.get("resident"):
            assert config["tokens"] == 8 and (hi == 1 or fmt in configure.RESIDENT_FORMATS), (lo, hi, config)
            split_k = -(-chunks // config["splits"]) * geometry.chunk_k(fmt)
            assert min(hi, 8) * split_k * 2 <= configure.RESIDENT_MAX_BYTES
    small = query(fmt, "bf16", H200, max_tokens=8, n=n, k=min(k, 4096))
    assert TensorCoreGemm.configs(small, 1, 1)[0][2].get("resident")
    four_tokens = TensorCoreGemm.configs(small, 4, 4)[0][2]
    assert bool(four_tokens.get("resident")) == (fmt in configure.RESIDENT_FORMATS)
    splits, tiles = int(rng.integers(1, 17)), int(rng.choice([6, 7, 8]))
    for resident in (True, False):
        config = gemm.MmaConfig(1, splits, tiles=tiles, resident=resident)
        assert gemm.MmaConfig.of_plan_row(config.plan_row()) == config
        assert ("resident" in str(config)) == resident


@pytest.mark.parametrize(
    "fmt,mode",
    [("FP8", "fp8_static"), ("MXFP8", "mxfp8"), ("MXFP4", "mxfp8"), ("NVFP4", "mxfp8"), ("NVFP4", "nvfp4"),
     ("FP8_BLOCK", "bf16"), ("NVFP4", "bf16"), ("Q8_0", "bf16")],
)  # fmt: skip
def test_plans_quantize_activations_in_the_kernel_exactly_where_it_holds_them(rng, fmt, mode):
    """A tensor-core plan row names x_quant (the kernel quantizes the activations it holds, no operand pass) for a
    quantized activation mode at the rows that hold their activations (resident), and nowhere else: never with bf16
    activations, never at staged rows; a quantized pair holds them up to four tokens over a K of 4096, as FP8 and MXFP8
    do with bf16 activations. Such a row carves no operand buffer; the other rows of a quantized mode carve the operand
    pass's bf16 values."""
    from types import SimpleNamespace

    from b12x_core.backends.tensor_core import TensorCoreGemm

    n, k = int(rng.integers(1, 400)) * 128, int(rng.integers(4, 32)) * 256
    q = query(fmt, mode, H200, max_tokens=300, n=n, k=k)
    backend = TensorCoreGemm(q, SimpleNamespace(mma=[]))
    rows = TensorCoreGemm.configs(q, 1, 300)
    assert rows[0][0] == 1 and rows[0][2].get("resident")  # one token over K ≤ 8192: held (the rule above)
    for lo, hi, config in rows:
        in_kernel = bool(config.get("resident")) and mode != "bf16"
        assert config.get("x_quant") == (mode if in_kernel else None), (lo, hi, config)
        partials = 4 * config["splits"] * hi * n if config["splits"] > 1 else 0
        operand = 0 if in_kernel or mode == "bf16" else 2 * hi * k  # the bf16 values the operand pass writes
        assert backend.scratch_bytes(hi, config) >= partials + operand
        if in_kernel:
            assert backend.scratch_bytes(hi, config) < partials + 2 * hi * k
    four_tokens = TensorCoreGemm.configs(query(fmt, mode, H200, max_tokens=8, n=n, k=min(k, 4096)), 4, 4)[0][2]
    assert four_tokens.get("x_quant") == (None if mode == "bf16" else mode)  # quantized pairs hold 2-8 tokens too


@pytest.mark.parametrize("fmt", ["NVFP4", "IQ2_XS", "FP8", "Q8_0"])
def test_one_token_splits_stream_with_two_ctas_an_sm(rng, fmt):
    """At one-token tiles the K split stops at about two CTAs an SM (a latency-bound stream per CTA: more splits
    only add partials), but still covers every SM when the weight has the chunks for it; with its balanced CTA
    heights, the busiest SM never gets more row-tile chunks than 128-row CTAs give it."""
    from b12x_core.backends.tensor_core import TensorCoreGemm
    from b12x_core.tensor_core import geometry

    n, k = int(rng.integers(1, 480)) * 128, int(rng.integers(4, 64)) * 256
    q = query(fmt, "bf16", H200, max_tokens=8, n=n, k=k)
    chunks = -(-k // geometry.chunk_k(fmt))
    sms = H200.sms

    def busiest(rows, splits):  # row tiles × chunks on the SM that holds the most CTAs
        ctas = -(-n // rows) * splits
        return -(-ctas // sms) * rows // 16 * -(-chunks // splits)

    streaming = max(1, min(16, chunks // 4, 2 * sms // -(-n // 128)))  # 128-row CTAs, split while one wave holds
    for _, _, config in TensorCoreGemm.configs(q, 1, 8):  # ranges apart only where resident activations stop fitting
        rows = config.get("rows", 128)  # rows a CTA
        assert config["tokens"] == 8
        assert -(-n // rows) * config["splits"] <= 2 * sms or config["splits"] == 1
        assert busiest(rows, config["splits"]) <= busiest(128, streaming), (n, k, config)


def test_balanced_one_token_configs_never_load_an_sm_more(rng):
    """configure.balanced_config (CTA heights of 6-8 row tiles at one-token tiles) never gives the
    busiest SM more row-tile chunks than the default split does, stays within one wave of two CTAs an SM when it
    splits, and leaves larger token tiles to the default."""
    from b12x_core.tensor_core import configure

    sms = H200.sms
    for _ in range(200):
        n, chunks = int(rng.integers(1, 4000)) * 16, int(rng.integers(1, 256))
        n16 = n // 16

        def busiest(c, n16=n16, chunks=chunks):
            ctas = -(-n16 // c.tiles) * c.splits
            return -(-ctas // sms) * c.tiles * -(-chunks // c.splits)

        default = configure.default_config(1, n, chunks, 2 * sms, sms=sms)
        balanced = configure.balanced_config(1, n, chunks, sms)
        assert balanced.mt == 1 and balanced.rt == 1 and balanced.tiles in (6, 7, 8)
        assert busiest(balanced) <= busiest(default), (n, chunks, default, balanced)
        assert balanced.splits == 1 or -(-n16 // balanced.tiles) * balanced.splits <= 2 * sms
    assert configure.balanced_config(64, 4096, 32, sms).tiles == 8


def moe_query(fmt, device, max_tokens=4096, experts=128, hidden=2048, inter=768):
    from b12x_core.backends import MoEShape

    shape = MoEShape(experts, hidden, inter, 8, "silu", "gate_up", "bf16", fmt)
    return Query("moe", fmt, "bf16", "bf16", device, "auto", 2 * inter, hidden, max_tokens, moe=shape)


@pytest.mark.parametrize("fmt", ["MXFP4", "IQ2_XS", "Q8_0"])
def test_a_moe_plan_keeps_one_copy_of_the_experts(rng, fmt):
    """The MoE backends hold different expert layouts (the Triton MoE the checkpoint's, the tensor-core MoE its
    own stack): where each wins some T, the plan keeps one layout, as a linear plan does, and says so."""
    ts = (1, 16, 64, 256, 1024, 4096)
    flip = int(rng.integers(1, len(ts)))  # the tensor-core MoE fastest below ts[flip], the Triton MoE from there
    us = {"tensor_core_moe": tuple(10.0 if i < flip else 30.0 for i in range(len(ts))),
          "triton_moe": tuple(20.0 if i < flip else 15.0 for i in range(len(ts)))}  # fmt: skip
    entry = timings.Entry((9, 0), fmt, "bf16", "1536x2048", ts, us, "random", op="moe")
    q = moe_query(fmt, H200)
    basis, _, decisions = plan.choose(q, entries=(entry,))
    assert basis.startswith("measured") and "one weight copy" in basis
    assert len({d.backend for d in decisions}) == 1
    assert plan.shared_layout([d.backend for d in decisions]) is not None
    # the family that loses least: tensor_core_moe loses 30/15 = 2 from ts[flip] on, triton_moe 20/10 = 2 below
    assert {d.backend.name for d in decisions} <= {"tensor_core_moe", "triton_moe"}
    dominated = plan.choose(q, entries=(dataclasses.replace(entry, us={**us, "triton_moe": (99.0,) * 6}),))
    assert {d.backend.name for d in dominated[2]} == {"tensor_core_moe"}  # never faster: never kept


def test_a_layer_takes_the_nearest_measured_shape_class():
    """Speed ratios follow a layer's size: a 5120×5120 layer takes the 4096×4096 class, not 8192×8192's, and the
    basis names the class used; a measured shape takes its own class without a stand-in note."""
    ms = (1, 64)
    small = timings.Entry((9, 0), "MXFP4", "bf16", "4096x4096", ms,
                          {"tensor_core": (1.0, 1.0), "cuda_gemv": (2.0, 2.0)}, "s")  # fmt: skip
    large = timings.Entry((9, 0), "MXFP4", "bf16", "8192x8192", ms,
                          {"tensor_core": (2.0, 2.0), "cuda_gemv": (1.0, 1.0)}, "l")  # fmt: skip
    for (n, k), winner, shape in [((5120, 5120), "tensor_core", "4096x4096"), ((14336, 8192), "cuda_gemv", "8192x8192"),
                                  ((8192, 8192), "cuda_gemv", "8192x8192")]:  # fmt: skip
        q = query("MXFP4", "bf16", H200, max_tokens=64, n=n, k=k)
        basis, _, decisions = plan.choose(q, entries=(small, large))
        assert f"shape class {shape}" in basis and decisions[0].backend.name == winner
        assert ("stands in for this layer's" in basis) == ((n, k) != (8192, 8192))


H100 = dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3")  # sm_90 too, with 0.7× the H200's bandwidth


def two_gpus(rng, op: str):
    """One key of `op` measured on an H200 and an H100, the H100's times the H200's mirrored (110 - t): at each
    measured M the fastest backend on one GPU is the slowest on the other, so which entry a plan read shows."""
    ms = tuple(sorted(set(int(v) for v in rng.integers(1, 2000, size=8))))
    names = [cls.name for cls in backends.for_op(op)]
    us = {name: tuple(float(v) for v in rng.uniform(10, 100, size=len(ms))) for name in names}
    shape = "1536x2048" if op == "moe" else "8192x8192"
    h200 = timings.Entry((9, 0), "MXFP4", "bf16", shape, ms, us, "random H200", op, "NVIDIA H200")
    h100 = dataclasses.replace(h200, us={k: tuple(110 - t for t in v) for k, v in us.items()}, source="random H100",
                               device="NVIDIA H100 80GB HBM3")  # fmt: skip
    return h200, h100


def gpu_query(op: str, device: DeviceInfo) -> Query:
    return moe_query("MXFP4", device, max_tokens=2048) if op == "moe" else query("MXFP4", "bf16", device, 2048)


@pytest.mark.parametrize("op", ["linear", "moe"])
def test_a_gpu_reads_its_own_measurements_before_another_of_its_capability(rng, op, monkeypatch):
    """An H100 and an H200 (both sm_90) each measured the same key and shape: a plan on either reads its own entry
    (its name matched case and spacing aside), whichever order the table holds them in; the basis names the GPU."""
    monkeypatch.setenv("B12X_WEIGHT_COPIES", "2")  # speed alone decides
    h200, h100 = two_gpus(rng, op)
    for name, own in [("NVIDIA H200", h200), ("NVIDIA H100 80GB HBM3", h100), (" nvidia  h100 80GB hbm3", h100)]:
        q = gpu_query(op, dataclasses.replace(H200, name=name))
        able = {cls.name for cls in backends.for_op(op) if cls.can_implement(q)[0]}
        assert len(able) > 1
        for entries in [(h200, h100), (h100, h200)]:
            basis, _, decisions = plan.choose(q, entries=entries)
            assert basis.startswith(f"measured on {own.device}, shape class"), basis
            for p in own.ms:
                best = min(able, key=lambda b: own.us[b][own.ms.index(p)])
                assert next(d for d in decisions if d.lo <= p <= d.hi).backend.name == best, (name, p, decisions)


@pytest.mark.parametrize("op", ["linear", "moe"])
def test_a_gpu_without_measurements_of_its_own_reads_its_capabilitys(rng, op):
    """An H100 PCIe (sm_90, unmeasured) reads an entry of no named GPU where the table has one, else another sm_90
    GPU's (the first by name, whatever the table's order), and the basis says whose; a GPU of another capability
    reads none of them, whatever its name; a GPU with measurements of its own in the stand-in mode only reads those
    before another GPU's in the mode itself."""
    h200, h100 = two_gpus(rng, op)
    anyone = dataclasses.replace(h200, device="", source="random sm_90")
    n, k = timings.class_size(h200.shape)

    def found(device, capability=(9, 0), mode="bf16", entries=(h200, h100)):
        return timings.lookup(capability, "MXFP4", mode, n, k, entries, op=op, device=device)

    pcie = dataclasses.replace(H200, name="NVIDIA H100 PCIe")
    for entries, used, where in [((h200, h100, anyone), anyone, "sm_90"),
                                 ((h200, h100), h100, "another sm_90 GPU (NVIDIA H100 80GB HBM3)"),
                                 ((h100, h200), h100, "another sm_90 GPU (NVIDIA H100 80GB HBM3)")]:  # fmt: skip
        assert found(pcie.name, entries=entries) == (used, "")
        basis, _, _ = plan.choose(gpu_query(op, pcie), entries=entries)
        assert basis.startswith(f"measured on {where}, shape class"), basis
    assert found("")[0] is h100  # a GPU of no known name: its capability's
    assert plan.choose(gpu_query(op, H200), entries=(h200,))[0].startswith("measured on sm_90, shape class")
    assert found("NVIDIA H200", capability=(12, 0)) is None
    h200_mxfp8 = dataclasses.replace(h200, act_mode="mxfp8")
    entry, note = found("NVIDIA H100 80GB HBM3", mode="mxfp8", entries=(h200_mxfp8, h100))
    assert entry is h100 and "bf16 measurements stand in for mxfp8" in note
    assert found("NVIDIA H200", mode="mxfp8", entries=(h200_mxfp8, h100)) == (h200_mxfp8, "")


def test_a_backend_measured_on_each_layout_is_judged_on_the_layout_the_plan_keeps():
    """dequantize + GEMM reads both layouts, at different speeds: the plan must not count its checkpoint-layout time
    for a family that keeps the tensor-core layout."""
    ms = (1, 256)
    us = {"tensor_core": (10.0, 400.0), "cuda_gemv": (30.0, 900.0), "triton_tiles": (40.0, 300.0),
          "dequant_gemm": (200.0, 100.0), "dequant_gemm@mma": (200.0, 330.0)}  # fmt: skip
    entry = timings.Entry((9, 0), "MXFP4", "bf16", "8192x8192", ms, us, "layouts")
    q = query("MXFP4", "bf16", H200, max_tokens=256)
    basis, _, decisions = plan.choose(q, entries=(entry,))
    # the tensor-core family (dequantize on its layout): 10 at M=1, 330 at M=256 -> at most 3.3× the fastest (100);
    # the checkpoint family: 30 at M=1 (3×), 100 at M=256 -> 3×: it loses least
    assert [d.backend.name for d in decisions] == ["cuda_gemv", "dequant_gemm"], decisions
    assert "one weight copy (checkpoint layout): at most 3.00×" in basis
    without = dataclasses.replace(entry, us={k: v for k, v in us.items() if "@" not in k})
    _, _, naive = plan.choose(q, entries=(without,))  # measured on one layout only: dequant_gemm reads mma as fast
    assert [d.backend.name for d in naive] == ["tensor_core", "dequant_gemm"]


def _cta_bytes(fmt: str, config: dict, last: int, chunks: int) -> int:
    """Shared memory one CTA of a tensor-core plan row takes (the kernels' own count), held rows included."""
    from b12x_core.tensor_core import gemm, geometry

    c = gemm.MmaConfig.of_plan_row(config)
    held = (min(last, 8), -(-chunks // c.splits)) if c.resident else (0, 0)
    return geometry.smem_bytes(fmt, c.mt, c.tiles, *held)


@pytest.mark.parametrize("fmt,mode", PAIRS, ids=str)
def test_tensor_core_ctas_fit_the_shared_memory_of_sm12x_and_sm90_plans_are_unchanged(fmt, mode, monkeypatch):
    """On an RTX 5090 (99 KB a block) every CTA of the tensor-core GEMM's rows at 1-4096 tokens fits: a 32-token
    FP4 tile, any IQ2_XS tile of 128 rows and IQ2_XXS tiles past 8 tokens do not (they would fail to launch), so those
    rows take smaller token tiles or shorter CTAs. On the H200 (227 KB) the rows are what they are with no limit."""
    from b12x_core.backends.tensor_core import TensorCoreGemm
    from b12x_core.tensor_core import geometry

    pytest.importorskip("b12x_kernels._C", reason="the kernels count their own shared memory")
    for device in (SM120, H200):
        q = query(fmt, mode, device, n=6144, k=4096)
        if not TensorCoreGemm.can_implement(q)[0]:
            continue
        chunks = -(-q.k // geometry.chunk_k(fmt))
        rows = TensorCoreGemm.configs(q, 1, 4096)
        assert all(0 < _cta_bytes(fmt, config, last, chunks) <= device.smem_kb * 1024 for _, last, config in rows)
        if device is H200:
            with monkeypatch.context() as unlimited:
                unlimited.setattr(geometry, "smem_limit", lambda q: 0)
                assert TensorCoreGemm.configs(q, 1, 4096) == rows


@pytest.mark.parametrize("short_ctas", [False, True], ids=["128-row CTAs", "short CTAs"])
@pytest.mark.parametrize("fmt", ["MXFP4", "NVFP4", "IQ2_XXS", "IQ2_XS", "Q8_0"])
def test_the_tensor_core_moe_on_sm12x_fits_its_shared_memory_or_leaves_the_layer_to_triton(fmt, short_ctas):
    """On an RTX 5090 the grouped GEMM's 128-row CTAs must fit 99 KB: IQ2_XS's do not even at 8-slot tiles (its grid
    and sign tables take 40 KB), so the tensor-core MoE says why and the Triton MoE runs the layer, unless its short
    CTAs are on (Overrides.short_ctas, the default): then 112- or 96-row CTAs at 8-slot blocks, every one within 99 KB
    with its held rows. The others run every token count with 128-row CTAs that fit either way; on the H200 the switch
    changes no row."""
    from b12x_core.backends.tensor_core_moe import TensorCoreMoE
    from b12x_core.tensor_core import geometry

    pytest.importorskip("b12x_kernels._C", reason="the kernels count their own shared memory")
    forced = Overrides(short_ctas=short_ctas)
    h200 = TensorCoreMoE.configs(moe_query(fmt, H200), 1, 4096)
    assert TensorCoreMoE.configs(dataclasses.replace(moe_query(fmt, H200), overrides=forced), 1, 4096) == h200
    q = dataclasses.replace(moe_query(fmt, SM120), overrides=forced)
    able, why = TensorCoreMoE.can_implement(q)
    full = geometry.smem_bytes(fmt, 1, geometry.FULL_HEIGHT) <= 99 * 1024
    if not full and not short_ctas:
        assert not able and "shared memory" in why and "99 KB" in why
        assert {d.backend.name for d in plan.choose(q, entries=())[2]} == {"triton_moe"}
        return
    assert able, why
    assert {d.backend.name for d in plan.choose(q, entries=())[2]} == {"tensor_core_moe"}
    chunks = -(-q.k // geometry.chunk_k(fmt))
    holding = dataclasses.replace(q, overrides=Overrides(holds_rows=True, short_ctas=short_ctas))  # where they fit too
    for _, last, config in TensorCoreMoE.configs(holding, 1, 4096):
        assert ("rows" in config) == (not full), config
        if not full:
            assert config["tokens"] == 8 and config["rows"] < geometry.ROWS_PER_CTA
        tiles = config.get("rows", geometry.ROWS_PER_CTA) // geometry.TILE_ROWS
        held = (
            (min(last * q.moe.top_k, 8), -(-chunks // config["splits"][0])) if config.get("held", (0,))[0] else (0, 0)
        )
        assert 0 < geometry.smem_bytes(fmt, config["tokens"] // 8, tiles, *held) <= 99 * 1024, config
