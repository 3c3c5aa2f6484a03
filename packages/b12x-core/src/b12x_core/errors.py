"""Errors of b12x_core."""


class UnsupportedError(ValueError):
    """An unsupported format × activation × device combination, a shape beyond max_tokens, or the wrong K."""
