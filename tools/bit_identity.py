"""Are two source trees' results bit-identical on this GPU? Every linear backend alone on every format it serves
(one activation mode each, as the fast tier picks), every MoE backend on every MoE format, the dispatched ops,
on fixed seeded inputs: each tree runs in a process of its own and saves its outputs, then they are compared.

    python tools/bit_identity.py OLD_ROOT NEW_ROOT [OLD_KERNELS] [--renamed OLD=NEW ...]
                                                        # each ROOT holds packages/b12x-{formats,core}/src
    python tools/bit_identity.py --emit OUT.pt          # (internal) this process's tree's outputs

A refactor that moves code must leave every output equal bit for bit. The installed b12x_kernels
serves the new tree; OLD_KERNELS (a `pip install --target` folder of the old tree's b12x_kernels) the old one,
when the refactor changed the kernels' interface too. `--renamed OLD=NEW`: a backend the refactor renamed; its
outputs are compared under the new name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

N, K, M = 256, 512, (1, 37)
E, H, INTER, TOP_K, T = 4, 256, 256, 2, (1, 37)


def emit(path: str) -> None:
    import numpy as np
    import torch

    import b12x_core as bc
    import b12x_formats as bf
    from b12x_core import backends, plan
    from b12x_core.weights import DeviceWeights, as_shards

    outputs: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(max(M), K, generator=gen).to(torch.bfloat16).cuda()
    for i, fmt in enumerate(sorted(bf.FORMATS)):  # each format its own seed: both trees draw the same weights
        rng = np.random.default_rng(1000 + i)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        qw = bf.quantize(w, fmt)
        for activation in [a for a in ("bf16", "fp8", "mxfp8") if a in bf.spec(fmt).activations][:2]:
            lin = bc.prepare_linear(qw, device="cuda", max_tokens=max(M), activation=activation)
            for m in M:
                outputs[f"dispatched {fmt} {activation} {m}"] = bc.linear(x[:m], lin).cpu()
            for cls in backends.for_op("linear"):
                if cls.name.startswith("reference") or not cls.can_implement(lin.plan.query)[0]:
                    continue
                weights = DeviceWeights(as_shards(qw), lin.act_mode, lin.input_scale, lin.device)
                alone = plan.build(lin.plan.query, weights, only=cls)
                for m in M:
                    outputs[f"{cls.name} {fmt} {activation} {m}"] = alone.for_tokens(m).run(x[:m], None).cpu()
    xm = torch.randn(max(T), H, generator=gen).to(torch.bfloat16).cuda()
    weights, ids = bc.route_topk(torch.randn(max(T), E, generator=gen), TOP_K)
    weights, ids = weights.cuda(), ids.cuda()
    for i, fmt in enumerate(sorted(bc.MOE_FORMATS)):
        rng = np.random.default_rng(2000 + i)
        w13 = bf.quantize((rng.standard_normal((E, 2 * INTER, H)) / np.sqrt(H)).astype(np.float32), fmt)
        w2 = bf.quantize((rng.standard_normal((E, H, INTER)) / np.sqrt(INTER)).astype(np.float32), fmt)
        p = bc.prepare_moe(w13, w2, device="cuda", max_tokens=max(T), top_k=TOP_K, act_format="bf16")
        for t in T:
            outputs[f"moe dispatched {fmt} {t}"] = bc.moe(xm[:t], weights[:t], ids[:t], p).cpu()
        for cls in backends.for_op("moe"):
            if cls.name.startswith("reference") or not cls.can_implement(p.plan.query)[0]:
                continue
            dw = (DeviceWeights(as_shards(w13), p.act_mode_13, p.input_scale_13, p.device),
                  DeviceWeights([w2], p.act_mode_2, p.input_scale_2, p.device))  # fmt: skip
            alone = plan.build(p.plan.query, dw, only=cls)
            for t in T:
                outputs[f"moe {cls.name} {fmt} {t}"] = alone.for_tokens(t).run(xm[:t], weights[:t], ids[:t]).cpu()
    torch.save(outputs, path)


def compare(old_root: str, new_root: str, old_kernels: str = "", renamed: dict[str, str] | None = None) -> int:
    import torch

    saved = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, root in enumerate((old_root, new_root)):
            src = [str(Path(root, "packages", p, "src").resolve()) for p in ("b12x-formats", "b12x-core")]
            if i == 0 and old_kernels:
                src.append(str(Path(old_kernels).resolve()))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([*src, os.environ.get("PYTHONPATH", "")]))
            out = str(Path(tmp, f"{i}.pt"))
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--emit", out], env=env, check=True, cwd=tmp)
            saved.append(torch.load(out))
    old, new = saved
    for before, after in (renamed or {}).items():  # keys start with the backend's name
        old = {(after + k[len(before) :] if k.split()[0] == before else k): v for k, v in old.items()}
    both = [k for k in old if k in new]
    differ = [k for k in both if not torch.equal(old[k], new[k])]
    missing = sorted(set(old) ^ set(new))
    print(f"bit identity: {len(both) - len(differ)} of {len(both)} outputs of both trees equal; differ: "
          f"{differ or 'none'}; only in one tree: {missing or 'none'}")  # fmt: skip
    return 1 if differ or missing else 0


if __name__ == "__main__":
    if sys.argv[1] == "--emit":
        emit(sys.argv[2])
    else:
        args = sys.argv[1:]
        pairs = [args[i + 1] for i, a in enumerate(args) if a == "--renamed"]
        roots = [a for i, a in enumerate(args) if a != "--renamed" and (i == 0 or args[i - 1] != "--renamed")]
        raise SystemExit(compare(*roots[:3], renamed=dict(pair.split("=", 1) for pair in pairs)))
