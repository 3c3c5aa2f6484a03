"""The plans for the 8B, 70B and MoE shapes on Hopper, SM120 and SM121 are the saved ones (data/plan_previews.txt):
a change that moves a plan shows here as a diff, to be made on purpose (plan_previews.py says how to write the new
copy) or not at all."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

import b12x_kernels

SAVED = Path(__file__).parent / "data" / "plan_previews.txt"


@pytest.mark.skipif(not b12x_kernels.compiled_archs(), reason="the previews read the built kernels' shared memory")
def test_plans_match_the_saved_previews(monkeypatch):
    for switch in ("B12X_WEIGHT_COPIES", "B12X_PDL", "B12X_MOE_DECODE_KERNELS"):  # settings that move plans
        monkeypatch.delenv(switch, raising=False)
    from plan_previews import previews

    now, saved = previews().splitlines(), SAVED.read_text().splitlines()
    diff = list(difflib.unified_diff(saved, now, "saved", "now", lineterm="", n=1))
    shown = "\n".join(diff[:80])
    assert not diff, f"the plans moved (python tests/core/plan_previews.py writes the new copy):\n{shown}"
