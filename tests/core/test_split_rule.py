"""The K-split rule of the tensor-core GEMM plans (b12x_core.tensor_core.configure.even_split, split_share): a split fills
the GPU's waves, and costs its fp32 partials' traffic beside the weight's."""

from __future__ import annotations

import pytest

from b12x_core.tensor_core import configure


@pytest.mark.parametrize("fmt", ["NVFP4", "FP8", "IQ2_XS"])
def test_split_share_is_the_partials_bytes_over_the_weights(fmt):
    from b12x_formats.quantized import codec_for

    bits = codec_for(fmt).spec.bits_per_weight
    m, n, k = 96, 6144, 4096
    partial_bytes = 2 * 4 * m * n  # fp32, written by a split and read back by the reduction
    assert configure.split_share(fmt, m, k) == pytest.approx(partial_bytes / (n * k * bits / 8))
    assert configure.split_share(fmt, 2 * m, k) == pytest.approx(2 * configure.split_share(fmt, m, k))


def test_a_free_split_fills_the_waves_and_a_costly_one_does_not():
    tiles, chunks, concurrent_ctas = 224, 32, 264  # gate_up 28672 rows at one token tile: 0.85 of a wave unsplit

    def fill(splits):  # the share of the waves' CTAs that hold work
        waves = tiles * splits / concurrent_ctas
        return waves / -(-waves // 1)

    free = configure.even_split(tiles, chunks, concurrent_ctas)
    assert free > 1 and fill(free) > fill(1)
    assert configure.even_split(tiles, chunks, concurrent_ctas, share=0.001) == free
    # one split's partials as large as half the weight (128 tokens of a 4.5-bit 4096-wide linear)
    assert configure.even_split(tiles, chunks, concurrent_ctas, share=configure.split_share("NVFP4", 128, 4096)) == 1


def test_a_split_still_fills_an_empty_gpu_when_its_partials_are_small():
    tiles, chunks, concurrent_ctas = 32, 32, 264  # o_proj 4096 rows at 64 tokens: an eighth of a wave unsplit
    share = configure.split_share("NVFP4", 64, 4096)
    assert configure.even_split(tiles, chunks, concurrent_ctas, share=share) >= 4
    assert configure.even_split(tiles, chunks, concurrent_ctas, share=share) <= configure.even_split(
        tiles, chunks, concurrent_ctas
    )
