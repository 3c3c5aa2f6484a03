"""docs/architecture.md's recipes, followed literally. "Adding a backend": the toy backend below (the doc's example,
word for word) registered for the test is chosen by a plan, prepared, run, and shown by explain. "Adding a format":
the doc's toy codec module, run as written, registers a format that quantizes, dequantizes, loads from checkpoint
tensors and runs through the reference linear."""

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import b12x_core as bc
import b12x_formats as bf
from b12x_core import backends, plan
from b12x_core.backends import Backend, DeviceInfo, Query
from b12x_core.backends.base import config_ranges


# --- docs/architecture.md, step 1: the class ---
class ToyLinear(Backend):
    name, op = "toy_linear", "linear"
    reads = ("dequantized",)  # runs from the exact float32 weight (DeviceWeights.dequantized), as the reference
    warm = False  # nothing to compile

    @classmethod
    def can_implement(cls, q):  # from the query alone
        if q.on_cuda:
            return False, "a CPU toy"
        return True, "float32 matmul of the dequantized weight"

    def __init__(self, query, weights):  # prepare: take the device layouts it reads
        super().__init__(query, weights)
        self.weight = weights.dequantized

    @classmethod
    def configs(cls, query, lo, hi, layout=None):  # over lo..hi tokens, from the query alone
        return config_ranges(lo, hi, lambda m: {"rows": 8 if m <= 8 else 64})

    def run(self, x2, bias, *, config):  # x2 [M, K] bf16 -> y [M, N] bf16
        y = x2.to(torch.float32) @ self.weight.T
        return (y if bias is None else y + bias.to(torch.float32)).to(torch.bfloat16)


# --- step 2: one line in backends.REGISTRY (here for the test only; first, so the defaults prefer it) ---
@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(backends, "REGISTRY", (ToyLinear, *backends.REGISTRY))


def test_the_plan_chooses_the_toy_backend_and_explain_shows_it(toy_registered):
    query = Query("linear", "Q8_0", "bf16", "bf16", DeviceInfo.of(torch.device("cpu")), n=32, k=64, max_tokens=16)
    basis, _, decisions = plan.choose(query)
    assert [(d.lo, d.hi, d.backend) for d in decisions] == [(1, 16, ToyLinear)]
    assert basis.startswith("conservative defaults")  # nothing measured on a CPU: registry order decides
    assert dict(decisions[0].lost) == {"reference": "unmeasured here: the default order puts toy_linear first"}

    rng = np.random.default_rng(21)
    qw = bf.quantize(rng.standard_normal((32, 64)).astype(np.float32), "Q8_0")
    lin = bc.prepare_linear(qw, device="cpu", max_tokens=16)
    text = bc.explain(lin)
    assert "1-16 tokens -> toy_linear: default for 1-16 tokens (unmeasured)" in text
    assert "reference lost: unmeasured here: the default order puts toy_linear first" in text
    assert "1-8          rows=8" in text and "9-16         rows=64" in text
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).to(torch.bfloat16)
    want = (x.to(torch.float32) @ torch.from_numpy(bf.dequantize(qw)).T).to(torch.bfloat16)
    assert torch.equal(bc.linear(x, lin), want)


def test_without_the_registry_line_the_toy_is_never_asked():
    query = Query("linear", "Q8_0", "bf16", "bf16", DeviceInfo.of(torch.device("cpu")), n=32, k=64, max_tokens=16)
    assert ToyLinear not in {d.backend for d in plan.choose(query)[2]}


def test_the_doc_shows_this_toy_word_for_word():
    import inspect
    import textwrap
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs/architecture.md").read_text()
    section = doc[doc.index("## Adding a backend to a family") :]
    start = section.index("```python\n") + len("```python\n")
    block = section[start : section.index("\n   ```\n", start)]
    assert textwrap.dedent(block).strip() == inspect.getsource(ToyLinear).strip()


# --- docs/architecture.md, "Adding a format": the toy codec's module, run as the doc writes it ---
def _format_recipe() -> str:
    doc = (Path(__file__).resolve().parents[2] / "docs/architecture.md").read_text()
    section = doc[doc.index("## Adding a format") :]
    start = section.index("```python\n") + len("```python\n")
    return textwrap.dedent(section[start : section.index("\n   ```\n", start)])


@pytest.fixture
def toy_format():
    """Step 1 and 2: the module's code defines the codec, which registers it (in b12x_formats the import in
    codecs/__init__.py runs it; here the test runs it and takes it out again afterwards)."""
    from b12x_formats.spec import Codec

    module = {"__name__": "b12x_formats.codecs.toy"}
    exec(compile(_format_recipe(), "docs/architecture.md", "exec"), module)
    try:
        yield module["ToyInt8"]
    finally:
        Codec.registry.pop("TOY_INT8", None)


def test_the_toy_format_round_trips_and_the_reference_linear_runs_it(toy_format):
    assert bf.spec("toy_int8").name == "TOY_INT8"
    rng = np.random.default_rng(47)
    w = rng.standard_normal((2, 24, 40)).astype(np.float32)  # leading expert dimension too
    qw = bf.quantize(w, "TOY_INT8")
    assert qw.format == "TOY_INT8" and tuple(qw.shape) == (2, 24, 40)
    assert qw.tensors["weight"].dtype == np.int8 and qw.tensors["weight_scale"].shape == (2, 24, 1)
    w2 = bf.dequantize(qw)
    assert np.all(np.abs(w2 - w) <= qw.tensors["weight_scale"] / 2 * (1 + 1e-6))  # half a step a weight
    again = bf.QuantizedWeight.from_tensors("TOY_INT8", qw.tensors)
    assert np.array_equal(bf.dequantize(again), w2)
    with pytest.raises(ValueError, match="weight_scale"):
        bf.QuantizedWeight.from_tensors("TOY_INT8", {**qw.tensors, "weight_scale": qw.tensors["weight_scale"][..., 0]})
    assert bf.modelopt.layer_entry("TOY_INT8")["quant_algo"] == "TOY_INT8"

    one = bf.quantize(w[0], "TOY_INT8")
    lin = bc.prepare_linear(one, device="cpu", max_tokens=16)
    text = bc.explain(lin)
    assert "1-16 tokens -> reference" in text and "tensor_core: has no layout for TOY_INT8" in text
    x = torch.from_numpy(rng.standard_normal((5, 40)).astype(np.float32)).to(torch.bfloat16)
    want = (x.to(torch.float32) @ torch.from_numpy(bf.dequantize(one)).T).to(torch.bfloat16)
    assert torch.equal(bc.linear(x, lin), want)


def test_the_toy_format_is_gone_after_the_test():
    with pytest.raises(ValueError):
        bf.spec("TOY_INT8")


# --- "Backends and kernel families" and "Adding a kernel family": the names a newcomer follows exist ---
FAMILY_MODULES = {
    "configure": "b12x_core.tensor_core.configure",
    "experts": "b12x_core.tensor_core.experts",
    "gemm": "b12x_core.tensor_core.gemm",
    "geometry": "b12x_core.tensor_core.geometry",
    "layout": "b12x_core.tensor_core.layout",
    "interface": "b12x_kernels.interface",
    "kernels": "b12x_core.kernels",
    "moe_blocks": "b12x_core.moe_blocks",
    "triton_moe": "b12x_core.backends.triton_moe",
    "triton_tiles": "b12x_core.backends.triton_tiles",
}


def test_the_family_sections_name_what_exists():
    """Every `module.name` those sections write in code (configure.linear_rule, kernels.mma_gemm, interface.Family,
    ...) resolves: the configuration rules, the adapter and the capability models are where the page says."""
    import importlib
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs/architecture.md").read_text()
    text = doc[doc.index("## Backends and kernel families") : doc.index("## Adding a backend to a family")]
    pattern = re.compile(rf"(?<![\w/])({'|'.join(FAMILY_MODULES)})\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
    named = {m.groups() for span in re.findall(r"`([^`\n]+)`", text) for m in pattern.finditer(span)}
    named = {(module, attr) for module, attr in named if attr != "py"}  # file names
    assert {("configure", "linear_rule"), ("configure", "moe_config"), ("kernels", "mma_gemm"),
            ("interface", "Family")} <= named  # fmt: skip
    from b12x_core import kernels

    missing = []
    for module, attr in sorted(named):
        if module == "kernels" and attr in kernels.TRITON_MODULES:
            continue  # imported on first use, where Triton is installed
        obj = importlib.import_module(FAMILY_MODULES[module])
        for part in attr.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(f"{module}.{attr}")
    assert missing == []
