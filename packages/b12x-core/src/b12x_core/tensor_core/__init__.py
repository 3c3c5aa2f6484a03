"""The tensor-core mixed-input GEMM family (b12x_kernels.mma_gemm, csrc/mma_gemm.cuh; Marlin class), everything
b12x_core knows about it in one folder:

- geometry.py: the kernel's shape facts (rows per CTA, K chunk per format, token tiles: b12x_kernels.interface, which
  the kernel's header is generated from) and the counts made of them (output tiles, split-K tickets, CTAs that run
  at once, what fits a device's shared memory a block); every caller counts through these.
- configure.py: every rule that chooses a configuration (token tile, K split, CTA height, held activations; for the
  grouped form also the routing), dense (`linear_rule`) and grouped (`moe_config`), read top to bottom.
- layout.py: the weight's repacked layout (lane-ordered 1 KB tiles), lossless `pack` / `unpack`.
- gemm.py: row shards on the device (`prepare`: merged into one where their layouts concatenate), their kernel
  argument blocks (`MmaShard.args`), the configuration's type (`MmaConfig`) and the launch.
- experts.py: an MoE's experts stacked into one weight for the grouped form, with per-row factors.
- wgmma.py: the Hopper warpgroup form over the same layout, its own rules and launch.

Its backends (backends/tensor_core.py, backends/tensor_core_moe.py) and dequantize + cuBLAS
(backends/cublas.py, which reads the same layout) use these modules and nothing of each other.
"""
