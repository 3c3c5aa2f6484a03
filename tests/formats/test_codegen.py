"""Format facts reach device code from b12x_formats only: the committed generated files (CUDA header, Triton
constants) are what b12x_formats.codegen renders now, and every fact in them is the codec's own."""

from __future__ import annotations

from pathlib import Path

import b12x_formats as bf
from b12x_formats import codegen, kernel_facts

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current():
    for rel, text in codegen.outputs().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run python -m b12x_formats.codegen --write"


def test_every_format_has_a_kernel_number_and_same_storage_shares_it():
    assert set(kernel_facts.FORMAT_IDS) == set(bf.FORMATS)
    layouts = {}
    for name, number in kernel_facts.FORMAT_IDS.items():
        spec = bf.spec(name)
        key = (spec.group_size, spec.block_bytes, spec.packing, tuple(t.name for t in spec.tensors))
        layouts.setdefault(number, set()).add(key)
    assert all(len(keys) == 1 for keys in layouts.values())  # one number, one storage layout
    assert len(set(kernel_facts.FORMAT_IDS.values())) == len(kernel_facts.LAYOUTS)


def test_block_facts_are_the_specs():
    facts = kernel_facts.FACTS
    for name in kernel_facts.GGML:
        assert facts[f"{name}_GROUP"] == bf.spec(name).group_size
        assert facts[f"{name}_BYTES"] == bf.spec(name).block_bytes
    assert facts["MX_GROUP"] == bf.spec("MXFP4").group_size == bf.spec("MXFP8").group_size
    assert facts["NVFP4_GROUP"] == bf.spec("NVFP4").group_size
    assert facts["FP8_BLOCK_SIZE"] == bf.spec("FP8_BLOCK").group_size


def test_iq2_xs_field_offsets_decode_a_block():
    """The offsets the kernels read from: a quantized IQ2_XS block's scale bytes sit at SCALES_OFFSET (the byte
    layout b12x_formats' own decoder reads, changed by hand they would no longer round-trip)."""
    import numpy as np

    qw = bf.quantize(np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32), "IQ2_XS")
    block = qw.tensors["weight"].reshape(-1)
    off = kernel_facts.FACTS["IQ2_XS_SCALES_OFFSET"]
    assert off + 8 == kernel_facts.FACTS["IQ2_XS_BYTES"] == block.size
    assert kernel_facts.FACTS["IQ2_XS_QS_OFFSET"] + 32 * 2 == off
