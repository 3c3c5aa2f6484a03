"""Remember whether the user asked for b12x kernels (`--linear-backend b12x` / `--moe-backend b12x`).

vLLM decides a checkpoint's quantization method while building the model config, before the kernel config
that holds those flags exists; wrapping `EngineArgs.create_model_config` records them in time.
"""

from __future__ import annotations

import functools

requested: dict[str, str] = {}


def install_request_hook() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_model_config
    if getattr(original, "_b12x_hook", False):
        return

    @functools.wraps(original)
    def create_model_config(self, *args, **kwargs):
        requested["linear"] = str(getattr(self, "linear_backend", "auto"))
        requested["moe"] = str(getattr(self, "moe_backend", "auto"))
        return original(self, *args, **kwargs)

    create_model_config._b12x_hook = True
    EngineArgs.create_model_config = create_model_config


def b12x_requested() -> bool:
    return "b12x" in requested.values()
