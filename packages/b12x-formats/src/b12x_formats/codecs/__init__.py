"""One module per format family; importing this package registers every codec."""

from . import fp8, mx, nvfp4, ggml  # noqa: F401, I001  (order = bf.FORMATS order)
