"""Run independent pieces of work (one layer's quantization each) in worker processes, results in order.

`in_order(items, jobs)` takes a stream of `Work` items and plain values and yields, in the same order, each
Work's result and each plain value unchanged, so a caller that writes tensors one after another (the
checkpoint writer) gets exactly the stream one process would give: the same bytes for any `jobs`.

Memory stays bounded: at most `jobs + 1` Work items are in flight (one being handed over while `jobs`
compute), and their inputs together stay under `max_inflight_bytes` (one item always runs, however large).
Workers start with `spawn`, not `fork`: the parent may hold threads (tqdm's monitor, BLAS pools) that a
forked child would inherit in an unknown state; each worker keeps its BLAS to one thread, so `jobs`
processes use `jobs` cores.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

DEFAULT_INFLIGHT_BYTES = 4 << 30
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Work:
    """`fn(*args)` to run in a worker; `nbytes` is the size of its inputs (for the memory bound)."""

    fn: Callable[..., Any]
    args: tuple
    nbytes: int = 0


def default_jobs() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def in_order(items: Iterable[Any], jobs: int, max_inflight_bytes: int = DEFAULT_INFLIGHT_BYTES) -> Iterator[Any]:
    """Yield each item's result in the items' order: `fn(*args)` for a Work, the item itself otherwise."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1:
        for item in items:
            yield item.fn(*item.args) if isinstance(item, Work) else item
        return
    pool = _pool(jobs)
    pending: deque[tuple[Future | None, Any, int]] = deque()  # (future, plain value, input bytes)
    running = inflight = 0
    try:
        for item in items:
            if isinstance(item, Work):
                while pending and (running > jobs or inflight + item.nbytes > max_inflight_bytes):
                    future, value, nbytes = pending.popleft()
                    if future is not None:
                        running, inflight = running - 1, inflight - nbytes
                        value = future.result()
                    yield value
                pending.append((pool.submit(item.fn, *item.args), None, item.nbytes))
                running, inflight = running + 1, inflight + item.nbytes
            else:
                pending.append((None, item, 0))
        while pending:
            future, value, _ = pending.popleft()
            yield value if future is None else future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(jobs: int) -> ProcessPoolExecutor:
    saved = {name: os.environ.get(name) for name in _ONE_THREAD}
    os.environ.update(dict.fromkeys(_ONE_THREAD, "1"))  # read by BLAS when a spawned worker imports numpy
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        # start every worker now, while the variables are set (the pool otherwise starts them on demand)
        for future in [pool.submit(os.getpid) for _ in range(jobs)]:
            future.result()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return pool
