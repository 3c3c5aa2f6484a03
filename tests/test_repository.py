"""Repository-level contracts: one shared version, import hygiene, no package named `b12x`."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import version as versioning  # noqa: E402

MODULES = ["b12x_formats", "b12x_kernels", "b12x_core", "b12x_vllm"]


def test_all_packages_share_one_version_and_pins():
    found = versioning.versions()
    assert set(found) == set(versioning.PACKAGES)
    assert len(set().union(*found.values())) == 1, found
    current = next(iter(found["b12x-formats"]))
    for module in MODULES:
        assert importlib.import_module(module).__version__ == current


def test_version_bump_moves_everything_together(tmp_path):
    for name in versioning.PACKAGES:
        shutil.copytree(
            ROOT / "packages" / name, tmp_path / "packages" / name, ignore=shutil.ignore_patterns("*.egg-info")
        )
    versioning.bump("7.8.9", root=tmp_path)
    assert all(v == {"7.8.9"} for v in versioning.versions(tmp_path).values())
    assert '"b12x-core==7.8.9"' in (tmp_path / "packages/b12x-vllm/pyproject.toml").read_text()
    with pytest.raises(ValueError, match="X.Y.Z"):
        versioning.bump("1.2", root=tmp_path)


def test_formats_import_does_not_import_torch():
    code = "import sys, b12x_formats as bf; bf.quantize([[1.0] * 32], 'Q8_0'); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_no_import_package_named_b12x():
    for src in ROOT.glob("packages/*/src"):
        assert not (src / "b12x").exists() and not (src / "b12x.py").exists()
    assert sorted(
        p.name for p in ROOT.glob("packages/*/src/*") if p.is_dir() and not p.name.endswith("egg-info")
    ) == sorted(MODULES)
