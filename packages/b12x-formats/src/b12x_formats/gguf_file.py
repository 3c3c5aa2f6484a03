"""Opening a GGUF file with `gguf.GGUFReader`, plus the checks it leaves out.

The reader parses the header, but a hostile or damaged one can make it raise anything (struct, numpy,
KeyError, MemoryError) or describe tensors whose data overlap or lie past the end of the file. Every such
file becomes one ValueError naming the file and, where there is one, the tensor.
"""

from __future__ import annotations

import math
import os
from itertools import pairwise
from pathlib import Path

import numpy as np


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` whose tensor table has been checked: sizes match type × shape, data inside the
    file, no two tensors sharing bytes."""
    from gguf import GGML_QUANT_SIZES, GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except Exception as err:  # the reader's own checks and whatever a malformed header trips over
        raise ValueError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from None
    size = path.stat().st_size
    spans = []
    for t in reader.tensors:
        block, block_bytes = GGML_QUANT_SIZES[t.tensor_type]
        dims = [int(d) for d in t.shape]
        count = math.prod(dims)  # exact: numpy's product of uint64 dims wraps around
        where = f"{path}: tensor {t.name!r} ({t.tensor_type.name}, dims {dims})"
        if count % block:
            raise ValueError(f"{where}: {count} elements are not whole {t.tensor_type.name} blocks of {block}")
        nbytes = count // block * block_bytes
        if t.n_bytes != nbytes or int(np.asarray(t.data).nbytes) != nbytes:
            raise ValueError(f"{where}: the header's size does not match type × shape ({nbytes} bytes)")
        if t.data_offset + nbytes > size:
            raise ValueError(f"{where}: data [{t.data_offset}, {t.data_offset + nbytes}) runs past the end ({size})")
        spans.append((t.data_offset, t.data_offset + nbytes, t.name))
    spans.sort()
    for (_, end, first), (start, _, second) in pairwise(spans):
        if start < end:
            raise ValueError(f"{path}: the data of tensors {first!r} and {second!r} overlap")
    return reader
