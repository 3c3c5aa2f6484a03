"""SM12x's block-scaled mma.sync GEMM family (b12x_kernels.bsmma_gemm, csrc/bsmma_gemm.cu), everything b12x_core knows
about it in one folder:

- layout.py: the weight repacked into the lanes' A register order (lossless `pack` / `unpack`), the activation pass's
  exact CPU form (`quantize_x`) and the decodes the tests and the probe hold the kernel to.
- gemm.py: the weight on the device (`prepare` -> `BsmmaShard`: every row shard in one, each row its own factor), its
  argument block per token tile and the launch.
- probe.py: the first prepare on an SM12x GPU runs one tile against the CPU reference; where they disagree the
  process falls back to the bf16 path with one warning.

Its facts (format × activation mode -> instruction, unit K, token tiles) are b12x_kernels.interface.BSMMA's; its one
backend is backends/block_scaled_mma.py. The configuration rule (8 or 32 tokens a warp) is a line there.
"""
