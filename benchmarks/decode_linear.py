"""Decode (small-M) linear on the GPU: b12x kernels beside torch bf16 F.linear and fp8 torch._scaled_mm.

    python benchmarks/decode_linear.py --out results.json [--shapes 28672x8192,8192x28672,4096x14336] [--ms 1,2,4,8,16]

Method: each timing is a CUDA graph that runs the op once on each of several weight copies (together more
than 4× the L2 cache, so weights always come from HBM), replayed ≥100 times between CUDA events; the per-call
time is the median replay time divided by the copies. Bandwidth counts weight bytes only (the bandwidth
floor of FORMATS.md), against a device-to-device copy measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import b12x_core as bc
import b12x_formats as bf

L2_BYTES = 60 * 1024**2
_RANDOM_ON = "cuda" if torch.cuda.is_available() else "cpu"  # random bytes of a 70B layer: seconds on the host


def time_graph(fn, copies: int, replays: int = 100, budget_ms: float | None = None) -> float:
    """Median µs per call of fn(i) over i in range(copies), from CUDA graph replays; with `budget_ms`, fewer
    replays (at least 5) where `replays` of them would take longer than that (large M: seconds per point)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)  # warm-up / lazy init outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(copies):
                fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    if budget_ms is not None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays = max(5, min(replays, int(budget_ms / max(start.elapsed_time(end), 1e-3))))
    for _ in range(replays + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / copies)
    return statistics.median(times[5:])


def device_facts(device: torch.device | None = None) -> dict:
    """What a saved benchmark run says of where and when it ran (the table's source, and --from-json's)."""
    day = time.strftime("%Y-%m-%d")
    if device is not None and device.type != "cuda":
        return {"device": "cpu", "capability": [0, 0], "date": day}
    capability = list(torch.cuda.get_device_capability())
    return {"device": torch.cuda.get_device_name(), "capability": capability, "date": day}


def saved_or_measured(args, measure) -> dict:
    """A benchmark's run: the saved --out file that args.from_json names (no measuring, no GPU), else measure(args),
    written to args.out at once (a summary that then fails loses no measurement)."""
    if args.from_json:
        return json.loads(open(args.from_json).read())
    out = measure(args)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return out


def reuse_repacks() -> None:
    """Within this benchmark process, repack each weight for the tensor-core layouts once, however many device
    copies of it are prepared (the host-side repack of a 70B gate_up takes seconds; the copies exist only so
    that the timed weights come from HBM, and each copy is still uploaded on its own)."""
    import numpy as np

    from b12x_core.tensor_core import experts as mma_experts
    from b12x_core.tensor_core import layout as mma_layout

    def once(fn, key_of):
        done: dict = {}

        def cached(*args):
            key = key_of(*args)
            if key not in done:
                done[key] = (args, fn(*args))  # the args stay alive: their ids stay unique
            return done[key][1]

        return cached

    mma_layout.pack = once(mma_layout.pack, lambda qw: id(qw))
    mma_experts.stack_rows = once(mma_experts.stack_rows,
                                  lambda shards, order=None: (tuple(map(id, shards)), None if order is None
                                                              else np.asarray(order).tobytes()))  # fmt: skip


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy, bytes read plus written."""
    nbytes = 2 * 1024**3  # float32 elements: byte-wise copies run a slower kernel
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):  # one large kernel per copy: plain events, no graph needed
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return 2 * nbytes / statistics.median(times[5:]) / 1e3


def copies_for(nbytes: int) -> int:
    return max(2, -(-4 * L2_BYTES // nbytes))


def random_weight(fmt: str, n: int, k: int, lead: tuple[int, ...] = ()) -> bf.QuantizedWeight:
    """Random valid checkpoint tensors of any format (timing does not depend on values, and quantizing 235 M
    weights on the host would take minutes): random bytes, E4M3 codes without NaN, modest scales."""
    import ml_dtypes
    import numpy as np

    from b12x_formats.quantized import codec_for
    from b12x_formats.spec import PER_TENSOR

    codec = codec_for(fmt)
    tensors = {}
    for spec in codec.spec.tensors:
        if not spec.required:
            continue
        shape = codec.expected_shapes(lead, n, k)[spec.name]
        if shape == PER_TENSOR:
            tensors[spec.name] = np.float32(0.01)
        elif spec.dtype == "float32":
            tensors[spec.name] = np.full(shape, 0.01, np.float32)
        else:
            codes = torch.randint(0, 256, shape, dtype=torch.uint8, device=_RANDOM_ON).cpu().numpy()
            if spec.dtype == "float8_e4m3fn":
                codes = (codes & 0x7E).view(ml_dtypes.float8_e4m3fn)  # no NaN, no sign (valid UE4M3 too)
            elif spec.name == "weight_scale":  # E8M0: near 2^0
                codes = (120 + codes % 16).astype(np.uint8)
            elif codec.spec.packing == "ggml":
                codes[..., :2] = np.array([0.01], np.float16).view(np.uint8)
            tensors[spec.name] = codes
    return bf.QuantizedWeight.from_tensors(fmt, tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="28672x8192,8192x28672,4096x14336")
    parser.add_argument("--ms", default="1,2,4,8,16")
    parser.add_argument("--formats", default="IQ2_XS,IQ2_XXS,Q8_0,NVFP4,MXFP4,MXFP8,FP8")
    parser.add_argument("--out", default="decode_linear.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    rows = []
    print(f"# {torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s")
    print(f"{'shape':<12} {'M':>3} {'format':<14} {'µs':>8} {'GB/s':>7} {'%copy':>6} {'vs bf16':>8} {'vs fp8':>7}")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        ms = [int(m) for m in args.ms.split(",")]
        bf16_w = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(2 * n * k))]
        fp8_w = [w.to(torch.float8_e4m3fn) for w in bf16_w[: copies_for(n * k)]]
        one = torch.ones((), device="cuda")
        preps, checkpoint_bytes = {}, {}
        for fmt in args.formats.split(","):
            weight = random_weight(fmt, n, k)
            checkpoint_bytes[fmt] = weight.nbytes
            first = bc.prepare_linear(weight, device="cuda", max_tokens=16)
            # more copies at new addresses, so no weight stays in L2
            preps[fmt] = [first] + [
                bc.prepare_linear(weight, device="cuda", max_tokens=16) for _ in range(copies_for(weight.nbytes) - 1)
            ]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            xp = torch.randn(max(16, m), k, device="cuda").to(torch.float8_e4m3fn)  # _scaled_mm wants M % 16 == 0
            t_bf16 = time_graph(lambda i: F.linear(x, bf16_w[i]), len(bf16_w))
            t_fp8 = time_graph(
                lambda i: torch._scaled_mm(xp, fp8_w[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                len(fp8_w),
            )
            base = [("bf16 F.linear", t_bf16, 2 * n * k), ("fp8 _scaled_mm", t_fp8, n * k)]
            for fmt, plist in preps.items():
                t = time_graph(lambda i: bc.linear(x, plist[i]), len(plist))
                base.append((fmt, t, checkpoint_bytes[fmt]))
            for name, t, nbytes in base:
                gbs = nbytes / t / 1e3
                row = dict(shape=shape, m=m, format=name, us=t, gbs=gbs, pct_copy=100 * gbs / bw,
                           speedup_bf16=t_bf16 / t, speedup_fp8=t_fp8 / t)  # fmt: skip
                rows.append(row)
                print(
                    f"{shape:<12} {m:>3} {name:<14} {t:>8.1f} {gbs:>7.0f} {row['pct_copy']:>5.0f}% "
                    f"{row['speedup_bf16']:>7.2f}x {row['speedup_fp8']:>6.2f}x",
                    flush=True,
                )
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbs": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
