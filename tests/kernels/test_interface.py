"""The kernels' binary interface (b12x_kernels.interface): the committed csrc/interface.h is what the module
renders now, an argument block is packed only with every field named, and the tensor-core geometry the core counts with
is the one the header gives the kernel."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

import b12x_formats as bf
from b12x_core.tensor_core import geometry
from b12x_formats.kernel_facts import LAYOUTS
from b12x_kernels import interface

ROOT = Path(__file__).resolve().parents[2]


def test_generated_header_is_current():
    text = (ROOT / interface.HEADER).read_text()
    assert text == interface.header(), "run python -m b12x_kernels.interface --write"


def test_every_block_field_is_in_the_header_in_order_with_its_size_asserted():
    text = interface.header()
    for block in interface.BLOCKS:
        body = re.search(rf"struct {block.__name__} {{(.*?)}};", text, re.S).group(1)
        names = re.findall(r"^\s+[\w\s*]+?[\s*](\w+);", body, re.M)
        assert names == [f for f, _ in block._fields_]
        assert f"sizeof({block.__name__}) == {ctypes.sizeof(block)}" in text


def test_pack_names_every_field_or_refuses():
    fields = {f: 0 for f, _ in interface.GemvGgmlArgs._fields_}
    assert len(interface.pack(interface.GemvGgmlArgs, **fields)) == ctypes.sizeof(interface.GemvGgmlArgs)
    with pytest.raises(TypeError, match="missing \\['max_m'\\]"):
        interface.pack(interface.GemvGgmlArgs, **{k: v for k, v in fields.items() if k != "max_m"})
    with pytest.raises(TypeError, match="unknown \\['m'\\]"):
        interface.pack(interface.GemvGgmlArgs, **fields, m=1)


def test_packed_fields_read_back_as_written():
    """What the kernel's struct reads at each offset is what was packed (pointers as 64-bit addresses)."""
    values = {f: (i + 1) * (0x100000000 if t is ctypes.c_uint64 else 1) for i, (f, t) in
              enumerate(interface.MmaArgs._fields_)}  # fmt: skip
    values["alpha"], values["scale_mul"] = 0.5, 2.0
    back = interface.MmaArgs.from_buffer_copy(interface.pack(interface.MmaArgs, **values))
    assert {f: getattr(back, f) for f in values} == values


def test_core_geometry_is_the_kernels():
    assert geometry.ROWS_PER_CTA == interface.ROWS_PER_CTA == interface.TILES_PER_CTA * interface.TILE_ROWS
    text = interface.header()
    for fmt in LAYOUTS:
        ck = geometry.chunk_k(fmt)
        assert f"constexpr int MMA_CHUNK_K_{fmt} = {ck};" in text
        spec = bf.spec(fmt)
        if spec.packing == "ggml" and spec.group_size >= 256:
            assert ck == spec.group_size  # one super-block per chunk
        else:  # one 16-byte load per lane, four lanes per row: a 16-row tile's chunk is 1 KB of codes
            bits = 4 if spec.bits_per_weight < 8 else 8
            assert ck * bits // 8 * interface.TILE_ROWS == 1024


def test_each_family_declares_its_facts_once_and_core_reads_them():
    """The families' capability models (interface.FAMILIES) name real formats, activation modes and argument blocks,
    and b12x_core reads them rather than keeping copies: the same objects, not equal tuples."""
    from b12x_core.activations import MODES
    from b12x_core.backends import cublas, cuda_gemv, tensor_core_moe
    from b12x_core.tensor_core import layout

    for family in interface.FAMILIES:
        assert family.formats and set(family.formats) <= set(bf.FORMATS), family.name
        assert family.act_modes and set(family.act_modes) <= set(MODES) == set(interface.ACT_MODES), family.name
        assert family.args is None or family.args in interface.BLOCKS, family.name
    mma = interface.MMA
    assert set(mma.x_quant_formats) <= set(interface.X_QUANTS[1:])
    assert all(set(formats) <= set(mma.formats) for formats in mma.x_quant_formats.values())
    assert set(mma.dequantize_formats) <= set(mma.formats) and set(mma.grouped_act_modes) <= set(mma.act_modes)
    assert layout.FORMATS is mma.formats and geometry.TOKEN_TILES is mma.token_tiles
    assert geometry.CTA_HEIGHTS is mma.cta_heights and geometry.FULL_HEIGHT == interface.TILES_PER_CTA
    assert tensor_core_moe.MODES is mma.grouped_act_modes
    assert cublas.DequantGemm.CUDA_PASS_FORMATS is mma.dequantize_formats
    assert cuda_gemv.BUCKETS is interface.GEMV_ELEM.token_tiles == interface.GEMV_GGML.token_tiles
