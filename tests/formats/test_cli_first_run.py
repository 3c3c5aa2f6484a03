"""What a new user meets on the command line: every input checked before any work, in the order the command line
gives them; a missing path named as missing; messages in the CLI's words (--force, never overwrite=True); a rule
that misses many modules answered with one glob that fixes them all; exit status 2 and one line, no traceback."""

import fnmatch

import numpy as np
import pytest

from b12x_formats.checkpoint import save_checkpoint
from b12x_formats.cli import main
from b12x_formats.example import TINY_LLAMA, llama_tensors
from b12x_formats.imatrix import ImportanceMatrix, write_imatrix

# hidden 160: no multiple of IQ2's group of 256, as SmolLM2's 576 is not; the MLP's 512 is
ODD = dict(TINY_LLAMA, hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80, num_hidden_layers=3)


def error_line(capsys) -> str:
    """The one stderr line of a failed command (no traceback, no second line)."""
    err = capsys.readouterr().err.strip().splitlines()[-1:]
    assert err and "Traceback" not in err[0] and " error: " in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd") / "hf"
    save_checkpoint(path, llama_tensors(ODD).items(), ODD)
    return path


@pytest.fixture
def imatrix(tmp_path):
    """A valid llama.cpp imatrix of ODD's down_proj layers (K = 512)."""
    sums = {f"blk.{i}.ffn_down.weight": np.ones((1, 512), np.float32) for i in range(ODD["num_hidden_layers"])}
    counts = {name: np.ones(1, np.float32) for name in sums}
    return write_imatrix(tmp_path / "imatrix.gguf", ImportanceMatrix(sums, counts))


def test_inspect_names_a_missing_path_as_missing(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nonexistent")]) == 2
    assert error_line(capsys) == f"b12x-formats inspect: error: PATH {tmp_path / 'nonexistent'} does not exist"


def test_quantize_complains_about_the_missing_input_before_the_present_output(tmp_path, capsys):
    (tmp_path / "try3").mkdir()
    assert main(["quantize", str(tmp_path / "missing"), str(tmp_path / "try3"), "--default", "Q8_0"]) == 2
    assert error_line(capsys) == f"b12x-formats quantize: error: HF_DIR {tmp_path / 'missing'} does not exist"


def test_quantize_refuses_an_existing_output_in_the_clis_words(tmp_path, odd, capsys):
    (tmp_path / "try3").mkdir()
    (tmp_path / "try3" / "notes.txt").write_text("mine")
    assert main(["quantize", str(odd), str(tmp_path / "try3"), "--default", "Q8_0"]) == 2
    line = error_line(capsys)
    assert line == f"b12x-formats quantize: error: OUT_DIR {tmp_path / 'try3'} exists; pass --force to replace it"
    assert (tmp_path / "try3" / "notes.txt").read_text() == "mine"


def test_quantize_without_a_format_says_which_options_to_pass(tmp_path, odd, capsys):
    assert main(["quantize", str(odd), str(tmp_path / "q")]) == 2
    line = error_line(capsys)
    assert "nothing to quantize: pass --default FMT" in line and "--layer GLOB=FMT" in line
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("rule", [["--layer", "*.mlp.down_proj=IQ2_XS"], ["--layer", "*.mlp.down_proj=Q8_0"]])
def test_a_missing_imatrix_is_named_whether_or_not_iq2_uses_it(tmp_path, odd, capsys, rule):
    argv = ["quantize", str(odd), str(tmp_path / "q"), "--default", "NVFP4", *rule]
    assert main([*argv, "--imatrix", str(tmp_path / "nofile.gguf")]) == 2
    assert error_line(capsys) == f"b12x-formats quantize: error: --imatrix {tmp_path / 'nofile.gguf'} does not exist"
    assert not (tmp_path / "q").exists()


def test_a_corrupt_imatrix_is_refused_though_no_iq2_layer_uses_it(tmp_path, odd, capsys):
    (tmp_path / "bad.dat").write_bytes(b"\x05\x00")
    argv = ["quantize", str(odd), str(tmp_path / "q"), "--default", "Q8_0", "--imatrix", str(tmp_path / "bad.dat")]
    assert main(argv) == 2
    assert "bad.dat" in error_line(capsys) and not (tmp_path / "q").exists()


def test_a_valid_imatrix_no_layer_uses_is_noted(tmp_path, odd, imatrix, capsys):
    assert main(["quantize", str(odd), str(tmp_path / "q"), "--default", "Q8_0", "--imatrix", str(imatrix)]) == 0
    err = capsys.readouterr().err
    assert f"note: --imatrix {imatrix} is valid but unused: only IQ2 layers use an importance matrix" in err
    assert main(["quantize", str(odd), str(tmp_path / "q2"), "--default", "Q8_0", "--layer",
                 "*.mlp.down_proj=IQ2_XS", "--imatrix", str(imatrix)]) == 0  # fmt: skip
    assert "note:" not in capsys.readouterr().err


def test_inputs_are_checked_in_command_line_order(tmp_path, odd, capsys):
    (tmp_path / "out").mkdir()
    argv = ["quantize", str(odd), str(tmp_path / "out"), "--default", "Q4_K", "--layer", "x", "--imatrix", "nofile"]
    assert main(argv) == 2
    assert "OUT_DIR" in error_line(capsys)
    argv[2] = str(tmp_path / "new")
    assert main(argv) == 2
    assert "--default Q4_K: unknown weight format 'Q4_K'" in error_line(capsys)
    argv[4] = "Q8_0"
    assert main(argv) == 2
    assert "--layer 'x': expected GLOB=FORMAT" in error_line(capsys)
    argv[6] = "*.down_proj=IQ9"
    assert main(argv) == 2
    assert "--layer '*.down_proj=IQ9': unknown weight format 'IQ9'" in error_line(capsys)
    argv[6] = "*.down_proj=Q8_0"
    assert main(argv) == 2
    assert "--imatrix nofile does not exist" in error_line(capsys)
    assert not (tmp_path / "new").exists()


def suggested_rule(line: str) -> str:
    """The --layer value a misfit message suggests."""
    return line.rsplit(": --layer '", 1)[1].split("'")[0]


def test_a_default_that_misses_many_modules_suggests_one_glob_for_them_all(tmp_path, odd, capsys):
    # the README's first form on a model of SmolLM2's kind: IQ2_XS by default, Q8_0 down_proj
    argv = ["quantize", str(odd), str(tmp_path / "q"), "--layer", "*.down_proj=Q8_0", "--default", "IQ2_XS"]
    assert main(argv) == 2
    line = error_line(capsys)
    assert "--default IQ2_XS: K=160 is not a multiple of 256, the group size of IQ2_XS, in 18 modules" in line
    assert "after the other --layer rules: --layer 'model.layers.*=NVFP4'" in line
    assert main([*argv, "--layer", suggested_rule(line)]) == 0
    assert "quantized from floating point: NVFP4 18, Q8_0 3" in capsys.readouterr().out


def test_a_rule_that_misses_some_of_its_modules_suggests_a_glob_of_those_only(tmp_path, odd, capsys):
    argv = ["quantize", str(odd), str(tmp_path / "q"), "--layer", "*.mlp.*=IQ2_XS"]
    assert main(argv) == 2
    line = error_line(capsys)
    assert "--layer '*.mlp.*=IQ2_XS': K=160 is not a multiple of 256, the group size of IQ2_XS, in 6 modules" in line
    rule = suggested_rule(line)
    glob = rule.split("=")[0]
    assert rule == "model.layers.*.mlp.[gu]*_proj=NVFP4", line
    assert not fnmatch.fnmatchcase("model.layers.0.mlp.down_proj", glob)  # the rule's fitting modules keep IQ2_XS
    assert "before --layer '*.mlp.*=IQ2_XS'" in line
    assert main(["quantize", str(odd), str(tmp_path / "q"), "--layer", rule, "--layer", "*.mlp.*=IQ2_XS"]) == 0
    assert "IQ2_XS 3, NVFP4 6" in capsys.readouterr().out


def test_inspect_lists_layers_in_natural_order(tmp_path, capsys):
    cfg = dict(TINY_LLAMA, num_hidden_layers=11)
    save_checkpoint(tmp_path / "hf", llama_tensors(cfg).items(), cfg)
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "hf")]) == 0
    layers = [line.split(".")[2] for line in capsys.readouterr().out.splitlines() if line.startswith("model.layers.")]
    numbers = [int(n) for n in dict.fromkeys(layers)]
    assert numbers == list(range(11))


def test_example_help_and_formats_table(capsys):
    with pytest.raises(SystemExit):
        main(["example", "--help"])
    assert "demo" not in capsys.readouterr().out
    assert main(["formats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    starts = {line.index(" " + line.split()[5]) for line in lines[1:]}  # where each row's layout column starts
    assert starts == {header.index(" layout")}, lines


def test_imatrix_of_a_quantized_checkpoint_says_what_to_give_instead(tmp_path, odd, capsys):
    assert main(["quantize", str(odd), str(tmp_path / "q"), "--default", "Q8_0"]) == 0
    (tmp_path / "calib.txt").write_text("a few words of text")
    argv = ["imatrix", str(tmp_path / "q"), "--text", str(tmp_path / "calib.txt"), "-o", str(tmp_path / "m.gguf")]
    assert main(argv) == 2
    line = error_line(capsys)
    assert f"MODEL {tmp_path / 'q'} holds 21 layers in b12x formats" in line and "b12x-formats dequantize" in line
    assert not (tmp_path / "m.gguf").exists()
