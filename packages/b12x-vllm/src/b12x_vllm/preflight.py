"""Checks of the checkpoint vLLM is about to load, made in the process that parsed the command line, before vLLM
reads the checkpoint or starts an engine process.

Without them a broken checkpoint fails deep in weight loading: tracebacks from the engine core and every worker,
and `vllm serve` exits only after they die. Here the same faults stop `vllm serve` (and `LLM(...)`) at once with a
`CheckpointError`: one line naming the file, the tensor and the rule, which the server shows without a traceback
(`show_without_traceback`). Only JSON and safetensors headers are read: milliseconds, for any checkpoint size.

Checked for checkpoints b12x runs (`config.claims`): every safetensors header (a truncated file names the first
tensor it cuts off); the quantization config (each `quantized_layers` entry against its format's facts); each
quantized layer's tensor names, dtypes and shapes; that MoE experts are in a format b12x's fused MoE runs; that
every tensor-parallel shard holds whole blocks (row-parallel layers split K over the ranks). Weight loading still
checks all of this itself (and the values); this only makes the common faults fail early and legibly.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import b12x_formats as bf
from b12x_formats.checkpoint import Checkpoint

# vLLM's RowParallelLinear layers of the decoder families b12x serves (Llama, Mistral, Qwen2/3 and their MoE forms,
# Mixtral's w2): each rank holds K / tp of them, so K / tp must be whole blocks. Column-parallel layers split N,
# whole rows, which every format allows.
ROW_PARALLEL = ("o_proj", "down_proj", "w2")
EXPERT = re.compile(r"\.experts\.\d+\.")


class CheckpointError(ValueError):
    """A checkpoint b12x cannot run, in one line: the file, the tensor (or layer) and the rule it breaks."""


def check_engine_args(args) -> None:
    """Check the checkpoint `args` (vLLM's EngineArgs) names, if b12x will run it; CheckpointError otherwise."""
    from .config import claims

    model = Path(str(args.model))
    if not (model / "config.json").is_file():
        return  # a hub name: vLLM downloads it later, and weight loading checks it
    source, cfg = quantization_config(model)
    requested = "b12x" in (str(args.linear_backend), str(args.moe_backend))
    try:
        if not claims(cfg, args.quantization, requested):
            return
    except ValueError as err:  # the quantization config: e.g. a quantized_layers entry against its format
        raise CheckpointError(one_line(f"{source}: {err}")) from None
    try:
        ckpt = Checkpoint(model)  # every safetensors header (its messages name the file)
    except (ValueError, OSError) as err:  # OSError: e.g. no .safetensors files (b12x reads no others)
        raise CheckpointError(one_line(err)) from None
    present = set(ckpt.tensor_names())
    for prefix, fmt in ckpt.quantized_layers().items():
        check_layer(ckpt, present, source, prefix, fmt, int(args.tensor_parallel_size or 1))


def quantization_config(model: Path) -> tuple[Path, dict | None]:
    """(file, dict) of the quantization config vLLM reads: config.json's, else hf_quant_config.json (older
    ModelOpt), which vLLM treats as ModelOpt's."""
    config = model / "config.json"
    try:
        cfg = json.loads(config.read_text()).get("quantization_config")
        legacy = model / "hf_quant_config.json"
        if cfg is None and legacy.is_file():
            return legacy, {"quant_method": "modelopt", **json.loads(legacy.read_text())}
    except (OSError, ValueError, AttributeError) as err:
        raise CheckpointError(one_line(f"{config}: not a readable JSON config ({err})")) from None
    return config, cfg


def check_layer(ckpt: Checkpoint, present: set[str], source: Path, prefix: str, fmt: str, tp: int) -> None:
    """One quantized layer's tensors (from their headers), its MoE format and its tensor-parallel shards."""
    names = [f"{prefix}.{t}" for t in bf.spec(fmt).tensor_names if f"{prefix}.{t}" in present]
    files = sorted({str(ckpt.file_of(name).path) for name in names}) or [str(source)]
    where = ", ".join(files)
    layout = {}
    for name in names:
        file = ckpt.file_of(name)
        layout[name.removeprefix(prefix + ".")] = (file.dtype(name).name, file.shape(name))
    try:
        shape = bf.check_layout(fmt, layout)
    except ValueError as err:
        raise CheckpointError(one_line(f"{where}: layer {prefix!r}: {err}")) from None
    weight = f"{prefix}.weight {list(layout['weight'][1])}"
    if EXPERT.search(prefix) and fmt not in moe_formats():
        raise CheckpointError(
            f"{where}: tensor {weight} is {fmt}, an MoE expert; b12x's fused MoE runs experts in "
            f"{', '.join(sorted(moe_formats()))} only"
        )
    k, k_multiple = shape[-1], bf.spec(fmt).k_multiple
    if tp > 1 and prefix.rsplit(".", 1)[-1] in ROW_PARALLEL and (k % tp or (k // tp) % k_multiple):
        raise CheckpointError(
            f"{where}: tensor {weight} is {fmt} with K={k}; over {tp} tensor-parallel ranks each rank's shard "
            f"holds K={k / tp:g}, which breaks {fmt}'s blocks (K per rank must be a multiple of {k_multiple})"
        )


@functools.cache
def moe_formats() -> frozenset[str]:
    import b12x_core as bc

    return frozenset(bc.MOE_FORMATS)


def one_line(err) -> str:
    return " ".join(str(err).split())


def install() -> None:
    """Run the checks where vLLM turns its arguments into a config (the server's front end and `LLM(...)`, before
    any engine process starts), and show a CheckpointError that ends the process as its one line."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, "_b12x_preflight", False):
        return

    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        check_engine_args(self)
        return original(self, *args, **kwargs)

    create_engine_config._b12x_preflight = True
    EngineArgs.create_engine_config = create_engine_config
    if not getattr(sys.excepthook, "_b12x_preflight", False):
        sys.excepthook = show_without_traceback(sys.excepthook)


def show_without_traceback(previous):
    """An excepthook: a CheckpointError that nothing caught is the user's input, not a bug in vLLM or b12x, so it
    is shown as its one line (the interpreter still exits with status 1); anything else goes to `previous`."""

    def hook(kind, value, tb):
        if isinstance(value, CheckpointError):
            print(f"b12x: error: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    hook._b12x_preflight = True
    return hook
