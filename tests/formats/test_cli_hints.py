"""One-line answers for what a new user runs into: a missing extra names what to install from the repository
(and only once the input file is known to exist); `example` never writes a checkpoint without a tokenizer."""

import sys

import pytest

from b12x_formats.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "error:" in err, err
    return err


def test_convert_gguf_names_a_missing_file_before_any_extras_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the [convert] extra were not installed
    assert main(["convert-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "out")]) == 2
    err = one_error_line(capsys)
    assert f"GGUF_FILE {tmp_path / 'nope.gguf'} does not exist" in err and "convert]" not in err


def test_convert_gguf_without_transformers_says_what_to_install_from_the_repo(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["convert-gguf", str(tmp_path / "m.gguf"), str(tmp_path / "out")]) == 2
    assert "pip install -e 'packages/b12x-formats[convert]'" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_imatrix_without_transformers_and_with_missing_inputs(tmp_path, monkeypatch, capsys):
    text = tmp_path / "calib.txt"
    assert main(["imatrix", str(tmp_path), "--text", str(text), "-o", str(tmp_path / "m.gguf")]) == 2
    assert "calib.txt" in one_error_line(capsys)
    text.write_text("some words " * 20)
    assert main(["imatrix", str(tmp_path / "nomodel"), "--text", str(text), "-o", str(tmp_path / "m.gguf")]) == 2
    assert f"MODEL {tmp_path / 'nomodel'} does not exist" in one_error_line(capsys)
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["imatrix", str(tmp_path), "--text", str(text), "-o", str(tmp_path / "m.gguf")]) == 2
    assert "packages/b12x-formats[convert]" in one_error_line(capsys)
    assert not (tmp_path / "m.gguf").exists()


def test_example_writes_a_tokenizer_that_covers_the_vocabulary(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    import json

    assert main(["example", str(tmp_path / "hf")]) == 0
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    vocab = json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"]
    assert tok.get_vocab_size() == vocab
    ids = tok.encode("the quick brown fox").ids
    assert ids and max(ids) < vocab and tok.decode(ids) == "the quick brown fox"


def test_example_without_tokenizers_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert main(["example", str(tmp_path / "hf")]) == 2
    assert "pip install tokenizers" in one_error_line(capsys)
    assert not (tmp_path / "hf").exists()
