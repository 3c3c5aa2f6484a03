"""`b12x-formats` command line: inspect, quantize, imatrix, convert-gguf, dequantize, example, formats."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from .api import formats, spec
from .output import Terminated
from .parallel import default_jobs


def _exists(path: str, what: str) -> Path:
    """`path`, or FileNotFoundError naming it as missing and as the command line calls it."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    return Path(path)


def _output(out: str, force: bool, inputs: list[Path]) -> None:
    """Refuse an OUT_DIR the command would not write, in the command line's words (check_output's rules)."""
    from .output import check_output

    try:
        check_output(out, inputs, force)
    except FileExistsError:
        raise FileExistsError(f"OUT_DIR {out} exists; pass --force to replace it") from None


def _inspect(args) -> None:
    from .inspect import inspect_path, render

    rows = inspect_path(_exists(args.path, "PATH"))
    if args.json:
        print(json.dumps([asdict(r) | {"bits_per_weight": r.bits_per_weight} for r in rows], indent=2))
    else:
        print(render(rows))


def _quantize(args) -> None:
    """Every input checked in the order the command line gives them (HF_DIR, OUT_DIR, --default, --layer, --keep,
    --imatrix), then what the rules choose (every module's K against its format), before any layer is quantized."""
    from .checkpoint import Checkpoint
    from .hf_quantize import USES_IMPORTANCE, QuantizePlan, importance_for, quantize_checkpoint
    from .imatrix import read_imatrix
    from .layer_choice import choose_layers, summary
    from .validate import check_checkpoint

    src = _exists(args.hf_dir, "HF_DIR")
    if not src.is_dir():
        raise ValueError(f"HF_DIR {src} is not a directory (quantize reads a checkpoint directory; a .gguf file goes "
                         "through convert-gguf first)")  # fmt: skip
    _output(args.out_dir, args.force, [src])
    plan = QuantizePlan.from_cli(args.default, args.layer, args.keep)
    matrix = read_imatrix(_exists(args.imatrix, "--imatrix")) if args.imatrix else None  # valid, used or not
    ckpt = Checkpoint(src)
    check_checkpoint(ckpt)
    choices = choose_layers(ckpt, plan)
    plan.check_globs(name.rpartition(".")[0] for name in ckpt.tensor_names())
    if not any(c.action != "keep" for c in choices.values()):
        if plan.default is None and not plan.rules:
            raise ValueError("nothing to quantize: pass --default FMT (every linear layer) or --layer GLOB=FMT "
                             "(the modules GLOB matches), e.g. --default NVFP4")  # fmt: skip
        raise ValueError(f"nothing to quantize: every module these options choose stays as {src} stores it "
                         "(--default applies to floating-point linear layers only; a --layer rule with another "
                         "format re-quantizes a stored one)")  # fmt: skip
    chosen = {p: c.target for p, c in choices.items() if c.action != "keep"}
    if matrix is not None and any(fmt in USES_IMPORTANCE for fmt in chosen.values()):
        importance_for(matrix, ckpt, chosen, label=args.imatrix)  # an entry of the right width for every IQ2 layer
    elif matrix is not None:
        print(f"b12x-formats quantize: note: --imatrix {args.imatrix} is valid but unused: only IQ2 layers use an "
              "importance matrix, and these options quantize none to IQ2", file=sys.stderr)  # fmt: skip
    out = quantize_checkpoint(src, args.out_dir, plan, overwrite=args.force, jobs=args.jobs, imatrix=matrix)
    print(summary(choices))
    print(f"wrote {out}")


def _imatrix(args) -> None:
    from .imatrix import write_imatrix
    from .imatrix_compute import compute_imatrix

    model = _exists(args.model, "MODEL")
    if (model / "config.json").is_file():  # transformers runs float layers only
        from .checkpoint import Checkpoint

        stored = Checkpoint(model).quantized_layers()
        if stored:
            prefix, fmt = next(iter(stored.items()))
            raise ValueError(
                f"MODEL {model} holds {len(stored)} layer{'s' * (len(stored) > 1)} in b12x formats ({prefix}: {fmt}), "
                "which transformers cannot run; give its .gguf file, or its bf16 twin "
                "(b12x-formats dequantize MODEL TWIN_DIR)"
            )
    _exists(args.text, "--text")
    if Path(args.output).exists() and not args.force:  # before the model runs, not after
        raise FileExistsError(f"--output {args.output} exists; pass --force to replace it")
    matrix = compute_imatrix(args.model, args.text, chunk_size=args.chunk)
    print(f"wrote {write_imatrix(args.output, matrix, overwrite=args.force)} ({len(matrix.sums)} entries)")


def _convert_gguf(args) -> None:
    from .gguf_convert import convert_gguf

    _output(args.out_dir, args.force, [_exists(args.gguf_file, "GGUF_FILE")])
    out = convert_gguf(args.gguf_file, args.out_dir, overwrite=args.force)
    print(f"wrote {out}")


def _example(args) -> None:
    from .example import write_example

    _output(args.out_dir, args.force, [])
    print(f"wrote {write_example(args.out_dir, overwrite=args.force, arch=args.arch)}")


def _dequantize(args) -> None:
    from .hf_quantize import dequantize_checkpoint

    _output(args.out_dir, args.force, [_exists(args.ckpt_dir, "CKPT_DIR")])
    print(f"wrote {dequantize_checkpoint(args.ckpt_dir, args.out_dir, overwrite=args.force)}")


def _formats(args) -> None:
    specs = [spec(name) for name in formats()]
    acts = max(len("activations"), *(len(",".join(s.activations)) for s in specs))
    print(f"{'format':<12} {'group':>5} {'block B':>7} {'bits/w':>7}  {'activations':<{acts}}  layout")
    for s in specs:
        print(
            f"{s.name:<12} {s.group_size or '-':>5} {s.block_bytes or '-':>7} {s.bits_per_weight:>7.4g}  "
            f"{','.join(s.activations):<{acts}}  {s.doc}"
        )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="b12x-formats", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="per-layer format, shape, bytes and bits/weight of a checkpoint dir or .gguf")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable rows")
    p.set_defaults(run=_inspect)

    def writes_to(p):  # every command that writes a checkpoint: OUT_DIR, replaced only with --force
        p.add_argument("out_dir")
        p.add_argument(
            "--force",
            action="store_true",
            help="replace OUT_DIR if it holds a checkpoint (never an input or other data)",
        )

    p = sub.add_parser("quantize", help="quantize a Hugging Face checkpoint (float, or with b12x layers) into ModelOpt")
    p.add_argument("hf_dir")
    writes_to(p)
    p.add_argument("--default", metavar="FMT", help=f"format of unnamed linear layers: {', '.join(formats())}")
    p.add_argument(
        "--layer", action="append", default=[], metavar="GLOB=FMT", help="per-module format; first match wins"
    )
    p.add_argument("--keep", action="append", default=[], metavar="GLOB", help="modules to keep floating point")
    p.add_argument(
        "--imatrix", metavar="FILE", help="llama.cpp importance matrix (GGUF or legacy .dat) for the IQ2 layers"
    )
    p.add_argument(
        "--jobs", type=_positive, default=default_jobs(), metavar="N",
        help=f"layers quantized at once, in worker processes (default: all {default_jobs()} cores; same bytes)",
    )  # fmt: skip
    p.set_defaults(run=_quantize)

    p = sub.add_parser("imatrix", help="compute a llama.cpp importance matrix of a model over a calibration text")
    p.add_argument("model", help="Hugging Face checkpoint directory or .gguf file (run on CPU with transformers)")
    p.add_argument("--text", required=True, metavar="FILE", help="calibration text (UTF-8)")
    p.add_argument("-o", "--output", default="imatrix.gguf", help="output file (default imatrix.gguf)")
    p.add_argument("--chunk", type=_positive, default=512, metavar="TOKENS", help="tokens per chunk (default 512)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.set_defaults(run=_imatrix)

    p = sub.add_parser("convert-gguf", help="turn a llama.cpp GGUF model into a ModelOpt mixed-precision checkpoint")
    p.add_argument("gguf_file")
    writes_to(p)
    p.set_defaults(run=_convert_gguf)

    p = sub.add_parser("dequantize", help="decode a quantized checkpoint back to a bf16 one (a float reference)")
    p.add_argument("ckpt_dir")
    writes_to(p)
    p.set_defaults(run=_dequantize)

    p = sub.add_parser("example", help="write a tiny random bf16 checkpoint (Llama or Qwen3-MoE shaped, for tests)")
    writes_to(p)
    p.add_argument("--arch", choices=["llama", "qwen3_moe"], default="llama")
    p.set_defaults(run=_example)

    p = sub.add_parser("formats", help="list the supported weight formats")
    p.set_defaults(run=_formats)

    debug = "on an error, print the Python traceback too (for bug reports)"
    parser.add_argument("--debug", action="store_true", help=debug)
    for command in sub.choices.values():  # also after the command; SUPPRESS keeps a global --debug
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug)
    return parser


def _one_line(err: BaseException) -> str:
    """The message of `err` on one line; exceptions that are not the documented kinds also say their type."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    text = "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "(no message)"
    if not isinstance(err, (ValueError, OSError, KeyError, ImportError)):
        text = f"{type(err).__name__}: {text}"
    return text


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 with one `error:` line for any failure (never a traceback unless --debug);
    128 + signal number when SIGTERM or Ctrl-C stopped a write (the partial output is removed first)."""
    args = build_parser().parse_args(argv)
    where = f"b12x-formats {args.command}"
    try:
        args.run(args)
    except (Terminated, KeyboardInterrupt) as err:
        print(f"{where}: error: {err or 'interrupted'}; nothing was written", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)
    except Exception as err:  # bad input of any kind: one line, the traceback only on request
        if args.debug:
            traceback.print_exc()
        print(f"{where}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
