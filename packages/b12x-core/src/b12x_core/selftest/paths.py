"""The path the dispatched plans would take on a device: for every linear format × activation mode on a typical layer,
the backend a call of M tokens runs. Worked out from the device's facts alone (plan.choose, what plan.preview and
prepare_linear start from), so it needs no weights, no configurations (those ask the CUDA extension about the
device) and no GPU: a GPU that is not here can be asked too.
"""

from __future__ import annotations

from dataclasses import dataclass

import b12x_formats as bf

from .. import plan
from ..backends import DeviceInfo
from ..errors import UnsupportedError
from .checks import linear_modes, linear_query

LAYER = ("Llama-3.1-8B o_proj", 4096, 4096)  # a typical layer: name, N, K
PATH_TOKENS = (1, 64, 1024)
MAX_TOKENS = 4096


@dataclass(frozen=True)
class Path:
    format: str
    activation: str
    mode: str
    backends: tuple[str, ...]  # per PATH_TOKENS, the backend a call of that many tokens runs ('' where none can)
    basis: str  # "measured on <GPU>", "defaults" (nothing measured for this GPU and pair) or why nothing runs


def _basis(text: str) -> str:
    if text.startswith("measured on "):
        return text.split(",")[0]
    return "defaults" if text.startswith("conservative defaults") else text


def paths(info: DeviceInfo) -> list[Path]:
    _, n, k = LAYER
    out = []
    for fmt in bf.FORMATS:
        for activation, scaled in linear_modes(fmt):
            query = linear_query(fmt, activation, scaled, info, n, k, MAX_TOKENS)
            try:
                basis, _, decisions = plan.choose(query)
            except UnsupportedError as err:  # nothing runs it here: the reason names every backend's
                out.append(Path(fmt, activation, query.act_mode, ("",) * len(PATH_TOKENS), f"unsupported: {err}"))
                continue
            at = tuple(next(d.backend.name for d in decisions if d.lo <= m <= d.hi) for m in PATH_TOKENS)
            out.append(Path(fmt, activation, query.act_mode, at, _basis(basis)))
    return out
