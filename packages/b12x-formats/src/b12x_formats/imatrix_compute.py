"""`b12x-formats imatrix`: an importance matrix for a model, computed with transformers over a calibration text.

What llama-imatrix does, on the Hugging Face model: the text is cut into chunks of `chunk_size` tokens (each
led by BOS when the tokenizer has one), and for every linear layer the squares of its input activations are
summed per input channel over every token, with the number of tokens seen. Per-expert linears of an MoE
layer are stacked into llama.cpp's expert entries (`blk.N.ffn_down_exps.weight`, one row per expert). The
output head is left out, as llama-imatrix does by default. The result is saved in llama.cpp's GGUF imatrix
format (imatrix.py), so llama-quantize reads it too.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .imatrix import ImportanceMatrix, gguf_arch, gguf_name


def _require_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "imatrix needs transformers and torch: pip install -e 'packages/b12x-formats[convert]' from the "
            "b12x repository (or pip install transformers torch)"
        ) from err


def load_model(model: str | os.PathLike):
    """(model, tokenizer) from a Hugging Face checkpoint directory or a .gguf file, on CPU, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model directory or .gguf file")
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name} if path.is_file() else {
        "pretrained_model_name_or_path": str(path)}  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(**where)
    lm = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    return lm.eval(), tokenizer


def chunks(token_ids: list[int], chunk_size: int, bos: int | None) -> list[list[int]]:
    """Consecutive chunks of the text's tokens, each led by BOS (as llama-imatrix feeds them); a last chunk
    shorter than 16 tokens is dropped (llama-imatrix ignores batches under 16 tokens)."""
    body = chunk_size - (bos is not None)
    out = []
    for start in range(0, len(token_ids), body):
        piece = token_ids[start : start + body]
        if len(piece) >= 16:
            out.append(([bos] if bos is not None else []) + piece)
    return out


def compute_imatrix(model: str | os.PathLike, text_file: str | os.PathLike, chunk_size: int = 512,
                    progress: bool = True) -> ImportanceMatrix:  # fmt: skip
    """The importance matrix of `model` over the text in `text_file` (both only read)."""
    text_file = Path(text_file)
    text = text_file.read_text(encoding="utf-8")  # a missing text or model fails before the extras hint
    if not Path(model).exists():
        raise FileNotFoundError(f"{model}: no such model directory or .gguf file")
    _require_transformers()
    import torch
    from tqdm import tqdm

    lm, tokenizer = load_model(model)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = chunks(ids, chunk_size, tokenizer.bos_token_id)
    if not pieces:
        raise ValueError(f"{text_file}: {len(ids)} tokens; a calibration text needs at least 16")

    config = lm.config.to_dict()
    if "num_hidden_layers" not in config:  # multimodal configs nest the text model's
        config = lm.config.get_text_config().to_dict()
    import gguf

    tensor_map = gguf.get_tensor_name_map(gguf_arch(config["model_type"]), config["num_hidden_layers"])
    sums: dict[str, dict[int, torch.Tensor]] = {}
    counts: dict[str, dict[int, int]] = {}
    hooks = []

    def collect(name: str, expert: int):
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            sums.setdefault(name, {})
            counts.setdefault(name, {})
            sums[name][expert] = sums[name].get(expert, 0) + (x * x).sum(dim=0)
            counts[name][expert] = counts[name].get(expert, 0) + x.shape[0]

        return hook

    experts_of: dict[str, set[int]] = {}
    for prefix, module in lm.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        name, expert = gguf_name(tensor_map, prefix)
        if name is None or not name.startswith("blk."):  # the head (output.weight) is left out, as llama.cpp does
            continue
        experts_of.setdefault(name, set()).add(0 if expert is None else expert)
        hooks.append(module.register_forward_pre_hook(collect(name, 0 if expert is None else expert)))
    if not hooks:
        raise ValueError(f"{model}: found no linear layers with GGUF names; cannot compute an importance matrix")
    try:
        with torch.inference_mode():
            for piece in tqdm(pieces, desc="imatrix", unit="chunk", disable=not progress):
                lm(torch.tensor([piece]))
    finally:
        for h in hooks:
            h.remove()

    out_sums, out_counts = {}, {}
    for name, experts in experts_of.items():
        n = max(experts) + 1
        width = next(iter(sums[name].values())).shape[0] if name in sums else None
        if width is None:
            continue
        rows = [sums[name].get(e, torch.zeros(width)).numpy() for e in range(n)]
        out_sums[name] = np.stack(rows).astype(np.float32)
        out_counts[name] = np.array([counts[name].get(e, 0) for e in range(n)], np.float32)
    return ImportanceMatrix(out_sums, out_counts, [text_file.name], chunk_count=len(pieces), chunk_size=chunk_size)
