"""Opening a GGUF file with `gguf.GGUFReader`, plus the checks it leaves out.

The reader parses the header, but a hostile or damaged one can make it raise anything (struct, numpy,
KeyError, MemoryError) or describe tensors whose data overlap or lie past the end of the file. Every such
file becomes one ValueError naming the file and, where there is one, the tensor.

The reader also reads past the end of the file without noticing: numpy hands it an empty slice, so an array value
whose length field says 2^40 (one changed byte in a tokenizer's token types) makes it loop 2^40 times over empty
reads, gathering one array object each, until the machine runs out of memory (it took 24 GB within a minute in
tests/formats/test_fuzz.py). `checked_reader` opens files through a reader that refuses any read past the end.
"""

from __future__ import annotations

import math
import os
from itertools import pairwise
from pathlib import Path

import numpy as np


def checked_reader(path: str | os.PathLike):
    """`gguf.GGUFReader(path)`, whose every read must lie inside the file (ValueError otherwise: see above)."""
    from gguf import GGUFReader

    class Reader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > self.data.size:
                raise ValueError(f"a read of {int(count)} × {np.dtype(dtype).name} at byte {int(offset)} runs past "
                                 f"the end of the file ({self.data.size} bytes)")  # fmt: skip
            return super()._get(offset, dtype, count, override_order)

    return Reader(path)


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` whose tensor table has been checked: sizes match type × shape, data inside the
    file, no two tensors sharing bytes."""
    from gguf import GGML_QUANT_SIZES

    path = Path(path)
    try:
        reader = checked_reader(path)
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
