"""Shared test setup: GPU tests are skipped unless CUDA is present; every test gets fresh randomness."""

from __future__ import annotations

import os

import numpy as np
import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# The GPU suite's longest files by their tests' seconds together (B12X_TEST_TIMES, on an H100; the longest test, an
# expert past 2 GiB, about 18 s): run first, so that xdist, which hands tests out in collection order, does not leave
# them for the end of a time-limited run while the short ones fill the tail.
LONGEST_FIRST = ("test_moe_tiles.py", "test_tiles.py", "test_sm90_mixed.py", "test_bsmma_moe.py", "test_wgmma_gemm.py")


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: same order in every worker
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded afresh every run; the seed is printed so a failure can be replayed with B12X_SEED."""
    seed = int(os.environ.get("B12X_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"{request.node.name}: B12X_SEED={seed}")
    return np.random.default_rng(seed)


def pytest_runtest_logreport(report):
    """B12X_TEST_TIMES=FILE appends each test's outcome and seconds as it finishes (from every xdist worker): a
    GPU run cut short by its time limit still says what ran and what took the time."""
    path = os.environ.get("B12X_TEST_TIMES")
    if getattr(report, "node", None) is not None:  # xdist's controller relaying a worker's report: the worker wrote it
        return
    if path and (report.when == "call" or report.outcome != "passed"):
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")
