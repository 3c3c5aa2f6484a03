"""quantize --jobs: layers quantized in worker processes give the same bytes as one job, in bounded memory."""

import hashlib
import os

import numpy as np
import pytest

from b12x_formats.cli import main
from b12x_formats.parallel import Work, in_order


def _square(x):
    return x * x


def _fail(name):
    raise ValueError(f"layer {name}: broken on purpose")


def _pid(_):
    return os.getpid()


def test_results_come_back_in_order_with_plain_items_between(rng):
    values = rng.integers(-1000, 1000, 40).tolist()
    items = [Work(_square, (v,)) if i % 3 else ("plain", v) for i, v in enumerate(values)]
    got = list(in_order(items, jobs=2))
    assert got == [v * v if i % 3 else ("plain", v) for i, v in enumerate(values)]


def test_work_runs_in_other_processes():
    pids = set(in_order([Work(_pid, (i,)) for i in range(8)], jobs=2))
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


@pytest.mark.parametrize("max_bytes, most", [(1 << 40, 3), (100, 1)])
def test_inputs_in_flight_are_bounded(max_bytes, most):
    """At most jobs + 1 items (and their bytes under the bound, one item always) are taken before one comes back."""
    taken = 0

    def items():
        nonlocal taken
        for i in range(12):
            taken += 1
            yield Work(_square, (i,), nbytes=80)

    for returned, _ in enumerate(in_order(items(), jobs=2, max_inflight_bytes=max_bytes), start=1):
        assert taken - returned <= most


def test_a_failing_layer_raises_its_error_in_the_caller():
    with pytest.raises(ValueError, match="layer blk.3: broken on purpose"):
        list(in_order([Work(_square, (2,)), Work(_fail, ("blk.3",)), Work(_square, (3,))], jobs=2))


def test_jobs_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        list(in_order([1], jobs=0))


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.slow
def test_quantize_jobs_give_the_same_bytes_as_one(tmp_path):
    """Every kind of format at once (the example's weights have a fixed seed; the next test draws fresh ones)."""
    assert main(["example", str(tmp_path / "hf")]) == 0
    fmt_args = ["--default", "IQ2_XXS", "--layer", "*.down_proj=IQ2_XS", "--layer", "*.o_proj=NVFP4",
                "--layer", "*.v_proj=Q8_0", "--layer", "model.embed_tokens=Q8_0"]  # fmt: skip
    out = {}
    for jobs in (1, 2):
        target = tmp_path / f"q{jobs}"
        assert main(["quantize", str(tmp_path / "hf"), str(target), *fmt_args, "--jobs", str(jobs)]) == 0
        out[jobs] = _digests(target)
    assert out[1] == out[2]
    assert len(out[1]) >= 4  # shards, index, config, quant config, tokenizer


def test_jobs_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["quantize", str(tmp_path), str(tmp_path / "q"), "--default", "Q8_0", "--jobs", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def test_random_checkpoint_same_bytes_for_every_job_count(tmp_path, rng):
    """Random weights of odd sizes (not the example's fixed seed): the stream is identical for 1, 2 and 3 jobs."""
    import ml_dtypes

    from b12x_formats.checkpoint import save_checkpoint

    tensors = {
        f"model.layers.{i}.mlp.down_proj.weight": rng.standard_normal(
            (int(rng.integers(1, 40)), 256 * int(rng.integers(1, 4)))
        ).astype(ml_dtypes.bfloat16)
        for i in range(5)
    }
    tensors["model.norm.weight"] = np.ones(8, ml_dtypes.bfloat16)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 5}
    save_checkpoint(tmp_path / "hf", tensors.items(), config, total=len(tensors))
    digests = []
    for jobs in (1, 3):
        out = tmp_path / f"q{jobs}"
        assert main(["quantize", str(tmp_path / "hf"), str(out), "--default", "IQ2_XS", "--jobs", str(jobs)]) == 0
        digests.append(_digests(tmp_path / f"q{jobs}"))
    assert digests[0] == digests[1]
