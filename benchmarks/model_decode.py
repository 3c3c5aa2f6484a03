"""One decode step of a whole model on the GPU: b12x-quantized linears (and fused MoE) beside the same model in
bf16, in the same run. Tokens/s = batch / step time.

    python benchmarks/model_decode.py --out model_decode.json --png model_decode.png [--models llama8b,qwen3moe]
        [--formats NVFP4,IQ2_XS,FP8,MXFP4] [--moe-formats NVFP4,IQ2_XS] [--batches 1,4,16] [--layers N] [--quick]
        [--budget-s 200]
    python benchmarks/model_decode.py --from-json model_decode.json --png model_decode.png   # table + plot, no GPU

Models: llama8b = Llama-3.1-8B-shaped (hidden 4096, 32 layers, 32 heads / 8 KV heads of 128, MLP 14336, vocab
128256); qwen3moe = Qwen3-30B-A3B-shaped (hidden 2048, 48 layers, 32 heads / 4 KV heads of 128, q/k RMSNorm, 128
experts, top-8, expert intermediate 768, vocab 151936). Random weights (decode_linear.random_weight: valid
checkpoint bytes; timing does not depend on values). `--layers N` builds N decoder layers instead of the model's
own count; every row records the layers it ran, and the step time is that model's, never scaled.

The model is written here, not taken from transformers: a hand-written Llama/Qwen3 decoder (RMSNorm, rotary at the
new token's position, GQA attention by F.scaled_dot_product_attention over a fixed KV cache of CTX slots, SiLU
MLP or a routed MoE). Capturing transformers' LlamaForCausalLM with a StaticCache in a CUDA graph depends on HF
internals that change between versions, and this could not be tried on a GPU when it was written; the hand-written
step runs the same GEMM sequence as vLLM's decode, with no HF code in the timed graph. Both variants run the same
module; only the linear layers (and the experts) differ:
  - bf16: plain nn.Linear; q/k/v fused into one [6144, 4096] weight and gate/up into one, as vLLM serves them
    (QKVParallelLinear, MergedColumnParallelLinear); experts by moe.bf16_grouped_moe with torch softmax top-k.
  - b12x: one bc.prepare_linear per fused layer from its row shards (q, k, v / gate, up: each shard its own
    per-tensor scales, as b12x_vllm prepares them), activation "auto" (the checkpoint's recipe, as b12x_vllm
    asks; the random checkpoints carry no input_scale, so FP8 runs W8A8 with per-token fp8 activations and the
    rest bf16; FP8+input_scale and NVFP4+input_scale carry one, as ModelOpt's checkpoints do, and run fp8 static
    and nvfp4 activations); experts by bc.prepare_moe (act_format "auto" likewise: bf16 for NVFP4 and IQ2_XS, mxfp8 for
    MXFP4) + bc.route_topk + bc.moe. The router, embedding and LM head stay bf16 in both. Rows name the modes.
Method: the step (embedding, every layer, final norm, LM head) of B sequences of one new token each, the KV cache
holding CTX - 1 earlier tokens, is captured in one CUDA graph and replayed (decode_linear.time_graph: median of the
replays between CUDA events). µs/layer = (step − the same step with no layers: embedding, norm, LM head) / layers,
measured in bf16 in the same run. Not counted: sampling, vLLM's scheduler and paged-attention metadata. Each layer's
weights are its own device copy (the whole model streams from HBM every step); host-side repacks are made once per
(format, projection) and uploaded to every layer (decode_linear.reuse_repacks), so building stays fast. No format
starts after --budget-s seconds (the default run stays within about 4 minutes; skipped formats are printed).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from decode_linear import device_facts, random_weight, reuse_repacks, time_graph
from moe import bf16_grouped_moe

import b12x_core as bc
import b12x_formats as bf

CTX = 512  # KV-cache slots per sequence; the new token takes the last one
ROPE_THETA = 500000.0
BF16 = "bf16"


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int  # the MLP's intermediate size, or one expert's
    vocab: int
    experts: int = 0  # 0: a dense MLP
    top_k: int = 0
    qk_norm: bool = False


ARCHS = {
    "llama8b": Arch("llama8b", 4096, 32, 32, 8, 128, 14336, 128256),
    "qwen3moe": Arch("qwen3moe", 2048, 48, 32, 4, 128, 768, 151936, experts=128, top_k=8, qk_norm=True),
}


# A format named with this suffix (FP8+input_scale, NVFP4+input_scale) is a checkpoint that also carries a static
# input_scale, as ModelOpt's FP8 and NVFP4 checkpoints do, so "auto" resolves to their recipe: fp8 static, nvfp4.
WITH_INPUT_SCALE = "+input_scale"
# The input_scale those carry: fp8 static's codes reach |x| = 448 x 0.02 (about 9); nvfp4's blocks 448 x 6 x it. The
# kernels saturate past them, and the step's time does not depend on values (step_us checks the output is finite).
INPUT_SCALE = {"FP8": 0.02, "NVFP4": 5.0 / (448 * 6)}


@functools.cache
def checkpoint(fmt: str, role: str, n: int, k: int, lead: tuple[int, ...] = ()):
    """One random checkpoint weight per (format, projection), shared by every layer: reuse_repacks then repacks
    it once, and each layer still uploads its own device copy."""
    name = fmt.removesuffix(WITH_INPUT_SCALE)
    weight = random_weight(name, n, k, lead)
    if name == fmt:
        return weight
    return bf.QuantizedWeight.from_tensors(name, {**weight.tensors, "input_scale": np.float32(INPUT_SCALE[name])})


class B12xLinear(torch.nn.Module):
    """A b12x prepared linear over row shards (a fused qkv or gate_up runs as one [sum N, K] layer)."""

    def __init__(self, fmt: str, role: str, rows: list[int], k: int, device, max_tokens: int):
        super().__init__()
        shards = [checkpoint(fmt, f"{role}{i}", n, k) for i, n in enumerate(rows)]
        self.prepared = bc.prepare_linear(shards, device=device, max_tokens=max_tokens, activation="auto")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bc.linear(x, self.prepared)


def make_linear(fmt: str, role: str, rows: list[int], k: int, device, max_tokens: int) -> torch.nn.Module:
    if fmt == BF16:
        return torch.nn.Linear(k, sum(rows), bias=False, device=device, dtype=torch.bfloat16)
    return B12xLinear(fmt, role, rows, k, device, max_tokens)


class Experts(torch.nn.Module):
    """The routed MoE: a bf16 router, then b12x's fused MoE or the bf16 grouped one."""

    def __init__(self, arch: Arch, fmt: str, device, max_tokens: int):
        super().__init__()
        e, h, inter = arch.experts, arch.hidden, arch.inter
        self.top_k, self.inter, self.fmt = arch.top_k, inter, fmt
        self.router = torch.nn.Linear(h, e, bias=False, device=device, dtype=torch.bfloat16)
        if fmt == BF16:
            self.w13 = torch.randn(e, 2 * inter, h, dtype=torch.bfloat16, device=device) / h**0.5  # gate, up
            self.w2 = torch.randn(e, h, inter, dtype=torch.bfloat16, device=device) / inter**0.5
        else:
            w13, w2 = checkpoint(fmt, "w13", 2 * inter, h, (e,)), checkpoint(fmt, "w2", h, inter, (e,))
            self.prepared = bc.prepare_moe(w13, w2, activation="silu", w13_order="gate_up", max_tokens=max_tokens,
                                           top_k=arch.top_k, device=device, act_format="auto")  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        if self.fmt != BF16:
            weights, ids = bc.route_topk(logits, self.top_k)
            return bc.moe(x, weights, ids, self.prepared)
        weights, ids = torch.topk(torch.softmax(logits.float(), -1), self.top_k, dim=-1)  # vLLM's fused_topk
        weights = weights / weights.sum(-1, keepdim=True)
        return bf16_grouped_moe(x, weights, ids, self.w13.transpose(1, 2), self.w2.transpose(1, 2), self.inter)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps=1e-6)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding at one position (Llama's rotate_half form); cos and sin are [head_dim]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DecoderLayer(torch.nn.Module):
    def __init__(self, arch: Arch, fmt: str, device, max_tokens: int, rope: tuple[torch.Tensor, torch.Tensor]):
        super().__init__()
        a, ones = arch, functools.partial(torch.ones, dtype=torch.bfloat16, device=device)
        self.arch, self.rope = a, rope
        self.q_rows, self.kv_rows = a.heads * a.head_dim, a.kv_heads * a.head_dim
        self.qkv = make_linear(fmt, "qkv", [self.q_rows, self.kv_rows, self.kv_rows], a.hidden, device, max_tokens)
        self.o = make_linear(fmt, "o", [a.hidden], self.q_rows, device, max_tokens)
        if a.experts:
            self.mlp = Experts(a, fmt, device, max_tokens)
        else:
            self.gate_up = make_linear(fmt, "gate_up", [a.inter, a.inter], a.hidden, device, max_tokens)
            self.down = make_linear(fmt, "down", [a.hidden], a.inter, device, max_tokens)
        self.norm_in, self.norm_mlp, self.norm_head = ones(a.hidden), ones(a.hidden), ones(a.head_dim)
        cache = (max_tokens, a.kv_heads, CTX, a.head_dim)  # the earlier tokens' keys and values: any values do
        self.k_cache = torch.randn(cache, dtype=torch.bfloat16, device=device)
        self.v_cache = torch.randn(cache, dtype=torch.bfloat16, device=device)

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        a, b = self.arch, h.shape[0]
        q, k, v = self.qkv(h).split([self.q_rows, self.kv_rows, self.kv_rows], dim=-1)
        q, k, v = q.view(b, a.heads, a.head_dim), k.view(b, a.kv_heads, a.head_dim), v.view(b, a.kv_heads, a.head_dim)
        if a.qk_norm:  # Qwen3: RMSNorm per head before the rotary
            q, k = rms_norm(q, self.norm_head), rms_norm(k, self.norm_head)
        q, k = rotate(q, *self.rope), rotate(k, *self.rope)
        self.k_cache[:b, :, CTX - 1] = k
        self.v_cache[:b, :, CTX - 1] = v
        out = F.scaled_dot_product_attention(q.unsqueeze(2), self.k_cache[:b], self.v_cache[:b], enable_gqa=True)
        return self.o(out.reshape(b, self.q_rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(rms_norm(x, self.norm_in))
        h = rms_norm(x, self.norm_mlp)
        if self.arch.experts:
            return x + self.mlp(h)
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(torch.nn.Module):
    """Token ids [B] -> logits [B, vocab] of one decode step; `fmt` is "bf16" or a b12x format."""

    def __init__(self, arch: Arch, fmt: str, device="cuda", max_tokens: int = 16):
        super().__init__()
        freqs = (CTX - 1) / ROPE_THETA ** (torch.arange(0, arch.head_dim, 2, device=device) / arch.head_dim)
        angles = torch.cat([freqs, freqs])
        rope = (angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16))
        self.embed = torch.nn.Embedding(arch.vocab, arch.hidden, device=device, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList(DecoderLayer(arch, fmt, device, max_tokens, rope) for _ in range(arch.layers))
        self.norm = torch.ones(arch.hidden, dtype=torch.bfloat16, device=device)
        self.lm_head = torch.nn.Linear(arch.hidden, arch.vocab, bias=False, device=device, dtype=torch.bfloat16)
        self.requires_grad_(False)  # inference: no autograd state in the timed graph

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(rms_norm(x, self.norm))

    def activations(self) -> str:
        """The activation modes the b12x ops resolved "auto" to (linear, then MoE where there is one)."""
        linear = {m.prepared.act_mode for m in self.modules() if isinstance(m, B12xLinear)}
        moe = {m.prepared.act_format for m in self.modules() if isinstance(m, Experts) and m.fmt != BF16}
        return "/".join(sorted(linear)) + (" moe " + "/".join(sorted(moe)) if moe else "") or BF16


def step_us(model: Model, batch: int, replays: int) -> float:
    """Median µs of one decode step of `batch` sequences, as CUDA-graph replays; refuses a non-finite output (random
    weights whose activations overflowed would time another computation)."""
    ids = torch.randint(model.embed.num_embeddings, (batch,), device="cuda")
    with torch.no_grad():
        if not torch.isfinite(model(ids)).all():
            raise RuntimeError("the step's logits are not finite")
        return time_graph(lambda i: model(ids), 1, replays)


def measure(arch: Arch, fmt: str, batches: list[int], replays: int):
    """Builds the model, then yields (batch, step µs, seconds to build, activation modes) as each batch is timed;
    frees the model after the last."""
    started = time.monotonic()
    model = Model(arch, fmt, max_tokens=max(16, *batches))
    torch.cuda.synchronize()
    built, acts = time.monotonic() - started, model.activations()
    for b in batches:
        yield b, step_us(model, b, replays), built, acts
    del model
    torch.cuda.empty_cache()


def bf16_steps(arch: Arch, batches: list[int], replays: int) -> tuple[dict[int, float], dict[int, float]]:
    """-> ({batch: µs} of the bf16 model, {batch: µs} of its embedding + final norm + LM head alone)."""
    base = {}
    for b, us, built, _ in measure(arch, BF16, batches, replays):
        base[b] = us
        print(f"  {arch.name} bf16     B={b:<3} {us:>9.0f} µs {b / us * 1e6:>8.0f} tok/s  (built in {built:.0f} s)",
              flush=True)  # fmt: skip
    head = {b: us for b, us, *_ in measure(replace(arch, layers=0), BF16, batches, replays)}
    print(f"  {arch.name} embedding + LM head alone: " + ", ".join(f"B={b} {us:.0f} µs" for b, us in head.items()),
          flush=True)  # fmt: skip
    return base, head


def run(args) -> list[dict]:
    reuse_repacks()
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    deadline = time.monotonic() + args.budget_s
    rows = []
    for name in args.models.split(","):
        arch = ARCHS[name] if not args.layers else replace(ARCHS[name], layers=args.layers)
        print(f"## {name}, {arch.layers} layers", flush=True)
        base, head = bf16_steps(arch, batches, args.replays)
        for fmt in (args.moe_formats if arch.experts else args.formats).split(","):
            if time.monotonic() > deadline:
                print(f"  time budget of {args.budget_s:.0f} s spent: {name} {fmt} not measured", flush=True)
                continue
            try:
                for b, us, built, acts in measure(arch, fmt, batches, args.replays):
                    rows.append(dict(model=name, layers=arch.layers, format=fmt, activation=acts, batch=b,
                                     step_us=us, tokens_per_s=b / us * 1e6, bf16_step_us=base[b],
                                     bf16_tokens_per_s=b / base[b] * 1e6, speedup=base[b] / us, head_us=head[b],
                                     layer_us=(us - head[b]) / arch.layers,
                                     bf16_layer_us=(base[b] - head[b]) / arch.layers, build_s=built))  # fmt: skip
                    print(f"  {name} {fmt:<8} B={b:<3} {us:>9.0f} µs {b / us * 1e6:>8.0f} tok/s "
                          f"{base[b] / us:>5.2f}× bf16  ({acts}; built in {built:.0f} s)", flush=True)  # fmt: skip
                    save(args.out, rows)  # after every point: a run cut short keeps what it measured
            except bc.UnsupportedError as err:
                print(f"  {name} {fmt}: {err}", flush=True)
    return rows


def save(path: str, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps({**device_facts(), "ctx": CTX, "rows": rows}, indent=1))


def table(rows: list[dict]) -> str:
    lines = ["| model | layers | format | activations | B | step µs | tok/s | bf16 µs | bf16 tok/s | vs bf16 "
             "| µs/layer | bf16 µs/layer |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['model']} | {r['layers']} | {r['format']} | {r['activation']} | {r['batch']} | "
                     f"{r['step_us']:.0f} | {r['tokens_per_s']:.0f} | {r['bf16_step_us']:.0f} | "
                     f"{r['bf16_tokens_per_s']:.0f} | {r['speedup']:.2f}× | {r['layer_us']:.1f} | "
                     f"{r['bf16_layer_us']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def plot(saved: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = saved["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        here = [r for r in rows if r["model"] == model]
        for fmt in dict.fromkeys(r["format"] for r in here):
            pts = sorted((r["batch"], r["tokens_per_s"]) for r in here if r["format"] == fmt)
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"b12x {fmt}")
        ref = sorted({(r["batch"], r["bf16_tokens_per_s"]) for r in here})
        ax.plot(*zip(*ref, strict=True), "k--", marker="s", label="bf16")
        ax.set(xscale="log", yscale="log", xlabel="batch (sequences, 1 new token each)", ylabel="tokens/s",
               title=f"{model}, {here[0]['layers']} layers, decode step")  # fmt: skip
        ax.set_xticks(sorted({r["batch"] for r in here}), labels=[str(b) for b in sorted({r["batch"] for r in here})])
        ax.legend(fontsize=7)
    fig.suptitle(f"{saved.get('device', '?')} {saved.get('date', '')}, KV cache {saved.get('ctx', CTX)} slots")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama8b,qwen3moe")
    parser.add_argument("--formats", default="NVFP4,IQ2_XS,FP8,MXFP4", help="the dense model's linear formats")
    parser.add_argument("--moe-formats", default="NVFP4,IQ2_XS", help="the MoE model's (b12x_core.moe.MOE_FORMATS)")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers to build (0: the model's own count)")
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--budget-s", type=float, default=200, help="start no new format after this many seconds")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, batch 1")
    parser.add_argument("--out", default="model_decode.json")
    parser.add_argument("--png", default="model_decode.png")
    parser.add_argument("--from-json", default="", help="no measuring: the table and plot of a saved --out file")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
    else:
        if args.quick:
            args.layers, args.batches = 2, "1"
        print(f"# {torch.cuda.get_device_name()}: decode step, KV cache {CTX} slots", flush=True)
        started = time.monotonic()
        saved = {**device_facts(), "ctx": CTX, "rows": run(args)}
        save(args.out, saved["rows"])
        print(f"# measured in {time.monotonic() - started:.0f} s", flush=True)
    print(table(saved["rows"]))
    if args.png and saved["rows"]:
        plot(saved, args.png)


if __name__ == "__main__":
    main()
