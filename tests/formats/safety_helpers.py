"""Shared by the file-safety tests and the fuzz suite: raw safetensors/GGUF crafting and the CLI's error contract."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from b12x_formats.cli import main


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha256), directories included as entries: any change shows."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def raw_safetensors(path: Path, header, data: bytes, header_len: int | None = None) -> None:
    """Write a safetensors file byte by byte: 8-byte little-endian header length, JSON header, data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)


def split_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_clean_error(rc: int, err: str, *needles: str) -> None:
    """The CLI's failure contract: exit 2, exactly one `error:` line on stderr and it is the last (a progress
    bar may precede it; it erases itself), no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
