"""benchmarks/plan_check.py's logic runs on the CPU (`--cpu-smoke`: a tiny shape, the reference backend, wall
clock): it writes its rows, the check and a measured table the plan reads back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plan_check_smoke_writes_rows_and_a_table_the_plan_reads(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks/plan_check.py"), "--cpu-smoke", "--formats", "Q8_0,FP8",
           "--out", "out.json", "--png", "", "--emit-table", "table.json"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "## check: dispatched" in done.stdout, done.stderr[-2000:]
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    measured = [r for r in rows if "backends" in r]
    assert {(r["format"], r["mode"]) for r in measured} == {("Q8_0", "bf16"), ("FP8", "bf16"), ("FP8", "fp8_static"),
                                                            ("FP8", "fp8_token")}  # fmt: skip
    assert all(set(r["backends"]) == {"reference"} and r["dispatched"] > 0 for r in measured)
    # every timing says when it ended (unix seconds, to join a clock log)
    assert all(set(r["timed_at"]) == {*r.get("backends", ()), "dispatched"} for r in rows)
    assert all(isinstance(t, float) and t > 1e9 for r in rows for t in r["timed_at"].values())
    from b12x_core import timings

    entries = timings.load(tmp_path / "table.json")
    assert {(e.format, e.act_mode) for e in entries} == {(r["format"], r["mode"]) for r in measured}
    assert all(e.ms == (1, 2, 4) and len(e.us["reference"]) == 3 for e in entries)


def test_plan_check_measures_only_the_activation_modes_asked_for(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks/plan_check.py"), "--cpu-smoke", "--formats", "FP8,NVFP4",
           "--activations", "fp8 static,nvfp4", "--out", "out.json", "--png", ""]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "## check: dispatched" in done.stdout, done.stderr[-2000:]  # (its pass or miss is wall-clock noise here)
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert {(r["format"], r["mode"]) for r in rows if "backends" in r} == {("FP8", "fp8_static"), ("NVFP4", "nvfp4")}


def test_plan_check_stops_timing_only_backends_that_fall_further_behind():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from plan_check import PRUNE, falling_behind
    finally:
        sys.path.pop(0)
    before = {"gemv": 2.0 * PRUNE, "dequant_gemm": 1.5 * PRUNE, "tiles": 1.0}
    now = {"gemv": 4.0 * PRUNE, "dequant_gemm": 1.5 * PRUNE * 1.001, "tiles": 1.0, "new": 5.0 * PRUNE}
    # the GEMV grows away; dequant_gemm's flat fixed cost moves by noise only; a backend first timed now is kept
    assert falling_behind(now, before) == {"gemv"}
    assert falling_behind({"gemv": 0.9 * PRUNE}, {"gemv": 0.5 * PRUNE}) == set()  # not far behind yet
    from plan_check import timed

    # a pruned backend is timed again at the run's largest M, where a flat-cost pass (dequantize + GEMM) wins
    assert not timed("dequant_gemm", 512, {"dequant_gemm"}, 4096) and timed(
        "dequant_gemm", 4096, {"dequant_gemm"}, 4096
    )
    assert timed("triton_tiles", 512, {"dequant_gemm"}, 4096)


def test_moe_table_holds_each_backend_and_the_held_rows_at_the_token_counts_run():
    """benchmarks/moe.py's table: per backend (tensor_core_moe's held rows under configure.HELD, which its
    configurations read) the times at each token count it ran; bc.moe's own ("auto") and the A/B forms the plans never
    run ("@loose", "@unfused") stay out."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import moe

    backends = (("tensor_core_moe", 50.0), (moe.HELD, 40.0), ("auto", 51.0), ("tensor_core_moe" + moe.LOOSE, 30.0),
                ("tensor_core_moe" + moe.UNFUSED, 30.0), (moe.HELD + moe.UNFUSED, 30.0))  # fmt: skip
    rows = [dict(backend=b, format="MXFP4", mode="mxfp8", n=1536, k=2048, t=t, us=us + t)
            for b, us in backends for t in (1, 4)]  # fmt: skip
    (entry,) = moe.table({"device": "NVIDIA H200", "date": "2026-12-04", "capability": [9, 0], "rows": rows})
    assert entry.op == "moe" and entry.ms == (1, 4)
    assert entry.us == {"tensor_core_moe": [51.0, 54.0], moe.HELD: [41.0, 44.0]}


def test_moe_plot_of_no_rows_writes_nothing_and_does_not_fail(tmp_path):
    """benchmarks/moe.py when every case is refused for its shape (IQ2's 256-blocks on gpt-oss's 2880-wide experts):
    the run ends with its check and no plot, not a traceback."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import moe

    moe.plot([], str(tmp_path / "moe.png"))
    assert not (tmp_path / "moe.png").exists()


def test_clocks_flags_the_timings_the_card_ran_slow(tmp_path):
    """benchmarks/clocks.py joins a run's stamped timings with the card's once-a-second clock log: a timing whose
    window sat at a low SM clock is named, the others are not, and a sample nvidia-smi left unfilled is skipped."""
    t0 = 1_796_000_000.0
    rows = [
        dict(shape="70b.gate_up", format="bf16 F.linear", m=4096, dispatched=5400.0, timed_at={"dispatched": t0 + 2}),
        dict(shape="70b.gate_up", format="NVFP4", mode="bf16", m=4096, backends={"dequant_gemm": 5800.0,
             "dequant_gemm@mma": 6900.0}, timed_at={"dequant_gemm": t0 + 4, "dequant_gemm@mma": t0 + 6.5,
             "dispatched": t0 + 8}, dispatched=6700.0),
    ]  # fmt: skip
    (tmp_path / "rows.json").write_text(json.dumps({"rows": rows}))
    lines = [f"{t0 + s:.0f},{1500 if 5 <= s <= 6 else 1980}, 60, 650" for s in range(10)]
    lines.insert(3, f"{t0 + 2.5:.0f},[N/A], [N/A], [N/A]")
    (tmp_path / "clocks.csv").write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/clocks.py"), "rows.json", "clocks.csv"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    flagged = done.stdout.split("ran below")[1]
    assert "1 of 4 timings" in done.stdout and "dequant_gemm@mma: 1500 MHz, 6900.0 µs" in flagged
    assert "NVFP4 × bf16 M=4096 dequant_gemm " in done.stdout and "dequant_gemm:" not in flagged


def _layer_rows(rng, ms, formats):
    """plan_check.py rows for the 8B layer's four linears: bf16 and each format at each M, random times."""
    linears = ["8b.qkv", "8b.o", "8b.gate_up", "8b.down"]
    rows = []
    for m in ms:
        rows += [dict(shape=s, format="bf16 F.linear", m=m, dispatched=float(rng.uniform(10, 100))) for s in linears]
        for fmt in formats:
            rows += [dict(shape=s, format=fmt, activation="bf16", static=False, mode="bf16", m=m,
                          backends={"x": 1.0}, dispatched=float(rng.uniform(10, 100))) for s in linears]  # fmt: skip
    return rows


def _page(tmp_path, *files):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/performance_page.py"), *files], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_performance_page_reads_moe_runs_too(tmp_path, rng):
    """benchmarks/performance_page.py given a moe.py run: a table per MoE layer shape after the linear ones, columns
    by T, each cell the dispatched MoE's ("auto") speed-up over the bf16 grouped MoE; the backends timed alone give
    none."""
    linear = _layer_rows(rng, [1], ["FP8"])
    moe = [
        dict(
            shape="qwen3", format="MXFP4", act="mxfp8", backend=name, t=t, us=us, bf16_ref_us=100.0, speedup=100.0 / us
        )  # fmt: skip
        for t in (1, 64)
        for name, us in (("auto", float(rng.uniform(20, 90))), ("triton_moe", 5.0))
    ]
    for name, rows in (("linear.json", linear), ("moe.json", moe)):
        (tmp_path / name).write_text(json.dumps({"rows": rows, "date": name, "device": "NVIDIA H200"}))
    done = _page(tmp_path, "linear.json", "moe.json")
    assert done.returncode == 0, done.stderr
    linear_at, moe_at = done.stdout.index("### Llama-3.1-8B"), done.stdout.index("### Qwen3-30B-A3B-like MoE")
    assert linear_at < moe_at and "| format × activations | T=1 | T=64 |" in done.stdout[moe_at:]
    row = next(line for line in done.stdout[moe_at:].splitlines() if line.startswith("| MXFP4 × mxfp8"))
    speedups = [r["speedup"] for r in moe if r["backend"] == "auto"]
    assert row.split(" | ")[1:] == [f"{speedups[0]:.2f}<sup>b</sup>", f"{speedups[1]:.2f}<sup>b</sup> |"]
    assert "](results/performance_h200_moe_qwen3.png)" in done.stdout


def test_performance_page_without_auto_rows_takes_the_fastest_candidate(tmp_path):
    """A moe.py run that timed the plan's candidates alone: the fastest of them gives the cell (what a plan built
    from that run's table runs); the A/B forms the plans never run (its "@" suffixes) are left out."""
    times = {"tensor_core_moe": 40.0, "tensor_core_moe+held": 25.0, "triton_moe": 90.0, "tensor_core_moe@unfused": 5.0}
    rows = [dict(shape="gptoss", format="NVFP4", act="nvfp4", backend=b, t=1, us=us, bf16_ref_us=100.0)
            for b, us in times.items()]  # fmt: skip
    (tmp_path / "moe.json").write_text(json.dumps({"rows": rows, "date": "d", "device": "NVIDIA H200"}))
    done = _page(tmp_path, "moe.json")
    assert done.returncode == 0, done.stderr
    assert "| NVFP4 × nvfp4 | 4.00<sup>a</sup> |" in done.stdout


def test_performance_page_refuses_a_file_that_gives_no_cell(tmp_path, rng):
    """Every file the page reads gives a cell, so docs/results/ holds no file the page does not cite."""
    rows = _layer_rows(rng, [1], ["FP8"])
    for name in ("old.json", "new.json"):
        (tmp_path / name).write_text(json.dumps({"rows": rows, "date": name}))
    done = _page(tmp_path, "old.json", "new.json")
    assert done.returncode == 1 and "old.json" in done.stderr and "new.json" not in done.stderr


def test_performance_page_takes_each_cell_from_the_last_run_that_measured_it(tmp_path, rng):
    """benchmarks/performance_page.py: a cell measured by two runs shows the later one's speed-up and letter; a
    cell only the earlier run measured keeps it; a layer with a linear missing gives no cell."""
    old, new = _layer_rows(rng, [1, 16], ["FP8", "NVFP4"]), _layer_rows(rng, [16, 256], ["FP8"])
    new = [r for r in new if not (r["m"] == 256 and r["shape"] == "8b.down" and r["format"] == "FP8")]
    for name, rows in (("old.json", old), ("new.json", new)):
        (tmp_path / name).write_text(json.dumps({"rows": rows, "date": name}))
    done = _page(tmp_path, "old.json", "new.json")
    assert done.returncode == 0, done.stderr
    table = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in done.stdout.splitlines()
             if line.startswith("| FP8") or line.startswith("| NVFP4")}  # fmt: skip

    def speedup(rows, fmt, m):
        def total(f):
            return sum(r["dispatched"] for r in rows if r["format"] == f and r["m"] == m)

        return f"{total('bf16 F.linear') / total(fmt):.2f}"

    fp8, nvfp4 = table["FP8 × bf16"], table["NVFP4 × bf16"]  # columns M=1, M=16
    assert len(fp8) == 2 and "M=256" not in done.stdout
    assert fp8[0] == f"{speedup(old, 'FP8', 1)}<sup>a</sup>"
    assert fp8[1].rstrip(" |") == f"{speedup(new, 'FP8', 16)}<sup>b</sup>"
    assert nvfp4[1].rstrip(" |") == f"{speedup(old, 'NVFP4', 16)}<sup>a</sup>"
    assert "<sup>a</sup> [`old.json`](results/old.json)" in done.stdout
    assert "<sup>b</sup> [`new.json`](results/new.json)" in done.stdout


def test_moe_profile_runs_each_case_and_names_its_plan_row():
    """benchmarks/moe_profile.py (the Nsight Compute driver for the MoE at decode sizes) on the CPU's reference plan."""
    cmd = [sys.executable, str(ROOT / "benchmarks/moe_profile.py"), "tiny:NVFP4:bf16:1", "tiny:Q8_0:bf16:3",
           "--device", "cpu"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line.split(":")[1] for line in done.stdout.splitlines()] == ["NVFP4", "Q8_0"], done.stdout
    assert all("reference" in line for line in done.stdout.splitlines())


def test_sm90_tiles_summary_names_the_fastest_tile_and_the_rules(tmp_path):
    """benchmarks/sm90_tiles.py --from-json: the layer's time per tile (linears summed), the fastest, the rule's tile
    per linear and the layer at it."""
    rows = [dict(linear=lin, format="bf16", form="F.linear", m=m, tokens=0, us=10.0) for lin in ("o", "qkv")
            for m in (1, 512)]  # fmt: skip
    rows += [dict(linear=lin, format="NVFP4", form="cutlass_sm90", m=m, tokens=t, us=us) for lin in ("o", "qkv")
             for m, t, us in ((1, 16, 4.0), (1, 128, 8.0), (512, 128, 12.0), (512, 256, 9.0))]  # fmt: skip
    saved = tmp_path / "tiles.json"
    saved.write_text(json.dumps(dict(device="GPU", model="8b", ms=[1, 512], rows=rows)))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/sm90_tiles.py"), "--from-json", str(saved)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if "M=" in line]
    assert "16:     8.0 (2.50×)" in lines[0] and "best 16, rule 16      8.0" in lines[0]
    # at 512 tokens the 8B o's 256-token tiles fill fewer than half of 132 SMs: it keeps 128 (12.0), qkv 256 (9.0);
    # the rule's tiles in the linears' order of the model (qkv, o)
    assert "256:    18.0 (1.11×)" in lines[1] and "best 256, rule 256/128     21.0" in lines[1], lines[1]


def test_scaled_mm_scales_summary_sums_the_layer_per_variant(tmp_path):
    """benchmarks/scaled_mm_scales.py --from-json: each variant's layer time (linears summed) against bf16."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from scaled_mm_scales import VARIANTS
    finally:
        sys.path.pop(0)
    rows = [
        dict(linear=lin, m=64, variant=v, us=10.0 if v == "bf16" else 4.0) for lin in ("o", "qkv") for v in VARIANTS
    ]
    saved = tmp_path / "scales.json"
    saved.write_text(json.dumps(dict(device="GPU", ms=[64], rows=rows)))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/scaled_mm_scales.py"), "--from-json", str(saved)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith("64") and last.count("(2.50×)") == len(VARIANTS) - 1 and "(1.00×)" in last


def test_fragment_splits_summary_sums_the_layer_per_split_and_at_the_rules(tmp_path):
    """benchmarks/fragment_splits.py --from-json: the layer's time at each split (a linear past its largest split at
    that one), at each linear's fastest split and at the rule's, against bf16."""
    rows = [dict(linear=lin, format="bf16", m=1, splits=0, rule=0, us=10.0) for lin in ("o", "qkv")]
    rows += [dict(linear="o", format="NVFP4", m=1, splits=s, rule=2, us=us) for s, us in ((1, 6.0), (2, 4.0), (4, 5.0))]
    rows += [dict(linear="qkv", format="NVFP4", m=1, splits=s, rule=1, us=us) for s, us in ((1, 3.0), (2, 3.5))]
    saved = tmp_path / "splits.json"
    saved.write_text(json.dumps(dict(device="GPU", model="8b", ms=[1], rows=rows)))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/fragment_splits.py"), "--from-json", str(saved)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if "M=1" in line)
    # splits 1: 6 + 3; 2: 4 + 3.5; 4: 5 + 3.5 (qkv at its largest, 2); 8 as 4; best 4 + 3; rule 4 + 3
    assert "1:    9.0  2:    7.5  4:    8.5  8:    8.5" in line, line
    assert "best     7.0 (2.86×)" in line and "rule     7.0 (2.86×)" in line, line
