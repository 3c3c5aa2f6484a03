"""benchmarks/sm12x_roofline.py, the SM12x roofline model of docs/performance.md: its time per linear against the
formula worked by hand, its speed-ups where they have a closed form (bandwidth-bound: the ratio of bits; compute-
bound: the ratio of rates), unknown rates, the cards file's sources, and the page it adds to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import b12x_formats as bf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules

import plan_check  # noqa: E402
import sm12x_roofline as roof  # noqa: E402

CARDS = ROOT / "docs/results/sm12x_cards.json"
RATES = ("bf16", "fp8", "fp4")


def card(bandwidth=1000.0, bf16=100.0, fp8=200.0, fp4=400.0, fp32=50.0, capability=(12, 0)) -> dict:
    value = {"bandwidth_gbs": bandwidth, "bf16_tflops": bf16, "fp8_tflops": fp8, "fp4_tflops": fp4,
             "fp32_tflops": fp32}  # fmt: skip
    return {"name": "test card", "capability": list(capability), "sms": 100,
            **{key: {"value": v, "source": "test"} for key, v in value.items()}}  # fmt: skip


def test_a_linear_takes_the_longer_of_its_bytes_and_its_flops():
    """1000×1000 bf16 weights (2 MB) at 1000 GB/s: 2 µs; 2·M·10⁶ flops at 100 TFLOPS: 0.02·M µs."""
    c = card()
    assert roof.linear_us(c, 1000, 1000, 1, 16, "bf16") == pytest.approx(2.0)
    assert roof.linear_us(c, 1000, 1000, 100, 16, "bf16") == pytest.approx(2.0)  # the balance point
    assert roof.linear_us(c, 1000, 1000, 1000, 16, "bf16") == pytest.approx(20.0)
    assert roof.linear_us(c, 1000, 1000, 1000, 4, "fp4") == pytest.approx(5.0)  # 0.5 µs of bytes, 5 of flops


def test_an_unknown_rate_gives_a_time_only_where_the_fp32_floor_is_bandwidth_bound():
    c = card(bf16=None, fp32=50.0)  # at 50 TFLOPS 2·M·10⁶ flops take 0.04·M µs against 2 µs of bytes
    assert roof.linear_us(c, 1000, 1000, 50, 16, "bf16") == pytest.approx(2.0)
    assert roof.linear_us(c, 1000, 1000, 51, 16, "bf16") is None


def test_bandwidth_bound_speedups_are_the_ratio_of_bits_and_compute_bound_ones_of_rates():
    """On a card whose tensor rates are all but unbounded every cell is bandwidth-bound: 16 / bits per weight. On
    one whose bandwidth is all but unbounded every cell is compute-bound: the bf16 rate over the path's."""
    fast = roof.rows(card(bf16=1e9, fp8=1e9, fp4=1e9))
    for row in fast:
        assert row.today == pytest.approx((16 / row.bits,) * 3), row
    slow = {row.label: row for row in roof.rows(card(bandwidth=1e9, bf16=1.0, fp8=2.0, fp4=8.0))}
    assert all(row.today[2] == pytest.approx(1.0) for label, row in slow.items() if "× fp8" not in label)
    assert slow["NVFP4 × nvfp4"].native[2] == pytest.approx(8.0)
    assert slow["MXFP4 × mxfp8"].native[2] == pytest.approx(2.0)
    assert slow["FP8 × fp8 static"].native[2] == pytest.approx(2.0)
    assert slow["NVFP4 × bf16"].native is None and slow["FP8_BLOCK × fp8"].native is None


def test_every_pair_the_measured_tables_show_is_a_row():
    rows = roof.rows(card())
    assert [r.label for r in rows] == [plan_check.label(*p) for p in plan_check.PAIRS]
    assert [r.bits for r in rows] == [bf.spec(p[0]).bits_per_weight for p in plan_check.PAIRS]


def test_today_every_sm12x_path_but_torchs_fp8_gemm_multiplies_in_bf16():
    """What the plan runs on SM12x today: b12x's kernels decode to bf16; only FP8 × fp8 can reach torch's FP8 GEMM."""
    info = roof.device(card())
    for fmt, activation, scaled in plan_check.PAIRS:
        for m in roof.MS:
            rate = roof.today_rate(info, fmt, activation, scaled, 4096, 4096, m)
            assert rate == "bf16" or (fmt, activation) == ("FP8", "fp8"), (fmt, activation, m)


def test_the_cards_file_gives_every_number_a_source():
    saved = json.loads(CARDS.read_text())
    assert roof.is_cards(saved)
    names = [c["name"] for c in saved["cards"]]
    assert names == ["NVIDIA GeForce RTX 5090", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                     "NVIDIA DGX Spark (GB10)"]  # fmt: skip
    for c in saved["cards"]:
        for key in ("bandwidth_gbs", "fp32_tflops", *(f"{r}_tflops" for r in RATES)):
            value, source = c[key]["value"], c[key]["source"]
            assert (value is None) == source.startswith("not found"), (c["name"], key)
            assert value is None or (value > 0 and ("http" in source or "NVIDIA" in source)), (c["name"], key)
        rates = [c[f"{r}_tflops"]["value"] for r in RATES]
        known = [r for r in rates if r is not None]
        assert known == sorted(known), c["name"]  # narrower operands never run slower


def test_the_page_adds_the_section_and_lists_the_cards_without_a_letter(tmp_path):
    rows = [dict(shape=f"8b.{s}", format=f, activation="bf16", static=False, mode="bf16", m=1, backends={"x": 1.0},
                 dispatched=10.0) for s in ("qkv", "o", "gate_up", "down") for f in ("NVFP4",)]  # fmt: skip
    rows += [
        dict(shape=f"8b.{s}", format="bf16 F.linear", m=1, dispatched=30.0) for s in ("qkv", "o", "gate_up", "down")
    ]
    (tmp_path / "linear.json").write_text(json.dumps({"rows": rows, "date": "d", "device": "NVIDIA H200"}))
    (tmp_path / "cards.json").write_text(json.dumps({"kind": roof.KIND, "cards": [card()]}))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/performance_page.py"), "linear.json", "cards.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = done.stdout
    assert page.index("## NVIDIA H200") < page.index("## SM12x roofline (a model, not a measurement)")
    assert "### test card (model)" in page and "[`cards.json`](results/cards.json)" in page
    assert "- [`cards.json`](results/cards.json): the SM12x cards' published rates" in page
    assert "<sup>b</sup>" not in page  # the cards file measures nothing: no letter
    row = next(line for line in page.splitlines() if line.startswith("| NVFP4 × nvfp4 |"))
    assert row.split(" | ")[1:3] == ["4.50", f"{16 / 4.5:.2f}"]  # bandwidth-bound at M=1
