"""A broken checkpoint at start-up (bad_checkpoints.py: a truncated safetensors file, a wrong block_payload_bytes,
MoE experts in a format the fused MoE does not run, a tensor-parallel shard that breaks a block) ends vLLM's server
with a non-zero status and one line naming the file, the tensor and the rule: no traceback, no process left,
nothing listening, within BAD_START_S. b12x_vllm/preflight.py checks before any engine process starts; the
in-process tests check the same cases in milliseconds."""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from bad_checkpoints import CASES  # noqa: E402
from vllm_server import listening, run_to_exit  # noqa: E402

from b12x_vllm import preflight  # noqa: E402

# an error line: vLLM's ERROR log level, an exception's "SomeError: ..." line, or b12x's own
ERROR = re.compile(r" ERROR |^\w*(Error|Exception)\b|^b12x: error: ")
BAD_START_S = 120  # measured: 20 s on the 2-core CI machine (vLLM's imports; nothing is loaded)


def engine_args(bad, **extra) -> SimpleNamespace:
    """What preflight reads of vLLM's EngineArgs, as the server's flags set them."""
    flags = dict(zip(bad.flags[::2], bad.flags[1::2], strict=True))
    tp = int(flags.get("--tensor-parallel-size", 1))
    return SimpleNamespace(model=str(bad.model), quantization=None, linear_backend="b12x", moe_backend="b12x",
                           tensor_parallel_size=tp, **extra)  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_preflight_names_file_tensor_and_rule(case, tiny_models, tmp_path):
    bad = CASES[case](tiny_models, tmp_path)
    with pytest.raises(preflight.CheckpointError) as err:
        preflight.check_engine_args(engine_args(bad))
    assert f"b12x: error: {err.value}" == f"b12x: error: {bad.line}"


@pytest.mark.parametrize("arch,tp", [("llama", 1), ("llama", 2), ("qwen3_moe", 1)])
def test_preflight_passes_the_good_checkpoints(arch, tp, tiny_models):
    """(The Llama's mix keeps every per-rank K whole blocks over two ranks; the MoE's IQ2_XS experts would not.)"""
    args = SimpleNamespace(model=str(tiny_models[arch].quantized), quantization=None, linear_backend="b12x",
                           moe_backend="b12x", tensor_parallel_size=tp)  # fmt: skip
    preflight.check_engine_args(args)


def test_preflight_leaves_checkpoints_b12x_does_not_run(tiny_models, tmp_path):
    """A float checkpoint (the twin) is not b12x's: preflight reads nothing of it, vLLM's own loader checks it."""
    args = SimpleNamespace(model=str(tiny_models["llama"].floating), quantization=None, linear_backend="auto",
                           moe_backend="auto", tensor_parallel_size=1)  # fmt: skip
    preflight.check_engine_args(args)


def test_the_hook_shows_only_checkpoint_errors_as_one_line(capsys):
    seen = []
    hook = preflight.show_without_traceback(lambda *exc: seen.append(exc))
    hook(preflight.CheckpointError, preflight.CheckpointError("f.safetensors: tensor 'w' [2]: rule"), None)
    assert capsys.readouterr().err == "b12x: error: f.safetensors: tensor 'w' [2]: rule\n" and not seen
    error = RuntimeError("a bug")
    hook(RuntimeError, error, None)
    assert seen == [(RuntimeError, error, None)]
    assert sys.excepthook is not hook


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_server_stops_with_one_line(case, tiny_models, tmp_path):
    bad = CASES[case](tiny_models, tmp_path)
    ended = run_to_exit(bad.model, tmp_path / "server.log", "--enforce-eager", *bad.flags, timeout=BAD_START_S)
    assert ended.status is not None, f"still running after {BAD_START_S} s:\n{ended.output[-3000:]}"
    assert ended.status != 0 and "Traceback" not in ended.output, ended.output[-6000:]
    lines = ended.output.rstrip().splitlines()
    assert lines[-1] == f"b12x: error: {bad.line}", ended.output[-6000:]  # the last words, and the only error
    assert [line for line in lines if ERROR.search(line)] == lines[-1:], ended.output[-6000:]
    assert not ended.group_left and not listening(ended.port)
    print(f"{case}: exit status {ended.status} after {ended.seconds:.1f} s")
