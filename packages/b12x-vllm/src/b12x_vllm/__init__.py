"""vLLM plugin for b12x: `register()` is the `vllm.general_plugins` entry point (run in every vLLM process).

It registers the `b12x` quantization config, which claims ModelOpt checkpoints holding GGML block codecs
(IQ2_XS, IQ2_XXS, Q8_0) always, and any ModelOpt checkpoint when the user asked for b12x with
`--quantization b12x`, `--linear-backend b12x` or `--moe-backend b12x`. Imports are lazy: nothing heavy
happens until vLLM calls `register()`, and no module named `b12x` is ever imported.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Idempotent."""
    global _registered
    if _registered:
        return
    from . import _compat

    _compat.check_vllm_version()
    from . import backends, config  # noqa: F401  (registers the "b12x" quantization config)

    backends.install_request_hook()
    from . import preflight

    preflight.install()  # checkpoint checks before vLLM loads anything; one line, no traceback, for bad ones
    from . import linear_kernels

    linear_kernels.install()  # b12x's dense kernels join vLLM's own kernel selection
    _registered = True
