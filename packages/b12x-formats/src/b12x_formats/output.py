"""Output directories: written atomically, and never at the expense of anything that is not ours.

- The output is built in a temporary sibling (`.NAME.tmp-XXXX`); every file and the directory are fsynced,
  then it is renamed into place. An existing output is moved aside first and removed only once the new one
  is in place, so a crash leaves either the old checkpoint or the new one, never half of one.
- `overwrite` (CLI `--force`) replaces only what this package could have written: an empty directory, or
  one holding a checkpoint (plain files, at least one `.safetensors`, no `.gguf`). It never replaces an
  input, a directory that contains an input, a file, a symbolic link, or a directory with subdirectories.
- Modes follow the umask as `mkdir` and `open` do (0777 / 0666 minus the umask): `mkdtemp`'s 0700 would
  hide the checkpoint from a vLLM service running as another user or in a container.
- SIGTERM while writing removes the temporary directory, as Ctrl-C does, then raises `Terminated`.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


class Terminated(BaseException):
    """SIGTERM arrived while an output was being written; the partial output has been removed.
    A BaseException, like KeyboardInterrupt, so that `except Exception` in user code does not swallow it."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output(out_dir: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False) -> Path:
    """The absolute output path, after refusing every target that could destroy data (ValueError /
    FileExistsError naming the path and the rule)."""
    out = Path(os.path.abspath(out_dir))  # abspath, not resolve: a symlinked OUT_DIR must be seen as one
    real = out.resolve()
    for given in inputs:
        inp = Path(given).resolve()
        if real == inp:
            raise ValueError(f"OUT_DIR {out} is the input; it must differ from it (inputs are never modified)")
        if _within(inp, real):
            raise ValueError(f"OUT_DIR {out} contains the input {inp}; choose an OUT_DIR outside it")
        if inp.is_dir() and _within(real, inp):
            raise ValueError(f"OUT_DIR {out} is inside the input directory {inp}; inputs are never modified")
    if out.is_symlink():
        raise ValueError(f"OUT_DIR {out} is a symbolic link; refusing to replace it")
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"{out} exists; pass overwrite=True to replace it")
        why = _why_not_replaceable(out)
        if why:
            raise ValueError(f"--force replaces only a checkpoint directory or an empty one, and {out} {why}")
    return out


def _why_not_replaceable(path: Path) -> str | None:
    if not path.is_dir():
        return "is not a directory"
    entries = list(path.iterdir())
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            return f"holds {entry.name!r}, which is not a plain file"
        if entry.suffix == ".gguf":
            return f"holds {entry.name!r}, a GGUF file"
    if entries and not any(e.suffix == ".safetensors" for e in entries):
        return "holds no .safetensors file"
    return None


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` for the duration, when nobody else handles it (main thread only:
    Python delivers signals there). A second SIGTERM during the cleanup is ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    fired = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Terminated("terminated by SIGTERM")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(tmp: Path) -> None:
    """Modes as a plain mkdir/open would give them, then everything on disk before the rename."""
    mask = _umask()
    for entry in tmp.iterdir():
        os.chmod(entry, 0o666 & ~mask)
        _fsync(entry)
    os.chmod(tmp, 0o777 & ~mask)
    _fsync(tmp)


@contextmanager
def atomic_directory(
    out_dir: str | os.PathLike, overwrite: bool = False, inputs: Iterable[str | os.PathLike] = ()
) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out_dir` when the block exits without an exception.
    `inputs` are the paths being read: the output may neither be, contain nor sit inside one of them."""
    inputs = list(inputs)
    out = check_output(out_dir, inputs, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_raises():
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            yield tmp
            _seal(tmp)
            _swap_in(tmp, check_output(out, inputs, overwrite))  # checked again: time has passed
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _fsync(out.parent)


def _swap_in(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old / out.name, out)  # put the previous output back
        old.rmdir()
        raise
    shutil.rmtree(old)
