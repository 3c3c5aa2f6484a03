"""timings.merge (the benchmarks' --emit-table): a run that re-measures some token counts of an entry keeps the
entry's other token counts, another GPU's run keeps the first GPU's entries, and the file is never rewritten in
place. The committed table names each entry's GPU."""

from __future__ import annotations

import json

from b12x_core import timings
from b12x_core.timings import Entry


def entry(ms, us, source, device=""):
    return Entry((9, 0), "NVFP4", "bf16", "4096x4096", tuple(ms), {k: tuple(v) for k, v in us.items()}, source,
                 device=device)  # fmt: skip


def test_a_partial_re_measure_keeps_the_other_token_counts(tmp_path):
    path = tmp_path / "timings.json"
    other = Entry((9, 0), "FP8", "bf16", "4096x4096", (1,), {"tensor_core": (9.0,)}, "older")
    old = entry([1, 16, 4096], {"tensor_core": [10.0, 20.0, 900.0], "cuda_gemv": [8.0, 40.0, None]}, "run A")
    path.write_text(timings.dumps([other, old]))
    new = entry([16, 64], {"tensor_core": [15.0, 30.0], "tensor_core_wgmma": [12.0, None]}, "run B")
    timings.merge(path, [new])
    merged = {e.format: e for e in timings.load.__wrapped__(path)}
    assert merged["FP8"] == other
    got = merged["NVFP4"]
    assert got.ms == (1, 16, 64, 4096)
    assert got.us["tensor_core"] == (10.0, 15.0, 30.0, 900.0)  # run B where it measured, run A elsewhere
    assert got.us["cuda_gemv"] == (8.0, 40.0, None, None)
    assert got.us["tensor_core_wgmma"] == (None, 12.0, None, None)
    assert "run B" in got.source and "run A" in got.source
    assert got.time("tensor_core", 32) == (20.0, "interpolated")
    assert [p.name for p in tmp_path.iterdir()] == ["timings.json"]  # written through a temporary, then renamed
    json.loads(path.read_text())


def test_merged_sources_name_each_run_once_with_the_token_counts_it_measured():
    """An entry's source after merges: one run's text when one run measured every token count; otherwise each run
    once, with its token counts, however many merges came before (the nested form earlier merges wrote included)."""
    a = entry([1, 16, 4096], {"tensor_core": [10.0, 20.0, 900.0]}, "run A")
    same = timings.merge_entry(a, entry([16], {"tensor_core": [21.0]}, "run A"))
    assert same.source == "run A"
    b = timings.merge_entry(a, entry([16, 64], {"tensor_core": [15.0, 30.0]}, "run B"))
    c = timings.merge_entry(b, entry([1, 64], {"tensor_core": [9.0, 29.0]}, "run C"))
    assert timings.token_sources(c) == {1: "run C", 16: "run B", 64: "run C", 4096: "run A"}
    assert c.source == "tokens 1, 64: run C; tokens 16: run B; tokens 4096: run A"
    nested = entry([1, 16, 64, 4096], {"tensor_core": [1.0, 2.0, 3.0, 4.0]},
                   "run C; tokens 16, 4096: run B; tokens 4096: run A")  # fmt: skip
    assert timings.token_sources(nested) == {1: "run C", 16: "run B", 64: "run C", 4096: "run A"}
    again = timings.merge_entry(nested, entry([4096], {"tensor_core": [5.0]}, "run C"))
    assert again.source == "tokens 1, 64, 4096: run C; tokens 16: run B"


def test_a_run_on_another_gpu_keeps_the_entries_of_the_first(tmp_path):
    """The key holds the GPU's name: an H100's run of a shape an H200 measured adds its own entry; a later H200 run
    (its name however spaced or cased) merges into the H200's."""
    path = tmp_path / "timings.json"
    h200 = entry([1, 16], {"tensor_core": [10.0, 20.0]}, "run A", device="NVIDIA H200")
    path.write_text(timings.dumps([h200]))
    h100 = entry([1, 16], {"tensor_core": [14.0, 28.0]}, "run B", device="NVIDIA H100 80GB HBM3")
    timings.merge(path, [h100])
    merged = {e.device: e for e in timings.load.__wrapped__(path)}
    assert merged == {"NVIDIA H200": h200, "NVIDIA H100 80GB HBM3": h100}
    timings.merge(path, [entry([16], {"tensor_core": [19.0]}, "run C", device="nvidia  H200")])
    merged = {timings.device_key(e.device): e for e in timings.load.__wrapped__(path)}
    assert merged.keys() == {"nvidia h200", "nvidia h100 80gb hbm3"}
    assert merged["nvidia h200"].us["tensor_core"] == (10.0, 19.0) and merged["nvidia h100 80gb hbm3"] == h100


def test_every_committed_entry_names_the_gpu_its_runs_measured_on():
    """timings.json: each entry records its GPU, the one every run its source names (a run's text begins with the
    GPU's name, then the date)."""
    entries = timings.load.__wrapped__(timings.TABLE)
    assert entries
    for e in entries:
        assert e.device, e.source
        for run in timings.token_sources(e).values():
            assert run.startswith(e.device + " "), (e.device, run)
