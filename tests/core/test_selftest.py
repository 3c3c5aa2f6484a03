"""The self-test (b12x_core.selftest, `b12x-selftest`): the checks it lists for a GPU (worked out from a DeviceInfo
built by hand, as test_plan.py does, against the registry asked pair by pair), the screen it prints from results,
its arguments, the paths it names, what it does without a GPU, and on a GPU a short run. Running one check, and a
check failing where a kernel is wrong, is tests/kernels/test_selftest_runs.py (the interpreter's shims live there)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import b12x_formats as bf
from b12x_core import backends
from b12x_core.backends import DeviceInfo
from b12x_core.moe import MOE_FORMATS
from b12x_core.recipe import activation_mode
from b12x_core.selftest import checks as checklist
from b12x_core.selftest import cli, report
from b12x_core.selftest.checks import Check
from b12x_core.selftest.paths import PATH_TOKENS, paths
from b12x_core.selftest.paths import Path as PlanPath
from b12x_core.selftest.run import Result

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda", 0)
H200 = DeviceInfo(CUDA, (9, 0), sms=132, smem_kb=227, name="NVIDIA H200")
RTX_5090 = DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99, name="NVIDIA GeForce RTX 5090",
                      block_scaled_mm="cuBLASLt's block-scaled FP8 GEMM is verified on sm_90 only, this is sm_120")  # fmt: skip
NOT_BUILT = "the CUDA kernels are not built: no nvcc"
TRITON_ONLY = DeviceInfo(CUDA, (12, 0), sms=170, smem_kb=99, kernels=NOT_BUILT, sm90_mixed=NOT_BUILT,
                         block_scaled_mm="not verified here")  # fmt: skip
DEVICES = {"h200": H200, "rtx5090": RTX_5090, "triton_only": TRITON_ONLY}


def _every_pair(family: str):
    """(format, activation, input_scale present, query) of every pair the family's ops take, written out here."""
    if family == "linear":
        for fmt in bf.FORMATS:
            for activation in bf.spec(fmt).activations:
                for scaled in (True, False) if (fmt, activation) == ("FP8", "fp8") else (activation == "nvfp4",):
                    yield fmt, activation, scaled
    elif family == "moe":
        for fmt, activations in MOE_FORMATS.items():
            for activation in activations:
                yield fmt, activation, activation == "nvfp4"
    else:
        yield "Q8_0", "bf16", False


QUERY = {"linear": checklist.linear_query, "moe": checklist.moe_query, "embedding": checklist.embedding_query}


@pytest.mark.parametrize("device", DEVICES)
def test_checks_cover_every_backend_on_every_pair_it_serves(device):
    """Every (backend, format, mode) the registry says can run on the device is a check, and nothing else is; a
    backend that runs no pair there is one row with its reason; the references (the oracle) are never checked."""
    info = DEVICES[device]
    found = checklist.checks(info)
    for family in checklist.FAMILIES:
        for cls in backends.for_op(family):
            mine = [c for c in found if c.family == family and c.backend == cls.name]
            if cls.name.startswith("reference"):
                assert mine == []
                continue
            serves = {(f, activation_mode(f, a, s)) for f, a, s in _every_pair(family)
                      if cls.can_implement(QUERY[family](f, a, s, info))[0]}  # fmt: skip
            if serves:
                assert sorted((c.format, c.mode) for c in mine) == sorted(serves), cls.name
                assert all(not c.skip for c in mine)
            else:
                assert len(mine) == 1 and mine[0].format == "" and mine[0].skip, cls.name
    assert len({c.name for c in found}) == len(found)  # one check per backend × format × mode


def test_checks_on_an_rtx_5090_skip_the_hopper_backends_for_the_gpu_not_the_format():
    skipped = {c.backend: c.skip for c in checklist.checks(RTX_5090) if c.skip}
    assert set(skipped) == {"block_scaled_mm", "tensor_core_wgmma", "cutlass_sm90", "cutlass_sm90_checkpoint",
                            "fragment_mma", "tensor_core_moe_wgmma", "cutlass_sm90_moe"}  # fmt: skip
    assert all("sm_90" in why or "9.0" in why for why in skipped.values()), skipped
    ran = {(c.backend, c.format, c.mode) for c in checklist.checks(RTX_5090) if not c.skip}
    assert {("tensor_core", "NVFP4", "nvfp4"), ("triton_moe", "MXFP4", "mxfp8"), ("scaled_mm", "FP8", "fp8_token"),
            ("cuda_embedding_q8_0", "Q8_0", "bf16")} <= ran  # fmt: skip


def test_checks_without_the_extension_say_it_is_not_built_and_run_the_triton_backends():
    found = checklist.checks(TRITON_ONLY)
    assert {c.backend for c in found if not c.skip} == {"dequant_gemm", "triton_tiles", "triton_moe", "scaled_mm"}
    assert {c.skip for c in found if c.backend in ("tensor_core", "cuda_gemv", "tensor_core_moe")} == {NOT_BUILT}


@pytest.mark.parametrize("device", DEVICES)
def test_quick_checks_take_the_fast_tiers_mode(device):
    """--quick: one mode per backend × format: bf16 where the backend runs it, else its first quantized mode."""
    info = DEVICES[device]
    every, quick = checklist.checks(info), checklist.checks(info, all_modes=False)
    assert {(c.backend, c.format) for c in quick} == {(c.backend, c.format) for c in every}
    assert len(quick) == len({(c.backend, c.format) for c in quick})
    for c in quick:
        modes = [d.mode for d in every if (d.backend, d.format) == (c.backend, c.format)]
        assert c.mode == ("bf16" if "bf16" in modes else modes[0])


def test_the_list_needs_no_gpu(monkeypatch):
    """checks() and paths() ask nothing of CUDA: the lists for a GPU that is not here come out the same."""

    def refuse(*args, **kwargs):
        raise AssertionError("touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", refuse)
    monkeypatch.setattr(torch.cuda, "get_device_properties", refuse)
    assert checklist.checks(RTX_5090) == checklist.checks(RTX_5090)
    assert paths(RTX_5090) == paths(RTX_5090)


@pytest.mark.parametrize("device", ["h200", "rtx5090"])
def test_paths_name_a_backend_that_runs_the_pair_at_every_token_count(device):
    info = DEVICES[device]
    found = paths(info)
    expect = [(f, activation_mode(f, a, s)) for f, a, s in _every_pair("linear")]
    assert [(p.format, p.mode) for p in found] == expect
    by_name = {cls.name: cls for cls in backends.for_op("linear")}
    for p in found:
        query = checklist.linear_query(p.format, p.activation, p.mode in ("nvfp4", "fp8_static"), info, 4096, 4096,
                                       4096)  # fmt: skip
        assert len(p.backends) == len(PATH_TOKENS)
        assert all(by_name[name].can_implement(query)[0] for name in p.backends), p
    if device == "rtx5090":  # nothing measured on SM120: the conservative defaults, said so
        assert {p.basis for p in found} == {"defaults"}


# ---------------------------------------------------------------------------------------------------- the screen
FACTS = {"name": "NVIDIA GeForce RTX 5090", "arch": "sm_120", "capability": [12, 0], "sms": 170, "smem_kb": 99,
         "torch": "2.11.0 (CUDA 13.0)", "triton": "3.6.0", "kernels": "built for 90, 120a, 121a"}  # fmt: skip


def _results() -> list[Result]:
    c = Check
    return [
        Result(c("linear", "tensor_core", "NVFP4", "bf16"), "pass", error=0.003),
        Result(c("linear", "tensor_core", "NVFP4", "nvfp4", True), "fail", "7 tokens: error 0.034", 0.034),
        Result(c("linear", "tensor_core", "Q8_0", "bf16"), "pass", error=0.001),
        Result(c("linear", "triton_tiles", "IQ2_XS", "bf16"), "skip", "not run: the time budget (--budget 1 s) was spent"),
        Result(c("linear", "tensor_core_wgmma", skip="wgmma is an sm_90a instruction"), "skip", "wgmma is an sm_90a instruction"),
        Result(c("linear", "cutlass_sm90", skip="wgmma is an sm_90a instruction"), "skip", "wgmma is an sm_90a instruction"),
        Result(c("moe", "triton_moe", "MXFP4", "mxfp8"), "fail", "RuntimeError: CUDA error: an illegal memory access"),
        Result(c("embedding", "cuda_embedding_q8_0", "Q8_0", "bf16"), "pass", error=0.0),
    ]  # fmt: skip


PATHS = [PlanPath("NVFP4", "bf16", "bf16", ("tensor_core", "tensor_core", "dequant_gemm"), "defaults"),
         PlanPath("FP8_BLOCK", "fp8", "fp8_group128", ("cuda_gemv", "triton_tiles", "triton_tiles"), "defaults")]  # fmt: skip


def _column(lines: list[str], header: str, word: str) -> tuple[int, int]:
    head = next(i for i, line in enumerate(lines) if line.startswith(header))
    return head, lines[head].index(word)


def test_screen_shows_each_family_by_backend_mode_and_format():
    text = report.screen(FACTS, _results(), PATHS, 12.3, 42)
    lines = text.splitlines()
    assert "NVIDIA GeForce RTX 5090 (sm_120, 170 SMs" in lines[1]
    head, nvfp4 = _column(lines, "linear", "NVFP4")
    _, q8 = _column(lines, "linear", "Q8_0")
    rows = {tuple(line.split()[:2]): line for line in lines[head + 1 : head + 4]}
    bf16, nv = rows[("tensor_core", "bf16")], rows[("tensor_core", "nvfp4")]
    assert bf16[nvfp4:].startswith("PASS") and bf16[q8:].startswith("PASS")
    assert nv[nvfp4:].startswith("FAIL") and nv[q8:].startswith("·")
    assert rows[("triton_tiles", "bf16")].endswith("skip")  # IQ2_XS: the last column
    assert "  not here: tensor_core_wgmma, cutlass_sm90: wgmma is an sm_90a instruction" in lines
    _, mx = _column(lines, "moe", "MXFP4")
    assert next(line for line in lines if line.startswith("  triton_moe"))[mx:] == "FAIL"
    assert "FAIL linear tensor_core NVFP4 × nvfp4: 7 tokens: error 0.034" in lines
    assert "FAIL moe triton_moe MXFP4 × mxfp8: RuntimeError: CUDA error: an illegal memory access" in lines
    assert "skip (1 check): not run: the time budget (--budget 1 s) was spent" in lines
    assert lines[-2] == (
        "3 passed, 2 failed, 1 not run, 2 backends that cannot run here, in 12 s (1, 7, 64 tokens a "
        "call; inputs from seed 42: --seed 42)"
    )
    assert lines[-1].startswith("A check failed")


def test_screen_shows_the_paths_by_token_count():
    lines = report.screen(FACTS, _results()[:1], PATHS, 1.0, 1).splitlines()
    head, m64 = _column(lines, "  format × mode", "M=64")
    assert lines[head - 1].startswith("The plans' path here, on Llama-3.1-8B o_proj (N=4096, K=4096)")
    assert lines[head + 1].startswith("  NVFP4 × bf16 ") and lines[head + 1][m64:].startswith("tensor_core ")
    assert lines[head + 2][m64:].startswith("triton_tiles ") and lines[head + 2].endswith(" defaults")
    assert "A check failed" not in "\n".join(lines)


def test_summary_counts_in_words():
    one_backend = [r for r in _results() if r.check.backend != "cutlass_sm90"]
    assert report.summary(one_backend, 1.0, 3).startswith("3 passed, 2 failed, 1 not run, 1 backend that cannot run")
    assert report.summary(_results()[:1], 1.0, 3).startswith("1 passed, 0 failed, in 1 s")


def test_json_holds_every_result_and_path():
    saved = json.loads(json.dumps(report.as_json(FACTS, _results(), PATHS, 12.3, 42)))
    assert saved["device"]["name"] == FACTS["name"] and saved["seed"] == 42
    assert saved["counts"] == {"passed": 3, "failed": 2, "not run": 1, "backends that cannot run here": 2}
    assert [r["status"] for r in saved["results"]] == [r.status for r in _results()]
    assert saved["results"][1] | {"seconds": 0} == {
        "family": "linear", "backend": "tensor_core", "format": "NVFP4", "activation": "nvfp4", "mode": "nvfp4",
        "status": "fail", "detail": "7 tokens: error 0.034", "error": 0.034, "seconds": 0}  # fmt: skip
    assert saved["paths"][1]["backends"] == {"1": "cuda_gemv", "64": "triton_tiles", "1024": "triton_tiles"}


# ---------------------------------------------------------------------------------------------- the command line
def test_arguments():
    args = cli.parse_args([])
    assert (args.json, args.quick, args.only, args.budget, args.seed, args.device) == (None, False, [], None, None,
                                                                                       "cuda")  # fmt: skip
    args = cli.parse_args(["--json", "out.json", "--quick", "--only", "NVFP4", "--only", "moe", "--budget", "2.5",
                           "--seed", "7", "--device", "cuda:1"])  # fmt: skip
    assert (args.json, args.quick, args.only, args.budget, args.seed, args.device) == (
        Path("out.json"), True, ["NVFP4", "moe"], 2.5, 7, "cuda:1")  # fmt: skip
    for bad in (["--budget", "-1"], ["--seed", "x"], ["--frobnicate"]):
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(bad)
        assert exit_.value.code == 2


def test_only_selects_by_name():
    found = checklist.checks(RTX_5090)
    picked = cli.selected(found, ["tensor_core NVFP4", "embedding"])
    assert picked and {c.backend for c in picked} == {"tensor_core", "cuda_embedding_q8_0"}
    assert all(c.format in ("NVFP4", "Q8_0") for c in picked)
    assert cli.selected(found, []) == found


def _run(module: str, *args: str, env=None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(str(ROOT / "packages" / p / "src") for p in ("b12x-formats", "b12x-kernels", "b12x-core"))
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, *module.split(), *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize("module", ["b12x_core.selftest", "b12x_kernels.selftest"])
def test_without_a_gpu_it_says_what_it_would_check_and_exits_0(tmp_path, module):
    done = _run(f"-m {module}", "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "no CUDA GPU: nothing to check"
    names = [cls.name for cls in backends.REGISTRY if not cls.name.startswith("reference")]
    assert all(re.search(rf"\b{name}\b", done.stdout) for name in names)
    assert all(fmt in done.stdout for fmt in bf.FORMATS)
    assert json.loads((tmp_path / "out.json").read_text())["results"] == []


def test_the_kernels_entry_names_b12x_core_when_it_is_missing():
    code = "import sys, runpy; sys.modules['b12x_core'] = None; runpy.run_module('b12x_kernels.selftest', run_name='__main__')"
    done = _run("-c", code)
    assert done.returncode == 2 and "b12x-core is not installed" in done.stderr and "pip install" in done.stderr


def test_the_kernels_entry_imports_b12x_core_only_when_run():
    done = _run("-c", "import sys, b12x_kernels.selftest; print(sorted(m for m in sys.modules if 'b12x_core' in m))")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_the_console_script_is_declared():
    text = (ROOT / "packages/b12x-core/pyproject.toml").read_text()
    assert 'b12x-selftest = "b12x_core.selftest:main"' in text


@pytest.mark.gpu
def test_gpu_a_short_run_prints_its_report(tmp_path, capsys):
    """On the GPU: the fast tier's cases within a budget of a few seconds (the checks started before it ran
    out run to the end), the screen and the JSON."""
    code = cli.main(["--quick", "--budget", "3", "--json", str(tmp_path / "out.json"), "--seed", "1"])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "out.json").read_text())
    assert code == 0, out
    assert saved["counts"]["passed"] >= 1 and saved["counts"]["failed"] == 0
    assert torch.cuda.get_device_name() in out and "The plans' path here" in out
    assert out.splitlines()[-1].startswith(f"{saved['counts']['passed']} passed, 0 failed")
