"""What the self-test checks on a device: each linear and MoE backend alone on every format × activation mode it runs
there, and the embedding. `checks(info)` is a pure function of the device's facts (a DeviceInfo), so the list for a
GPU that is not here can be worked out, and tested, on a CPU; a new backend or format joins without an edit here.

The shapes are the fast GPU tier's (tests/kernels/test_fast_tier.py): small enough that the whole list runs in a
minute or two, large enough that every backend's tiles, K loop and epilogue run.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

import b12x_formats as bf

from ..backends import DeviceInfo, MoEShape, Query, for_op
from ..backends.base import UNBOUNDED
from ..moe import MOE_FORMATS
from ..recipe import activation_mode

LINEAR_N, LINEAR_K = 256, 512  # a small layer (the tensor-core GEMM splits no K: no scratch for bf16 activations)
MOE_EXPERTS, MOE_HIDDEN, MOE_INTER, MOE_TOP_K = 8, 512, 256, 2  # gated SiLU; K of both GEMMs whole IQ2 blocks
EMBEDDING_VOCAB, EMBEDDING_HIDDEN = 300, 256
TOKENS = (1, 7, 64)  # decode, an odd tail, a full 64-row tile
FAMILIES = ("linear", "moe", "embedding")
# Where a backend runs nothing here, its reason is taken from a pair it runs on a GPU of this capability with every
# install reason cleared, else on one of these (so the row says "needs sm_90a", not "FP8 only"; see _why_not).
REFERENCE_CAPABILITIES = ((9, 0), (12, 0))


@dataclass(frozen=True)
class Check:
    """One backend alone on one format × activation mode, or (format '') a backend that runs nothing here."""

    family: str  # linear | moe | embedding
    backend: str  # the backend's name (backends.REGISTRY)
    format: str = ""
    activation: str = ""  # as asked: bf16 | fp8 | mxfp8 | nvfp4
    scaled: bool = False  # the checkpoint carries an input_scale (nvfp4 needs one; FP8 × fp8 then runs static)
    skip: str = ""  # why it cannot run here ('' when it can)

    @property
    def mode(self) -> str:
        """The exact activation quantization (activations.MODES): fp8 is fp8_static, fp8_token or fp8_group128."""
        return activation_mode(self.format, self.activation, self.scaled) if self.format else ""

    @property
    def name(self) -> str:
        """e.g. "linear tensor_core NVFP4 × nvfp4": what --only matches and the report names."""
        return f"{self.family} {self.backend}" + (f" {self.format} × {self.mode}" if self.format else "")


def linear_modes(fmt: str) -> list[tuple[str, bool]]:
    """(activation, input_scale present) for every mode a linear of `fmt` can run: FP8 × fp8 both static (with the
    checkpoint's input_scale) and per token (without); nvfp4 always with its input_scale."""
    out = []
    for activation in bf.spec(fmt).activations:
        if activation == "fp8" and fmt == "FP8":
            out += [(activation, True), (activation, False)]
        else:
            out.append((activation, activation == "nvfp4"))
    return out


def moe_modes(fmt: str) -> list[tuple[str, bool]]:
    return [(activation, activation == "nvfp4") for activation in MOE_FORMATS[fmt]]


def linear_query(fmt: str, activation: str, scaled: bool, info: DeviceInfo, n: int = LINEAR_N, k: int = LINEAR_K,
                 max_tokens: int = max(TOKENS)) -> Query:  # fmt: skip
    mode = activation_mode(fmt, activation, scaled)
    return Query("linear", fmt, activation, mode, info, "auto", n, k, max_tokens, (n,))


def moe_query(fmt: str, activation: str, scaled: bool, info: DeviceInfo) -> Query:
    mode = activation_mode(fmt, activation, scaled)
    shape = MoEShape(MOE_EXPERTS, MOE_HIDDEN, MOE_INTER, MOE_TOP_K, "silu", "gate_up", mode, fmt)
    return Query("moe", fmt, activation, mode, info, "auto", 2 * MOE_INTER, MOE_HIDDEN, max(TOKENS), moe=shape)


def embedding_query(fmt: str, activation: str, scaled: bool, info: DeviceInfo) -> Query:
    return Query("embedding", fmt, "bf16", "bf16", info, "auto", EMBEDDING_HIDDEN, 0, UNBOUNDED)


# family -> (the (format, activation, scaled) triples it can be asked for, the query of one)
_FAMILY = {
    "linear": (lambda: [(f, a, s) for f in bf.FORMATS for a, s in linear_modes(f)], linear_query),
    "moe": (lambda: [(f, a, s) for f in MOE_FORMATS for a, s in moe_modes(f)], moe_query),
    "embedding": (lambda: [("Q8_0", "bf16", False)], embedding_query),  # prepare_embedding takes Q8_0 tables
}


def _capable(info: DeviceInfo, capability: tuple[int, int] | None) -> DeviceInfo:
    """`info` with another capability and nothing missing from the install (extension, Triton, torch's GEMMs)."""
    return dataclasses.replace(info, capability=capability, kernels="", triton="", block_scaled_mm="", sm90_mixed="")


def _why_not(cls, triples, query_of, info: DeviceInfo) -> str:
    """Why a backend runs none of `triples` here, in the words it uses for a pair it does run somewhere: on this GPU
    with a full install (then the install is what is missing), else on a reference GPU (then it is the GPU);
    only where it runs none anywhere, its reason for the first pair."""
    for twin in (_capable(info, info.capability), *(_capable(info, c) for c in REFERENCE_CAPABILITIES)):
        for triple in triples:
            if cls.can_implement(query_of(*triple, twin))[0]:
                return cls.can_implement(query_of(*triple, info))[1]
    return cls.can_implement(query_of(*triples[0], info))[1]


def _first_mode(runs: list[tuple[str, str, bool]]) -> list[tuple[str, str, bool]]:
    """The fast tier's choice: per format, bf16 where the backend runs it, else its first quantized mode."""
    by_format = collections.defaultdict(list)
    for triple in runs:
        by_format[triple[0]].append(triple)
    return [next((t for t in ts if t[1] == "bf16"), ts[0]) for ts in by_format.values()]


def checks(info: DeviceInfo, all_modes: bool = True) -> list[Check]:
    """Every backend of every family (the references aside: they are the oracle) on every format × activation mode
    it can run on `info`, in registry order; a backend that runs none is one Check with its reason in `skip`.
    `all_modes=False`: per format only bf16 where the backend runs it, else its first quantized mode (the fast
    GPU tier's cases)."""
    out = []
    for family in FAMILIES:
        triples, query_of = _FAMILY[family]
        triples = triples()
        for cls in for_op(family):
            if cls.name.startswith("reference"):
                continue
            runs = [t for t in triples if cls.can_implement(query_of(*t, info))[0]]
            if not runs:
                out.append(Check(family, cls.name, skip=_why_not(cls, triples, query_of, info)))
                continue
            out += [Check(family, cls.name, *t) for t in (runs if all_modes else _first_mode(runs))]
    return out
