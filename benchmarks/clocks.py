"""What the card ran at during each timing of a plan_check.py run: tools/measure_tables.sh's clocks.csv (unix
seconds, SM MHz, °C, W once a second) joined with the rows' `timed_at` stamps. A timing's window runs from the
run's previous stamp to its own; with no sample inside it (a timing under a second) the nearest sample stands in.
Prints every timing with the median SM clock, power and temperature of its window, then the timings whose clock sat
below `--below` times the run's highest (the card, not the kernel, may have set those numbers).

    python benchmarks/clocks.py linear_0.json clocks.csv [--below 0.9]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    at: float
    sm_mhz: float
    celsius: float
    watts: float


@dataclass(frozen=True)
class Timing:
    at: float  # when it ended (unix s)
    what: str  # "shape format × mode M=… backend"
    us: float


def read_samples(path: str) -> list[Sample]:
    """clocks.csv rows "unix,sm,temp,power" in time order; lines nvidia-smi could not fill ([N/A], empty) skipped."""
    out = []
    with open(path, newline="") as f:
        for fields in csv.reader(f):
            try:
                out.append(Sample(*(float(v) for v in fields[:4])))
            except (TypeError, ValueError):
                continue
    return sorted(out, key=lambda s: s.at)


def timings(rows: list[dict]) -> list[Timing]:
    """Every stamped timing of plan_check.py's rows, in the order they ended."""
    out = []
    for r in rows:
        name = f"{r['shape']} {r['format']}" + (f" × {r['mode']}" if "mode" in r else "") + f" M={r['m']}"
        times = {**r.get("backends", {}), **({"dispatched": r["dispatched"]} if "dispatched" in r else {})}
        for who, at in r.get("timed_at", {}).items():
            out.append(Timing(at, f"{name} {who}", times[who]))
    return sorted(out, key=lambda t: t.at)


def windows(samples: list[Sample], stamps: list[Timing]) -> list[tuple[Timing, list[Sample]]]:
    """Each timing with the samples taken while it ran (from the previous timing's end to its own)."""
    ats = [s.at for s in samples]
    out, start = [], None
    for t in stamps:
        lo = bisect.bisect_left(ats, start if start is not None else t.at - 1.0)
        hi = bisect.bisect_right(ats, t.at)
        inside = samples[lo:hi]
        if not inside and samples:
            nearest = min(range(len(ats)), key=lambda i: abs(ats[i] - t.at))
            inside = [samples[nearest]]
        out.append((t, inside))
        start = t.at
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", help="plan_check.py --out JSON")
    ap.add_argument("clocks", help="tools/measure_tables.sh's clocks.csv")
    ap.add_argument("--below", type=float, default=0.9, help="flag windows under this share of the highest clock")
    args = ap.parse_args()
    with open(args.rows) as f:
        rows = json.load(f)["rows"]
    samples = read_samples(args.clocks)
    stamps = timings(rows)
    if not samples or not stamps:
        print(f"nothing to join: {len(samples)} clock samples, {len(stamps)} stamped timings")
        return 1
    top = max(s.sm_mhz for s in samples)
    flagged = []
    print(f"{'timing':<60} {'µs':>10} {'SM MHz':>7} {'W':>6} {'°C':>4}")
    for t, inside in windows(samples, stamps):
        mhz = statistics.median(s.sm_mhz for s in inside)
        watts = statistics.median(s.watts for s in inside)
        celsius = statistics.median(s.celsius for s in inside)
        print(f"{t.what:<60} {t.us:>10.1f} {mhz:>7.0f} {watts:>6.0f} {celsius:>4.0f}")
        if mhz < args.below * top:
            flagged.append((t, mhz))
    share = f"{args.below:.0%} of the run's highest clock ({top:.0f} MHz)"
    print(f"\n{len(flagged)} of {len(stamps)} timings ran below {share}")
    for t, mhz in flagged:
        print(f"  {t.what}: {mhz:.0f} MHz, {t.us:.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
