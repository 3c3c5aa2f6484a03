"""Call 1's decision (written before the call): which build the session lands. wgmma_linear runs of base / lean /
wg (lean+outlined) and mma_linear IQ2 runs of wg / all (wg + IQ2_REPLICAS=8); every time over its own run's bf16."""

import json
import math
import sys

out = sys.argv[1]


def wg_points(path):
    rows = json.load(open(path))["rows"]
    bf = {r["m"]: r["us"] for r in rows if r["format"] == "bf16"}
    return {
        (r["format"], r["m"], r["kernel"]): r["us"] / bf[r["m"]] for r in rows if r["kernel"] in ("wgmma", "wgmma_wide")
    }, {
        (r["format"], r["m"], r["kernel"], mt): us / bf[r["m"]]
        for r in rows
        if r["kernel"] in ("wgmma", "wgmma_wide")
        for mt, us in r["per_nt_us"].items()
    }


def mma_points(path):
    best = {}
    for r in json.load(open(path))["rows"]:
        if r["format"].startswith("IQ2") and "speedup_bf16" in r:
            key = (r["format"], r["m"])
            best[key] = min(best.get(key, 9), 1 / r["speedup_bf16"])  # µs over the run's bf16
    return best


def compare(a, b, label):
    keys = sorted(a.keys() & b.keys(), key=str)
    if not keys:
        print(f"{label}: no common points")
        return 9.0, 9.0
    r = {k: b[k] / a[k] for k in keys}
    for k in keys:
        print(f"  {label} {k}: {r[k]:.3f}")
    g = math.exp(sum(math.log(v) for v in r.values()) / len(r))
    print(f"{label}: gmean {g:.3f}, worst {max(r.values()):.3f}, best {min(r.values()):.3f} over {len(r)} points")
    return g, max(r.values())


def ok(path):
    try:
        json.load(open(path))
        return True
    except Exception:
        return False


choice = "base"
if all(ok(f"{out}/wgmma_{v}.json") for v in ("base", "lean", "wg")):
    base, base_mt = wg_points(f"{out}/wgmma_base.json")
    scores = {"base": (1.0, 1.0)}
    for v in ("lean", "wg"):
        pts, pts_mt = wg_points(f"{out}/wgmma_{v}.json")
        compare(base_mt, pts_mt, f"{v}/base per tile")
        scores[v] = compare(base, pts, f"{v}/base best tile")
    qualified = {v: g for v, (g, worst) in scores.items() if v == "base" or (g <= 0.99 and worst <= 1.03)}
    choice = min(qualified, key=qualified.get)
print("wgmma choice:", choice)
final = choice
if choice == "wg" and ok(f"{out}/replicas_wg.json") and ok(f"{out}/replicas_all.json"):
    g, worst = compare(
        mma_points(f"{out}/replicas_wg.json"), mma_points(f"{out}/replicas_all.json"), "all/wg IQ2 one-token"
    )
    if g <= 0.99 and worst <= 1.03:
        final = "all"
print("final:", final)
open("/tmp/final_variant", "w").write(final)
