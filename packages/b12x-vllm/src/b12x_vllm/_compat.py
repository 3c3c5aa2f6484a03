"""The vLLM versions this plugin is written against."""

from __future__ import annotations

SUPPORTED = ("0.32", "0.33")


def check_vllm_version(version: str | None = None) -> None:
    if version is None:
        import vllm

        version = vllm.__version__
    if not version.startswith(tuple(f"{v}." for v in SUPPORTED)) and version not in SUPPORTED:
        raise RuntimeError(
            f"b12x-vllm supports vLLM {' and '.join(SUPPORTED)}; found vLLM {version}. Install a supported vLLM "
            "or uninstall b12x-vllm."
        )
