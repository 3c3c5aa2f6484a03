"""One step of a whole model on the GPU: b12x-quantized linears (and fused MoE) beside the same model in bf16, in
the same run. Two kinds of step: a decode step of B sequences, one new token each (tokens/s = B / step time), and a
prefill chunk of T new tokens of one sequence (tokens/s = T / step time).

    python benchmarks/model_decode.py --out model_decode.json --png model_decode.png [--models llama8b,qwen3moe]
        [--formats NVFP4,IQ2_XS,FP8,MXFP4] [--moe-formats NVFP4,IQ2_XS] [--batches 1,4,16] [--prefill 2048]
        [--layers N] [--quick] [--budget-s 200]
    python benchmarks/model_decode.py --serving --out serving.json --png serving.png   # the serving workload
    python benchmarks/model_decode.py --from-json model_decode.json --png model_decode.png   # table + plot, no GPU

`--serving` is the serving workload: both models, a 2,048-token prefill chunk and decode steps of 64 and 256
sequences, the default formats, --budget-s 420 (each given flag still overrides it).

Models: llama8b = Llama-3.1-8B-shaped (hidden 4096, 32 layers, 32 heads / 8 KV heads of 128, MLP 14336, vocab
128256); qwen3moe = Qwen3-30B-A3B-shaped (hidden 2048, 48 layers, 32 heads / 4 KV heads of 128, q/k RMSNorm, 128
experts, top-8, expert intermediate 768, vocab 151936). Random weights (decode_linear.random_weight: valid
checkpoint bytes; timing does not depend on values). `--layers N` builds N decoder layers instead of the model's
own count; every row records the layers it ran, and the step time is that model's, never scaled.

The model is written here, not taken from transformers: a hand-written Llama/Qwen3 decoder (RMSNorm, rotary at each
new token's position, GQA attention by F.scaled_dot_product_attention, SiLU MLP or a routed MoE). Capturing
transformers' LlamaForCausalLM with a StaticCache in a CUDA graph depends on HF internals that change between
versions, and this could not be tried on a GPU when it was written; the hand-written step runs the same GEMM
sequence as vLLM's, with no HF code in the timed graph. Both variants run the same module; attention is bf16 and
the same in both; only the linear layers (and the experts) differ:
  - bf16: plain nn.Linear; q/k/v fused into one [6144, 4096] weight and gate/up into one, as vLLM serves them
    (QKVParallelLinear, MergedColumnParallelLinear); experts by moe.bf16_grouped_moe with torch softmax top-k.
  - b12x: one bc.prepare_linear per fused layer from its row shards (q, k, v / gate, up: each shard its own
    per-tensor scales, as b12x_vllm prepares them), activation "auto" (the checkpoint's recipe, as b12x_vllm
    asks; the random checkpoints carry no input_scale, so FP8 runs W8A8 with per-token fp8 activations and the
    rest bf16; FP8+input_scale and NVFP4+input_scale carry one, as ModelOpt's checkpoints do, and run fp8 static
    and nvfp4 activations); experts by bc.prepare_moe (act_format "auto" likewise: bf16 for NVFP4 and IQ2_XS, mxfp8 for
    MXFP4) + bc.route_topk + bc.moe. The router, embedding and LM head stay bf16 in both. Rows name the modes.
The steps:
  - decode (`--batches`): embedding, every layer, final norm, LM head of B sequences of one new token each, at
    position CTX - 1; each sequence's KV cache holds CTX - 1 earlier tokens (any values) and attention reads all
    CTX slots (the new token's key and value written into the last one).
  - prefill (`--prefill`): one sequence's chunk of T new tokens at positions 0..T-1 with no earlier context (the
    first chunk of a prompt): each layer writes the chunk's keys and values into that sequence's KV cache and
    attends causally over the chunk alone (scaled_dot_product_attention, is_causal); the LM head runs on the
    chunk's last token only, as vLLM computes logits for each sequence's last token.
Method: each step is captured in one CUDA graph and replayed (decode_linear.time_graph: median of the replays
between CUDA events; a prefill step replays for about PREFILL_BUDGET_MS, at least 5 times). µs/layer = (step − the
same step with no layers: embedding, norm, LM head) / layers, measured in bf16 in the same run. Not counted:
sampling, vLLM's scheduler and paged-attention metadata. Each layer's weights are its own device copy (the whole
model streams from HBM every step); host-side repacks are made once per (format, projection) and uploaded to every
layer (decode_linear.reuse_repacks), so building stays fast. No format starts after --budget-s seconds (the default
run stays within about 4 minutes; skipped formats are printed).
Memory: the variants are built and timed one after the other (the bf16 model, then the bf16 model with no layers,
then each format, each freed before the next), so the GPU holds one model at a time with its KV caches. The
decode cache holds max(--batches) sequences of CTX = 512 slots; at 256 sequences that is 17 GB for llama8b (16 GB
of bf16 weights) and 13 GB for qwen3moe (61 GB of bf16 weights, 69 GiB in all), so `--serving` fits on an 80 GB
GPU; the prefill cache (one sequence of T slots) is small beside it.
"""

from __future__ import annotations

import argparse
import functools
import gc
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

CTX = 512  # KV-cache slots per decoding sequence; the new token takes the last one
ROPE_THETA = 500000.0
BF16 = "bf16"
DECODE, PREFILL = "decode", "prefill"
PREFILL_BUDGET_MS = 2000.0  # a 2,048-token prefill of the 8B model takes tens of ms: ~2 s of replays a point
SERVING = dict(models="llama8b,qwen3moe", prefill="2048", batches="64,256", budget_s=420.0)  # --serving


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
        self.shards = [checkpoint(fmt, f"{role}{i}", n, k) for i, n in enumerate(rows)]
        self.prepared = bc.prepare_linear(self.shards, device=device, max_tokens=max_tokens, activation="auto")

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
            self.checkpoints = checkpoint(fmt, "w13", 2 * inter, h, (e,)), checkpoint(fmt, "w2", h, inter, (e,))
            self.prepared = bc.prepare_moe(*self.checkpoints, activation="silu", w13_order="gate_up",
                                           max_tokens=max_tokens, top_k=arch.top_k, device=device,
                                           act_format="auto")  # fmt: skip

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


def rope(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [len(positions), head_dim] of Llama's rotary embedding; decode and prefill share this arithmetic,
    so a token at one position rotates the same in both."""
    inverse = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inverse
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Llama's rotate_half form); cos and sin broadcast against x's [..., head_dim]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DecoderLayer(torch.nn.Module):
    def __init__(self, arch: Arch, fmt: str, device, max_tokens: int, rope_decode, rope_prefill, kv_batch: int,
                 prefill_tokens: int, ctx: int):  # fmt: skip
        super().__init__()
        a, ones = arch, functools.partial(torch.ones, dtype=torch.bfloat16, device=device)
        self.arch, self.rope_decode, self.rope_prefill, self.ctx = a, rope_decode, rope_prefill, ctx
        self.q_rows, self.kv_rows = a.heads * a.head_dim, a.kv_heads * a.head_dim
        self.qkv = make_linear(fmt, "qkv", [self.q_rows, self.kv_rows, self.kv_rows], a.hidden, device, max_tokens)
        self.o = make_linear(fmt, "o", [a.hidden], self.q_rows, device, max_tokens)
        if a.experts:
            self.mlp = Experts(a, fmt, device, max_tokens)
        else:
            self.gate_up = make_linear(fmt, "gate_up", [a.inter, a.inter], a.hidden, device, max_tokens)
            self.down = make_linear(fmt, "down", [a.hidden], a.inter, device, max_tokens)
        self.norm_in, self.norm_mlp, self.norm_head = ones(a.hidden), ones(a.hidden), ones(a.head_dim)
        cache = (kv_batch, a.kv_heads, ctx, a.head_dim)  # the decoding sequences' earlier tokens: any values do
        self.k_cache = torch.randn(cache, dtype=torch.bfloat16, device=device)
        self.v_cache = torch.randn(cache, dtype=torch.bfloat16, device=device)
        chunk = (1, a.kv_heads, prefill_tokens, a.head_dim)  # the prefilling sequence's cache, filled by the chunk
        self.k_chunk = torch.zeros(chunk, dtype=torch.bfloat16, device=device)
        self.v_chunk = torch.zeros(chunk, dtype=torch.bfloat16, device=device)

    def qkv_heads(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim], q and k normed (Qwen3) and rotated."""
        a, n = self.arch, h.shape[0]
        q, k, v = self.qkv(h).split([self.q_rows, self.kv_rows, self.kv_rows], dim=-1)
        q, k, v = q.view(n, a.heads, a.head_dim), k.view(n, a.kv_heads, a.head_dim), v.view(n, a.kv_heads, a.head_dim)
        if a.qk_norm:  # Qwen3: RMSNorm per head before the rotary
            q, k = rms_norm(q, self.norm_head), rms_norm(k, self.norm_head)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def decode_attention(self, h: torch.Tensor) -> torch.Tensor:
        """B sequences' new tokens [B, hidden], each attending over its sequence's CTX cache slots."""
        b = h.shape[0]
        q, k, v = self.qkv_heads(h, *self.rope_decode)
        self.k_cache[:b, :, self.ctx - 1] = k
        self.v_cache[:b, :, self.ctx - 1] = v
        out = F.scaled_dot_product_attention(q.unsqueeze(2), self.k_cache[:b], self.v_cache[:b], enable_gqa=True)
        return self.o(out.reshape(b, self.q_rows))

    def prefill_attention(self, h: torch.Tensor) -> torch.Tensor:
        """One sequence's chunk [T, hidden] at positions 0..T-1: its keys and values go into the cache, and each
        token attends causally over the chunk (no earlier context)."""
        t = h.shape[0]
        cos, sin = (r[:t, None] for r in self.rope_prefill)  # [T, 1, head_dim]: broadcast over the heads
        q, k, v = self.qkv_heads(h, cos, sin)
        self.k_chunk[0, :, :t] = k.transpose(0, 1)
        self.v_chunk[0, :, :t] = v.transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), self.k_chunk[:, :, :t],
                                             self.v_chunk[:, :, :t], is_causal=True, enable_gqa=True)  # fmt: skip
        return self.o(out[0].transpose(0, 1).reshape(t, self.q_rows))

    def forward(self, x: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        attention = self.prefill_attention if prefill else self.decode_attention
        x = x + attention(rms_norm(x, self.norm_in))
        h = rms_norm(x, self.norm_mlp)
        if self.arch.experts:
            return x + self.mlp(h)
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(torch.nn.Module):
    """A decode step (`forward`: token ids [B] -> logits [B, vocab]) or a prefill chunk (`prefill`: ids [T] of one
    sequence -> logits [1, vocab] of its last token); `fmt` is "bf16" or a b12x format. `max_tokens`: the most tokens
    one step runs (the b12x ops are prepared for it); the decode KV cache holds `kv_batch` sequences (default
    max_tokens) of `ctx` slots, the prefill cache one sequence of `prefill_tokens`."""

    def __init__(self, arch: Arch, fmt: str, device="cuda", max_tokens: int = 16, kv_batch: int | None = None,
                 prefill_tokens: int = 0, ctx: int = CTX):  # fmt: skip
        super().__init__()
        decode_cos, decode_sin = rope(torch.tensor([ctx - 1], device=device), arch.head_dim)
        rope_prefill = rope(torch.arange(prefill_tokens, device=device), arch.head_dim)
        kv_batch = max_tokens if kv_batch is None else kv_batch
        self.embed = torch.nn.Embedding(arch.vocab, arch.hidden, device=device, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(
                arch,
                fmt,
                device,
                max_tokens,
                (decode_cos[0], decode_sin[0]),
                rope_prefill,
                kv_batch,
                prefill_tokens,
                ctx,
            )  # fmt: skip
            for _ in range(arch.layers)
        )
        self.norm = torch.ones(arch.hidden, dtype=torch.bfloat16, device=device)
        self.lm_head = torch.nn.Linear(arch.hidden, arch.vocab, bias=False, device=device, dtype=torch.bfloat16)
        self.requires_grad_(False)  # inference: no autograd state in the timed graph

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(rms_norm(x, self.norm))

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, prefill=True)
        return self.lm_head(rms_norm(x, self.norm)[-1:])

    def activations(self) -> str:
        """The activation modes the b12x ops resolved "auto" to (linear, then MoE where there is one)."""
        linear = {m.prepared.act_mode for m in self.modules() if isinstance(m, B12xLinear)}
        moe = {m.prepared.act_format for m in self.modules() if isinstance(m, Experts) and m.fmt != BF16}
        return "/".join(sorted(linear)) + (" moe " + "/".join(sorted(moe)) if moe else "") or BF16


def step_us(model: Model, step: str, tokens: int, replays: int) -> float:
    """Median µs of one decode step of `tokens` sequences or one prefill chunk of `tokens` tokens, as CUDA-graph
    replays; refuses a non-finite output (random weights whose activations overflowed would time another
    computation)."""
    ids = torch.randint(model.embed.num_embeddings, (tokens,), device="cuda")
    run_step = model.prefill if step == PREFILL else model
    with torch.no_grad():
        if not torch.isfinite(run_step(ids)).all():
            raise RuntimeError(f"the {step} step's logits are not finite")
        budget = PREFILL_BUDGET_MS if step == PREFILL else None
        return time_graph(lambda i: run_step(ids), 1, replays, budget_ms=budget)


def points(batches: list[int], prefills: list[int]) -> list[tuple[str, int]]:
    """The steps a run times, (step, tokens): decode steps of each batch, then prefill chunks of each length."""
    return [(DECODE, b) for b in batches] + [(PREFILL, t) for t in prefills]


def build(arch: Arch, fmt: str, batches: list[int], prefills: list[int]) -> tuple[Model, float]:
    """The model for every step of the run, and the seconds it took to build."""
    started = time.monotonic()
    model = Model(arch, fmt, max_tokens=max(16, *batches, *prefills), kv_batch=max(batches, default=0),
                  prefill_tokens=max(prefills, default=0))  # fmt: skip
    torch.cuda.synchronize()
    return model, time.monotonic() - started


def release() -> None:
    """Hands a model the caller has dropped back to the device (the next one may need its memory)."""
    gc.collect()
    torch.cuda.empty_cache()


def label(step: str, tokens: int) -> str:
    return f"B={tokens}" if step == DECODE else f"prefill T={tokens}"


def bf16_steps(arch: Arch, batches, prefills, replays) -> tuple[dict, dict]:
    """-> ({(step, tokens): µs} of the bf16 model, the same of its embedding + final norm + LM head alone)."""
    base, head = {}, {}
    model, built = build(arch, BF16, batches, prefills)
    for step, n in points(batches, prefills):
        us = base[step, n] = step_us(model, step, n, replays)
        print(f"  {arch.name} bf16     {label(step, n):<15} {us:>9.0f} µs {n / us * 1e6:>8.0f} tok/s  "
              f"(built in {built:.0f} s)", flush=True)  # fmt: skip
    del model
    release()
    model, _ = build(replace(arch, layers=0), BF16, batches, prefills)
    for step, n in points(batches, prefills):
        head[step, n] = step_us(model, step, n, replays)
    del model
    release()
    alone = ", ".join(f"{label(*k)} {us:.0f} µs" for k, us in head.items())
    print(f"  {arch.name} embedding + LM head alone: {alone}", flush=True)
    return base, head


def row(arch: Arch, fmt: str, activation: str, step: str, tokens: int, us: float, bf16_us: float, head_us: float,
        build_s: float, ctx: int = CTX) -> dict:  # fmt: skip
    """One JSON row: a step of `tokens` new tokens (decode: B sequences of one; prefill: one sequence of T) that b12x's
    model ran in `us` and the bf16 model in `bf16_us`. `batch` counts the sequences, `context` the earlier tokens
    each one's attention reads besides its new ones (decode CTX - 1, prefill none)."""
    return dict(model=arch.name, layers=arch.layers, format=fmt, activation=activation, step=step,
                batch=tokens if step == DECODE else 1, tokens=tokens, context=ctx - 1 if step == DECODE else 0,
                step_us=us, tokens_per_s=tokens / us * 1e6, bf16_step_us=bf16_us,
                bf16_tokens_per_s=tokens / bf16_us * 1e6, speedup=bf16_us / us, head_us=head_us,
                layer_us=(us - head_us) / arch.layers, bf16_layer_us=(bf16_us - head_us) / arch.layers,
                build_s=build_s)  # fmt: skip


def run(args) -> list[dict]:
    reuse_repacks()
    torch.manual_seed(0)
    batches, prefills = counts(args.batches), counts(args.prefill)
    deadline = time.monotonic() + args.budget_s
    rows = []
    for name in args.models.split(","):
        arch = ARCHS[name] if not args.layers else replace(ARCHS[name], layers=args.layers)
        print(f"## {name}, {arch.layers} layers", flush=True)
        base, head = bf16_steps(arch, batches, prefills, args.replays)
        for fmt in (args.moe_formats if arch.experts else args.formats).split(","):
            if time.monotonic() > deadline:
                print(f"  time budget of {args.budget_s:.0f} s spent: {name} {fmt} not measured", flush=True)
                continue
            try:
                model, built = build(arch, fmt, batches, prefills)
            except bc.UnsupportedError as err:
                print(f"  {name} {fmt}: {err}", flush=True)
                continue
            acts = model.activations()
            for step, n in points(batches, prefills):
                try:  # a step b12x refuses (a shape past a kernel's reach) leaves the format's other steps
                    us = step_us(model, step, n, args.replays)
                except bc.UnsupportedError as err:
                    print(f"  {name} {fmt} {label(step, n)}: {err}", flush=True)
                    continue
                rows.append(row(arch, fmt, acts, step, n, us, base[step, n], head[step, n], built))
                print(f"  {name} {fmt:<8} {label(step, n):<15} {us:>9.0f} µs {n / us * 1e6:>8.0f} tok/s "
                      f"{base[step, n] / us:>5.2f}× bf16  ({acts}; built in {built:.0f} s)", flush=True)  # fmt: skip
                save(args.out, rows)  # after every point: a run cut short keeps what it measured
            del model
            release()
    return rows


def counts(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n.strip()]


def save(path: str, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps({**device_facts(), "ctx": CTX, "rows": rows}, indent=1))


def step_of(r: dict) -> str:
    """A row's step; runs from before prefill rows existed timed decode steps only and do not name it."""
    return r.get("step", DECODE)


def table(rows: list[dict]) -> str:
    lines = ["| model | layers | format | activations | step | step µs | tok/s | bf16 µs | bf16 tok/s | vs bf16 "
             "| µs/layer | bf16 µs/layer |", "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        step = f"decode B={r['batch']}" if step_of(r) == DECODE else f"prefill T={r['tokens']}"
        lines.append(f"| {r['model']} | {r['layers']} | {r['format']} | {r['activation']} | {step} | "
                     f"{r['step_us']:.0f} | {r['tokens_per_s']:.0f} | {r['bf16_step_us']:.0f} | "
                     f"{r['bf16_tokens_per_s']:.0f} | {r['speedup']:.2f}× | {r['layer_us']:.1f} | "
                     f"{r['bf16_layer_us']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def plot(saved: dict, path: str) -> None:
    """Per model: decode tokens/s against B (log-log, a line per format and bf16's dashed); under it, where the run
    has prefill chunks, a bar per format and bf16 at each T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = saved["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    panels = [s for s in (DECODE, PREFILL) if any(step_of(r) == s for r in rows)]
    fig, axes = plt.subplots(len(panels), len(models), figsize=(6 * len(models), 4.5 * len(panels)), squeeze=False)
    for column, model in enumerate(models):
        here = [r for r in rows if r["model"] == model]
        layers = here[0]["layers"]
        for ax, step in zip(axes[:, column], panels, strict=True):
            steps = [r for r in here if step_of(r) == step]
            (plot_decode if step == DECODE else plot_prefill)(ax, steps)
            ax.set_title(f"{model}, {layers} layers, {step} step")
            ax.legend(fontsize=7)
    prefill = ", prefill: causal over the chunk, no earlier context" if PREFILL in panels else ""
    fig.suptitle(f"{saved.get('device', '?')} {saved.get('date', '')}, KV cache {saved.get('ctx', CTX)} slots{prefill}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_decode(ax, rows: list[dict]) -> None:
    from matplotlib.ticker import NullLocator

    for fmt in dict.fromkeys(r["format"] for r in rows):
        pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows if r["format"] == fmt)
        ax.plot(*zip(*pts, strict=True), marker="o", label=f"b12x {fmt}")
    ref = sorted({(r["batch"], r["bf16_tokens_per_s"]) for r in rows})
    ax.plot(*zip(*ref, strict=True), "k--", marker="s", label="bf16")
    batches = sorted({r["batch"] for r in rows})
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences, 1 new token each)", ylabel="tokens/s")
    ax.set_xticks(batches, labels=[str(b) for b in batches])
    ax.xaxis.set_minor_locator(NullLocator())  # a log axis's minor labels (6×10¹) would sit on the batches'


def plot_prefill(ax, rows: list[dict]) -> None:
    lengths = sorted({r["tokens"] for r in rows})
    bars = [("bf16", {r["tokens"]: r["bf16_tokens_per_s"] for r in rows})]  # one bf16 model per run
    bars += [(f"b12x {f}", {r["tokens"]: r["tokens_per_s"] for r in rows if r["format"] == f})
             for f in dict.fromkeys(r["format"] for r in rows)]  # fmt: skip
    width = 0.8 / len(bars)
    for i, (name, values) in enumerate(bars):
        xs = [x + i * width for x, t in enumerate(lengths) if t in values]
        ax.bar(xs, [values[t] for t in lengths if t in values], width, label=name, color="k" if i == 0 else None)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(lengths))], labels=[f"T={t}" for t in lengths])
    ax.set(xlabel="prefill chunk (one sequence)", ylabel="tokens/s")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama8b,qwen3moe")
    p.add_argument("--formats", default="NVFP4,IQ2_XS,FP8,MXFP4", help="the dense model's linear formats")
    p.add_argument("--moe-formats", default="NVFP4,IQ2_XS", help="the MoE model's (b12x_core.moe.MOE_FORMATS)")
    p.add_argument("--batches", default="1,4,16", help="decode steps: sequences, one new token each ('' for none)")
    p.add_argument("--prefill", default="", help="prefill chunks: new tokens of one sequence, e.g. 2048")
    p.add_argument("--serving", action="store_true", help="the serving workload's defaults: " + str(SERVING))
    p.add_argument("--layers", type=int, default=0, help="decoder layers to build (0: the model's own count)")
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--budget-s", type=float, default=200, help="start no new format after this many seconds")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 layers, batch 1")
    p.add_argument("--out", default="model_decode.json")
    p.add_argument("--png", default="model_decode.png")
    p.add_argument("--from-json", default="", help="no measuring: the table and plot of a saved --out file")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; --serving sets its defaults first, so a flag given beside it still wins."""
    p = parser()
    if p.parse_known_args(argv)[0].serving:
        p.set_defaults(**SERVING)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.batches = 2, "1"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
    else:
        what = ", ".join(label(*p) for p in points(counts(args.batches), counts(args.prefill)))
        print(f"# {torch.cuda.get_device_name()}: {what}; KV cache {CTX} slots", flush=True)
        started = time.monotonic()
        saved = {**device_facts(), "ctx": CTX, "rows": run(args)}
        save(args.out, saved["rows"])
        print(f"# measured in {time.monotonic() - started:.0f} s", flush=True)
    print(table(saved["rows"]))
    if args.png and saved["rows"]:
        plot(saved, args.png)


if __name__ == "__main__":
    main()
