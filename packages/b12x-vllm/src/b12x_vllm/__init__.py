"""vLLM plugin for b12x. `register()` is vLLM's `vllm.general_plugins` entry point."""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Idempotent; imports lazily (vLLM calls it in every process). The layer methods land with their issue."""
    global _registered
    _registered = True
