"""One version for all four packages: read it, check it, bump it (used by `nox -s version -- X.Y.Z`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("b12x-formats", "b12x-kernels", "b12x-core", "b12x-vllm")
_VERSION = re.compile(r'(?m)^version = "([^"]+)"')
_PIN = re.compile(r'"(b12x-[a-z]+)==([^"]+)"')
_DUNDER = re.compile(r'(?m)^__version__ = "([^"]+)"')


def _files(root: Path, name: str) -> tuple[Path, Path]:
    pkg = root / "packages" / name
    return pkg / "pyproject.toml", pkg / "src" / name.replace("-", "_") / "__init__.py"


def versions(root: Path = ROOT) -> dict[str, set[str]]:
    """Every version string found per package: its own, its __version__, and the pins it holds."""
    found = {}
    for name in PACKAGES:
        pyproject, init = _files(root, name)
        text = pyproject.read_text()
        found[name] = {_VERSION.search(text)[1], _DUNDER.search(init.read_text())[1]} | {
            v for _, v in _PIN.findall(text)
        }
    return found


def bump(new: str, root: Path = ROOT) -> None:
    if not re.fullmatch(r"\d+\.\d+\.\d+", new):
        raise ValueError(f"version must be X.Y.Z, got {new!r}")
    for name in PACKAGES:
        pyproject, init = _files(root, name)
        text = _VERSION.sub(f'version = "{new}"', pyproject.read_text())
        pyproject.write_text(_PIN.sub(rf'"\1=={new}"', text))
        init.write_text(_DUNDER.sub(f'__version__ = "{new}"', init.read_text()))
