"""b12x device code (CUDA C++ and Triton kernels). Kernels land here; dispatch policy lives in b12x_core."""

__version__ = "0.1.0"
