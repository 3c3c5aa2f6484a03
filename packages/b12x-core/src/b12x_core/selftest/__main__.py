"""`python -m b12x_core.selftest`: see the package's docstring."""

from .cli import main

raise SystemExit(main())
