"""`python -m b12x_kernels.selftest`: b12x's self-test on this GPU (the same as `b12x-selftest`).

The self-test runs the plans and the exact reference of b12x-core, which depends on this package, so it lives there
(b12x_core.selftest); this entry only hands over to it, importing it when run, and says what to install where
b12x-core is missing. It is the one place b12x_kernels names b12x_core (tests/test_repository.py allows it alone).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from b12x_core.selftest import main as selftest
    except ModuleNotFoundError as err:
        if err.name not in ("b12x_core", "b12x_core.selftest"):
            raise
        print(
            "b12x self-test: it runs b12x-core's plans and reference, and b12x-core is not installed here "
            f"({err}). Install it (pip install b12x-core, or pip install -e packages/b12x-core from the b12x "
            "repository), then run b12x-selftest.",
            file=sys.stderr,
        )
        return 2
    return selftest(argv)


if __name__ == "__main__":
    raise SystemExit(main())
