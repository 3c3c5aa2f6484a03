"""The self-test: b12x's kernels checked on the user's own GPU. `b12x-selftest` (or `python -m b12x_core.selftest`,
or `python -m b12x_kernels.selftest`) runs each linear and MoE backend alone on every weight format × activation mode
it runs on this GPU, and the embedding, against the exact CPU reference, and prints one screen: the GPU, a table of
PASS / FAIL / skip, what failed and why, and the path the plans would take. Nothing here has an SM120 or SM121 GPU
to test on, so on those cards this is how the kernels get checked.

It lives in b12x-core, not b12x-kernels, because it runs the plans (one backend at a time, `plan.build(...,
only=backend)`) and the reference, both core's; b12x-kernels, which core depends on and which must not import it,
keeps only the `python -m b12x_kernels.selftest` entry that hands over to this package.

- checks.py: what to check on a device, a pure function of its DeviceInfo;
- run.py: one check (random weights, the backend alone, the reference, the tolerance of the GPU tests);
- paths.py: the path the plans would take on a typical layer;
- report.py: the screen and the JSON; cli.py: the command line.
"""

from .cli import main

__all__ = ["main"]
