"""The constant tables against the gguf package's copies (llama.cpp's ggml-common.h)."""

import gguf.quants as gq
import ml_dtypes
import numpy as np

from b12x_formats import tables


def test_iq2_grids_match_gguf():
    for ours, cls in ((tables.iq2xxs_grid(), gq.IQ2_XXS), (tables.iq2xs_grid(), gq.IQ2_XS)):
        cls.init_grid()
        np.testing.assert_array_equal(ours, cls.grid.reshape(ours.shape))
    assert tables.iq2xxs_grid().shape == (256, 8) and tables.iq2xs_grid().shape == (512, 8)


def test_iq2_grid_u64_matches_llama_cpp_entries():
    # spot values from ggml-common.h
    assert tables.iq2_grid_u64(tables.iq2xxs_grid())[1] == 0x080808080808082B
    assert tables.iq2_grid_u64(tables.iq2xs_grid())[508] == 0x2B2B2B2B082B2B08
    assert tables.iq2_grid_u64(tables.iq2xs_grid())[511] == 0x2B2B2B2B2B2B2B2B


def test_ksigns_match_gguf_and_have_even_parity():
    ks = tables.ksigns_iq2xs()
    assert ks.tobytes() == gq.IQ2_XXS.ksigns
    assert all(bin(int(v)).count("1") % 2 == 0 for v in ks)


def test_e2m1_values_match_ml_dtypes():
    decoded = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(decoded, tables.E2M1_VALUES)
