"""`b12x-formats convert-gguf`: a llama.cpp GGUF model -> a ModelOpt mixed-precision Hugging Face checkpoint.

IQ2_XS, IQ2_XXS and Q8_0 tensors are copied byte for byte (GGUF rows are exactly our `[N, K/group, bytes]`
blocks); every other type is dequantized with `gguf` and stored as bf16. Names, config and tokenizer come from
transformers' own GGUF support, so they follow the Hugging Face model. Two things transformers does for
its fused, in-memory models are done here for the on-disk layout vLLM expects:
- stacked experts (`blk.N.ffn_gate_exps`, [E, I, H]) become per-expert tensors
  (`model.layers.N.mlp.experts.<e>.gate_proj.weight`);
- llama's q/k row permutation is undone on the packed blocks (it only moves whole rows, so it is lossless).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from ._arrays import require_finite
from .checkpoint import save_checkpoint
from .gguf_file import open_gguf
from .modelopt import QuantizationConfig
from .output import check_output
from .quantized import QuantizedWeight

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe")
# GGUF facts that transformers' GGUF config tables miss for some architectures and versions
# (5.24 drops qwen3's head_dim; no version maps qwen3moe's expert width). Every written tensor is
# also checked against the shapes the resulting config implies, so a gap never goes unnoticed.
CONFIG_FROM_GGUF = {"attention.key_length": "head_dim", "expert_feed_forward_length": "moe_intermediate_size"}
PASSTHROUGH = ("IQ2_XS", "IQ2_XXS", "Q8_0")
_EXPERTS = re.compile(r"blk\.(?P<bid>\d+)\.ffn_(?P<proj>gate|up|down)_exps\.weight")


def _require_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "convert-gguf needs transformers and torch: pip install -e 'packages/b12x-formats[convert]' from the "
            "b12x repository (or pip install transformers torch sentencepiece protobuf)"
        ) from err


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Convert `gguf_path` into a checkpoint directory `out_dir` (written atomically; the input is only read)."""
    if not Path(gguf_path).is_file():  # before the extras hint: a wrong path is the first thing to fix
        raise FileNotFoundError(f"{gguf_path}: no such GGUF file")
    _require_transformers()
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    gguf_path = Path(gguf_path).resolve()
    check_output(out_dir, [gguf_path], overwrite)  # before minutes of work (and again when writing)
    reader = open_gguf(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{gguf_path.name}: architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHITECTURES}"
        )
    for t in reader.tensors:  # before any work: the types neither copied nor decodable by gguf
        if t.tensor_type.name not in PASSTHROUGH and not _decodable(t.tensor_type):
            raise ValueError(
                f"{gguf_path.name}: tensor {t.name!r} has GGML type {t.tensor_type.name}, which convert-gguf "
                f"cannot read (gguf-py has no decoder for it)"
            )

    where = {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name}
    config = AutoConfig.from_pretrained(**where)
    for key, attr in CONFIG_FROM_GGUF.items():
        value = _field(reader, f"{arch}.{key}", None)
        if value is not None:
            setattr(config, attr, int(value))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(p.shape) for name, p in skeleton.state_dict().items()}
    config.architectures = [type(skeleton).__name__]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = get_gguf_hf_weights_map(skeleton, processor)

    quantized: dict[str, str] = {}

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for t in reader.tensors:
            qtype = gguf.GGMLQuantizationType(t.tensor_type)
            experts = _EXPERTS.fullmatch(t.name)
            if experts:
                # fused expert parameters carry no ".weight" suffix: "...mlp.experts.gate_up_proj"
                prefix = names[t.name.removesuffix(".weight")].rsplit(".", 1)[0]
                targets = [f"{prefix}.{e}.{experts['proj']}_proj.weight" for e in range(t.data.shape[0])]
            elif t.name in names:
                targets = [names[t.name]]
            else:
                raise ValueError(f"{gguf_path.name}: no Hugging Face name for GGUF tensor {t.name!r}")
            passthrough = qtype.name in PASSTHROUGH
            if passthrough:
                rows = np.asarray(t.data)
                nbytes = gguf.GGML_QUANT_SIZES[qtype][1]
                blocks = rows.reshape(*rows.shape[:-1], rows.shape[-1] // nbytes, nbytes)
                data = blocks if experts else processor.process(blocks, t.name).weights
            else:
                with np.errstate(over="ignore", invalid="ignore"):  # non-finite results are refused below
                    values = gguf.quants.dequantize(np.asarray(t.data), qtype)
                data = (values if experts else processor.process(values, t.name).weights).astype(ml_dtypes.bfloat16)
                # a NaN norm or an Inf block scale would reach the model silently; bf16 can also overflow
                require_finite(
                    f"{gguf_path.name}: tensor {t.name!r} ({qtype.name}) decoded", data, "weights must be finite"
                )
            expected = _expected_shape(shapes, targets[0], experts)
            for hf_name, part in zip(targets, data if experts else [data], strict=True):
                if passthrough:  # from_tensors also rejects non-finite block scales d
                    logical = QuantizedWeight.from_tensors(qtype.name, {"weight": part}).shape
                else:
                    logical = part.shape
                if expected is not None and tuple(logical) != expected:
                    raise ValueError(
                        f"{gguf_path.name}: GGUF tensor {t.name!r} holds {list(logical)} per module, but the model "
                        f"config implies {list(expected)} for {hf_name!r}"
                    )
                if passthrough:
                    quantized[hf_name.removesuffix(".weight")] = qtype.name
                yield hf_name, part

    total = sum(t.data.shape[0] if _EXPERTS.fullmatch(t.name) else 1 for t in reader.tensors)
    with tempfile.TemporaryDirectory() as tok_dir:
        AutoTokenizer.from_pretrained(**where).save_pretrained(tok_dir)
        extra = {p.name: p.read_bytes() for p in Path(tok_dir).iterdir() if p.is_file()}
        # quantized_layers is filled while the tensors stream, before the config is written. A file of
        # F16/F32 tensors only is a plain floating-point model: no quantization_config at all.
        copied = any(t.tensor_type.name in PASSTHROUGH for t in reader.tensors)
        quant = QuantizationConfig(layers=quantized) if copied else None
        cfg = config.to_dict()
        cfg["torch_dtype"] = "bfloat16"
        return save_checkpoint(
            out_dir, tensors(), cfg, quant, extra_files=extra, total=total, overwrite=overwrite, desc="converting",
            inputs=[gguf_path],
        )  # fmt: skip


def _decodable(qtype) -> bool:
    """Whether gguf-py can dequantize `qtype`, asked of gguf-py itself with one zero block."""
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, block_bytes), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _expected_shape(shapes: dict, hf_name: str, experts) -> tuple | None:
    """The shape transformers' model gives `hf_name`; per-expert names are sliced out of its fused parameters."""
    if not experts:
        return shapes.get(hf_name)
    fused_prefix = hf_name.split(".experts.")[0] + ".experts"
    if experts["proj"] == "down":
        fused = shapes.get(f"{fused_prefix}.down_proj")
        return None if fused is None else fused[1:]
    fused = shapes.get(f"{fused_prefix}.gate_up_proj")
    return None if fused is None else (fused[1] // 2, fused[2])


def _field(reader, key: str, default=...):
    field = reader.get_field(key)
    if field is None:
        if default is ...:
            raise ValueError(f"GGUF file has no {key!r}")
        return default
    return field.contents()
