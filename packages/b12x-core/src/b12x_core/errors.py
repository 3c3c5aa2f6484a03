"""Errors of b12x_core."""


class UnsupportedError(ValueError):
    """An unsupported format × activation × device combination, a shape beyond max_tokens, or the wrong K."""


class BackendWithdrawn(RuntimeError):
    """A backend's first-use check on this device failed (block_scaled/probe.py): the plan is chosen again without
    it, and the backend declines for the rest of the process."""
