import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import TinyModels  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    """The e2e tests' tiny mixed-precision models (tiny_models.py), built once per session and shared."""
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(autouse=True)
def _print_tiny_models_seed(request):
    """A failing test that used the shared models prints their seed (its own `rng` fixture prints its own)."""
    if "tiny_models" in request.fixturenames:
        print(f"{request.node.name}: tiny models from B12X_SEED={request.getfixturevalue('tiny_models').seed}")
