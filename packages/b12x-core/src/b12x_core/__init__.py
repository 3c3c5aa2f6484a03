"""b12x torch ops, prepare/run lifecycle and the exact CPU reference (ops land with their issue)."""

__version__ = "0.1.0"


class UnsupportedError(ValueError):
    """An unsupported format × activation × device combination, shape beyond max_tokens, or wrong K."""
