"""What bounds the warp-specialized wgmma GEMM (csrc/wgmma_ws_gemm.cuh): one linear timed whole and with one part of
its work changed or left out (B12X_WS_ABLATE, bits: 1 the decode and A stores, 2 the wgmmas, 4 the x copies, 8 the
weight copies, 16 the wgmmas read through 128-byte-swizzle descriptors, 32 the waits lose their deadlock bound (no
timer reads), 64 the decoder's proxy fence, 128 the fences before ring refills; the results are then wrong, except
under 32 and 128, which are checked against the register-A kernel), beside bf16 F.linear and the register-A wgmma
form on the same shape in the same run. Needs an sm_90 GPU.

    python benchmarks/ws_ablation.py --out ws_ablation.json [--shape 28672x4096] [--ms 128,1024]

Method as wgmma_linear.py: CUDA graph replays over several weight copies (beyond L2), median per call.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from decode_linear import copies_for, device_facts, time_graph
from mma_linear import shard_bytes
from wgmma_linear import relative_error, shard

from b12x_core.tensor_core import gemm, wgmma

CORRECT = (0, 32, 128, 32 | 128)  # modes whose results stay right: checked against the register-A kernel
FMT = "NVFP4"  # the kernel's ablation instance (ABL) is built for NVFP4's linear form only
MODES = {"whole": 0, "no decode": 1, "no wgmma": 2, "no x copies": 4, "no weight copies": 8,
         "copies only": 1 | 2, "decode only": 2 | 4, "wgmma only": 1 | 4 | 8, "swizzled reads": 16,
         "swizzled wgmma only": 16 | 1 | 4 | 8, "unbounded waits": 32, "unbounded copies only": 32 | 1 | 2,
         "unbounded wgmma only": 32 | 1 | 4 | 8, "no A fence": 64, "no refill fences": 128,
         "unbounded, no refill fences": 32 | 128, "unbounded, no fences": 32 | 64 | 128,
         "skeleton": 1 | 2 | 4 | 8, "unbounded skeleton": 32 | 1 | 2 | 4 | 8}  # fmt: skip
# with the K split of one (no partials, no reduction): what the split-K epilogue costs where the plan splits
SPLIT_ONE = ("whole", "unbounded waits", "copies only", "wgmma only", "skeleton")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="28672x4096")
    parser.add_argument("--ms", default="128,1024")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", default="ws_ablation.json")
    args = parser.parse_args()
    n, k = map(int, args.shape.split("x"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    one = shard(FMT, n, k)
    copies = [one] + [shard(FMT, n, k) for _ in range(copies_for(shard_bytes(one)) - 1)]
    dense = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(2 * n * k))]
    rows = []
    for m in map(int, args.ms.split(",")):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        staged = torch.empty(wgmma.staged_bytes(FMT, m, k), dtype=torch.uint8, device="cuda")

        def launcher(config, out):
            """fn(i): copy i through the wgmma GEMM under `config` into `out`."""
            ws = gemm.MmaWorkspace.create(m, n, config.splits, config.mt, "cuda")
            return lambda i: wgmma.run(x, [copies[i]], out, None, config, ws, staged,
                                       torch.cuda.current_stream().cuda_stream)  # fmt: skip

        def run(config):
            return time_graph(launcher(config, y), len(copies), args.replays)

        share = gemm.split_share(FMT, m, k)  # the plans' K-split rule
        row = dict(m=m, bf16=time_graph(lambda i: F.linear(x, dense[i]), len(dense), args.replays))
        slots = {mt: wgmma.slots(FMT, mt, sms, True) for mt in wgmma.TOKEN_TILES}
        row["register_a"] = {
            mt: run(wgmma.default_config(m, n, one.chunks, slots.get, mt, share))
            for mt in wgmma.TOKEN_TILES
            if 8 * mt <= max(8, 2 * m) and 16 * mt >= min(m, 128)
        }
        # the last copy through the register-A kernel: what the modes that keep results right must give
        best = min(row["register_a"], key=row["register_a"].get)
        expect = torch.empty_like(y)
        launcher(wgmma.default_config(m, n, one.chunks, slots.get, best, share), expect)(len(copies) - 1)
        for mt in (t for t in wgmma.WS_TOKEN_TILES if 4 * t <= max(m, 32)):
            config = wgmma.ws_config(m, n, one.chunks, sms, mt, share)
            variants = [(f"mt={mt} splits={config.splits}", config, MODES)]
            if config.splits > 1:
                one_split = gemm.MmaConfig(mt, 1, rt=2)
                variants.append((f"mt={mt} splits=1", one_split, {k: MODES[k] for k in SPLIT_ONE}))
                if mt in wgmma.TOKEN_TILES:  # the register-A kernel's tiles stop at 128 tokens
                    row.setdefault("register_a splits=1", {})[mt] = run(gemm.MmaConfig(mt, 1))
            for label, cfg, modes in variants:
                for name, mode in modes.items():
                    os.environ["B12X_WS_ABLATE"] = str(mode)  # read by the launch, baked into the captured graph
                    y.fill_(float("nan"))  # a mode that leaves outputs unwritten shows as inf below
                    row.setdefault(f"ws {label}", {})[name] = run(cfg)
                    if mode in CORRECT:  # the replays end on the last copy
                        row.setdefault(f"check {label}", {})[name] = relative_error(y, expect)
            os.environ.pop("B12X_WS_ABLATE")
        rows.append(row)
        print(f"M={m} {FMT} {n}x{k}: bf16 {row['bf16']:.1f} µs | register-A "
              + " ".join(f"mt{mt}:{t:.1f}" for mt, t in row["register_a"].items()))  # fmt: skip
        for key, modes in row.items():
            if key.startswith("ws") or key == "register_a splits=1":
                print(f"  {key}: " + " | ".join(f"{name} {t:.1f}" for name, t in modes.items()), flush=True)
            if key.startswith("check"):
                print(f"  {key} (max |Δ| / max |y| against register-A): "
                      + " | ".join(f"{name} {e:.1e}" for name, e in modes.items()), flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({**device_facts(), "fmt": FMT, "shape": [n, k], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
