"""How the mma.sync tensor-core GEMM (b12x_kernels.mma_gemm, csrc/mma_gemm.cuh) is configured per token count: every
rule of the family, dense and grouped, in this one module, read top to bottom. The backends ask it and nothing else:
backends/tensor_core.py (a linear: `linear_rule`) and backends/tensor_core_moe.py (a fused MoE: `moe_config`).

What a rule counts with comes from elsewhere and decides nothing: the kernel's numbers and the counts made of them
(rows per CTA, K chunks, token tiles, CTA heights, output tiles, occupancy, shared memory a block: geometry.py), the
configuration's own type (gemm.MmaConfig, as a plan row `plan_row` / `of_plan_row`), the device and the overrides
(the Query), and for the MoE the measured table (b12x_core.timings).

A linear, per token count m (linear_rule → default_config):
1. the token tile: 8, 16 or 32 tokens, the fewest tiles that cover m (token_tile), halved while its CTA does not fit
   the device's shared memory a block (fitting_token_tile);
2. the K split: even waves over the CTAs that run at once (even_split, each split charged its partials' traffic:
   split_share); at one-token tiles one wave of STREAMING_CTAS_PER_SM CTAs an SM, the CTA height (6-8 row tiles)
   and split that load the busiest SM least (balanced_config; streaming_split without the heights);
3. at one-token tiles, activations held whole in shared memory (holds_resident), and there quantized by the kernel
   for the activation modes it pairs with (quantizes_in_kernel: the plan row's "x_quant").

A fused MoE, per token count (moe_config):
1. the CTA height of both GEMMs (moe_height: 128 rows, or a short form where 128 does not fit) and the token tile,
   the table block of 8·mt slots, from the mean slots per touched expert (moe_token_tile);
2. each GEMM's K split, only where its busy output tiles fill less than SPLIT_BELOW_SMS of the SMs (even_split);
3. the routing: inside the GEMMs up to FUSED_MAX_SLOTS slots (moe_fuses), else the table's maker;
4. at 8-slot blocks, held rows where the measured MoE table has them faster (moe_holds, moe_held).

The Hopper grouped backend (tensor_core_moe_wgmma) takes moe_config with its own token tile, occupancy and routing
(the hooks `token_tile`, `occupancy`, `fuses`); the Hopper dense form's rules are tensor_core/wgmma.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from b12x_formats.quantized import codec_for

from .. import timings
from ..moe_blocks import decode_kernels, table_maker
from . import experts, geometry
from .gemm import MmaConfig
from .geometry import TILE_ROWS, chunk_k, output_tiles, token_tiles

__all__ = ["FULL_WAVES", "FUSED_MAX_SLOTS", "HELD", "RESIDENT_FORMATS", "RESIDENT_MAX_BYTES", "SPLIT_BELOW_SMS",
           "STAGED", "STREAMING_CTAS_PER_SM", "balanced_config", "default_config", "even_split", "fitting_token_tile",
           "held_rows_fit", "holds_resident", "linear_rule", "moe_config", "moe_fuses", "moe_height", "moe_held",
           "moe_holds", "moe_occupancy", "moe_token_tile", "quantizes", "quantizes_in_kernel", "split_share",
           "streaming_split", "token_tile"]  # fmt: skip


# ---- a linear ----


def linear_rule(query) -> Callable[[int], dict]:
    """A linear's configuration rule: m tokens -> the plan row's config ({"tokens", "splits"}, "rows" where a CTA is
    not 128 rows, "resident" where held, "x_quant" where the kernel quantizes the held rows), from the query alone
    (format, activation mode, N, K, the device's SMs, occupancy and shared memory a block)."""
    q = query
    chunks = -(-q.k // chunk_k(q.format))
    concurrent_ctas = {mt: geometry.concurrent_ctas(q, q.format, mt) for mt in geometry.TOKEN_TILES}
    limit = geometry.smem_limit(q)  # every CTA within the device's shared memory a block

    def config_of(m: int) -> dict:
        mt = fitting_token_tile(m, q.format, limit)
        c = default_config(m, q.n, chunks, concurrent_ctas[mt], sms=q.device.sms, share=split_share(q.format, m, q.k),
                           fmt=q.format, act_mode=q.act_mode, smem_limit=limit)  # fmt: skip
        in_kernel = quantizes_in_kernel(q.format, q.act_mode, c)
        return {**c.plan_row(), **({"x_quant": q.act_mode} if in_kernel else {})}

    return config_of


def default_config(m: int, n: int, chunks: int, concurrent_ctas: int, max_splits: int = 16, rt: int = 1,
                   sms: int = 0, share: float = 0.0, balance: bool = True, fmt: str = "",
                   act_mode: str = "bf16", smem_limit: int = 0) -> MmaConfig:  # fmt: skip
    """The token tile that covers M in the fewest tiles, and the K split that fills the GPU: its `concurrent_ctas` (SMs
    × CTAs per SM) in even waves (even_split, weighing each split's partials by `share`: split_share), or at one-token
    tiles, given the SMs, one wave of STREAMING_CTAS_PER_SM CTAs an SM: the CTA height and split that load the busiest
    SM least (balanced_config; every format measured faster with it) or, with `balance` False, 128-row CTAs split as
    far as the wave allows (streaming_split: what `mma_linear.py --balance-ab` times beside it). Given the format,
    one-token tiles hold their activations whole where the rule measured for it and `act_mode` allows
    (holds_resident). Given the format and the device's shared memory a block (`smem_limit`, bytes), every CTA fits
    it: smaller token tiles (fitting_token_tile) or shorter one-token CTAs (geometry.fitting_heights) where the
    usual ones would not launch (SM12x's 99 KB); `concurrent_ctas` must then be the chosen token tile's."""
    mt = fitting_token_tile(m, fmt, smem_limit)
    # no height fits: the backends' can_implement refuse the format first (geometry.smem_reason)
    heights = geometry.fitting_heights(fmt, smem_limit) or geometry.CTA_HEIGHTS
    height = heights[0] if mt == 1 else geometry.FULL_HEIGHT
    if height != geometry.FULL_HEIGHT:
        rt = 1  # shorter CTAs are one row tile a warp
    tiles = output_tiles(token_tiles(m, mt), n, TILE_ROWS * height)
    if m <= 8 and sms and rt == 1 and balance:  # one token tile: the one-token rules, measured there
        config = balanced_config(m, n, chunks, sms, max_splits, heights)
    elif m <= 8 and sms:
        config = MmaConfig(mt, streaming_split(tiles, chunks, sms, max_splits), rt, height)
    else:
        return MmaConfig(mt, even_split(tiles, chunks, concurrent_ctas, max_splits, share), rt, height)
    if holds_resident(fmt, m, chunks, config, act_mode, smem_limit):
        config = replace(config, resident=True)
    return config


def token_tile(m: int) -> int:
    """mt of the token tile (8·mt tokens) that covers m tokens in the fewest tiles: 8, 16, then 32 per tile."""
    return 1 if m <= 8 else 2 if m <= 16 else 4


def fitting_token_tile(m: int, fmt: str, limit: int) -> int:
    """token_tile(m), halved while its 128-row CTA does not fit `limit` (SM12x's 99 KB: FP4 at 32-token tiles, IQ2 at
    16): more token tiles of the kernel that runs, rather than one that cannot launch."""
    mt = token_tile(m)
    while mt > 1 and not geometry.fits(fmt, mt, geometry.FULL_HEIGHT, limit):
        mt //= 2
    return mt


# At one-token tiles (mt = 1) each CTA streams its weights latency-bound, so two CTAs an SM read as fast as the
# kernel's full occupancy (3-4) does, and each further K split only adds partials to write and sum: on the 8B
# linears at 1 and 4 tokens the best splits filled about two CTAs an SM, faster than filling the occupancy.
# `python benchmarks/mma_linear.py --model 8b --ms 1,4 --sweep` times every split beside the default.
STREAMING_CTAS_PER_SM = 2


def balanced_config(m: int, n: int, chunks: int, sms: int, max_splits: int = 16,
                    heights: tuple[int, ...] = geometry.CTA_HEIGHTS) -> MmaConfig:  # fmt: skip
    """At one-token tiles, the CTA height (6, 7 or 8 row tiles) and K split that give the busiest SM the least work
    when one wave of STREAMING_CTAS_PER_SM CTAs an SM holds every CTA — row tiles × chunks on the SM with the most
    CTAs. 8B gate_up (1792 row tiles, 32 chunks, 132 SMs): 224 CTAs of 8 put 2 × 8 × 32 on the busiest SM, 256
    CTAs of 7 put 2 × 7 × 32. Every format ran faster so than with streaming_split's 128-row CTAs on the 8B and 70B
    layers at one and four tokens (`python benchmarks/mma_linear.py --ms 1,4 --balance-ab` re-measures it).
    `heights`: the CTA heights that fit the device (geometry.fitting_heights)."""
    mt = token_tile(m)
    if mt != 1:
        return MmaConfig(mt, 1)
    n16 = -(-n // 16)
    best = None
    for tiles in heights:
        blocks = -(-n16 // tiles)
        for splits in range(1, max(1, min(max_splits, chunks // 4)) + 1):
            ctas = blocks * splits
            if splits > 1 and ctas > STREAMING_CTAS_PER_SM * sms:
                break
            work = -(-ctas // sms) * tiles * -(-chunks // splits)
            key = (work, -(ctas // sms), -tiles)  # ties: more CTAs an SM (warps hide the decode's latencies)
            if best is None or key < best[0]:
                best = (key, MmaConfig(mt, splits, 1, tiles))
    return best[1]


def streaming_split(tiles: int, chunks: int, sms: int, max_splits: int = 16) -> int:
    """The most K splits whose CTAs (`tiles` output tiles × splits) still fit one wave of STREAMING_CTAS_PER_SM
    CTAs an SM, each split keeping at least 4 chunks; 1 where the tiles alone fill it."""
    return max(1, min(max_splits, chunks // 4, STREAMING_CTAS_PER_SM * sms // tiles))


FULL_WAVES = 4  # from this many waves of CTAs on, K is not split


def even_split(tiles: int, chunks: int, concurrent_ctas: int, max_splits: int = 16, share: float = 0.0) -> int:
    """The K split whose CTAs (`tiles` output tiles × splits) fill the GPU's `concurrent_ctas` (SMs × CTAs per SM) in
    the most even waves: a last partial wave leaves SMs idle while it runs. Each split keeps at least 4 chunks;
    more splits cost a little (partials written and summed), so ties take fewer, and a split costs its partials'
    traffic as a share of the weight's (`share`, split_share: nothing at one token, half the weight's bytes a
    split at 128 tokens of a 4-bit linear); from FULL_WAVES waves on the tail is small and the partials' traffic
    (growing with the tokens) is not, so K stays whole. Costs are in units of the time of one even wave-filling pass
    over the weight. The Hopper form's rules (tensor_core/wgmma.py) split K by it too."""
    if tiles >= FULL_WAVES * concurrent_ctas:
        return 1

    def cost(splits: int) -> float:
        waves = tiles * splits / concurrent_ctas
        return -(-waves // 1) / waves + 0.01 * splits + (share * splits if splits > 1 else 0.0)

    candidates = range(1, max(1, min(max_splits, chunks // 4)) + 1)
    return min(candidates, key=cost)


def split_share(fmt: str, m: int, k: int) -> float:
    """What one more K split costs beside the weights: its fp32 partials of m rows (written, then read back by the
    reduction, 8 bytes an output) over the weight's bytes (K × bits per weight / 8 a row): independent of N; grows
    with the tokens: 0.44 at 128 tokens of a 4096-wide 4.5-bit linear, where four splits' partials cost a quarter of
    gate_up's time (`python benchmarks/mma_linear.py --model 8b --ms 128 --sweep` times each split)."""
    return 8.0 * m / (k * codec_for(fmt).spec.bits_per_weight / 8)


# Resident activations (MmaConfig.resident): dead token rows read row 0 instead of a per-group select, and no CTA
# barrier a stage. At one token every format's linears ran as fast or faster resident than staged. At 2-8 tokens the
# gain shrinks and turns with the CTAs an SM holds, so only FP8 and MXFP8, whose decode is the lightest, keep them
# past one token. A quantized activation mode the kernel quantizes where it holds the rows (MMA.x_quant_formats) saves
# the operand pass only when held, so its pairs hold them at 2-8 tokens too. Held rows stay within what was measured:
# 4 tokens over a 4096-wide K, 32 KB. Re-measured by `python benchmarks/mma_linear.py --model 8b --per-linear
# --resident-ab` (staged against resident) and `--x-quant-ab` (operand pass against in-kernel quantization).
RESIDENT_FORMATS = frozenset({"FP8", "MXFP8"})  # resident at 2-8 tokens too
RESIDENT_MAX_BYTES = 4 * 4096 * 2


def holds_resident(fmt: str, m: int, chunks: int, config: MmaConfig, act_mode: str = "bf16",
                   smem_limit: int = 0) -> bool:  # fmt: skip
    """Whether a dense call of `m` tokens under `config` holds its activations whole: a one-token tile of one row
    tile a warp, at one token for every format and at up to 8 for RESIDENT_FORMATS and for the pairs the kernel
    quantizes (`act_mode` in MMA.x_quant_formats), its live rows over the split's K within RESIDENT_MAX_BYTES of bf16,
    and its CTA within the device's shared memory a block (`smem_limit` bytes; 0: not checked)."""
    past_one = fmt in RESIDENT_FORMATS or quantizes(fmt, act_mode)
    if not fmt or config.mt != 1 or config.rt != 1 or (m > 1 and not past_one):
        return False
    per_split = -(-chunks // config.splits)
    return held_rows_fit(fmt, m, chunks, config.splits) and geometry.fits(fmt, 1, config.tiles, smem_limit, min(m, 8),
                                                                          per_split)  # fmt: skip


def held_rows_fit(fmt: str, rows: int, chunks: int, splits: int) -> bool:
    """Whether a tile's held rows (`rows`, at most 8 a tile: tokens, or a block's slots) over one of `splits` K splits
    of `chunks` chunks stay within RESIDENT_MAX_BYTES of bf16 (the bytes measured)."""
    split_k = -(-chunks // splits) * chunk_k(fmt)
    return min(rows, 8) * split_k * 2 <= RESIDENT_MAX_BYTES


def quantizes(fmt: str, act_mode: str) -> bool:
    """Whether `fmt`'s resident kernel quantizes `act_mode` activations itself (MMA.x_quant_formats)."""
    return fmt in geometry.MMA.x_quant_formats.get(act_mode, ())


# Every pair the kernels quantize (MMA.x_quant_formats) does it where the rows are held, instead of a separate
# operand pass (b12x_kernels.act_quant, one launch a linear): on every 8B and 70B linear at one and four tokens the
# kernel's own quantization ran as fast or faster (`python benchmarks/mma_linear.py --per-linear --x-quant-ab`
# re-measures it, the same configurations both ways).
def quantizes_in_kernel(fmt: str, act_mode: str, config: MmaConfig) -> bool:
    """Whether a call under `config` quantizes its activations inside the kernel instead of an operand pass first:
    resident configurations of the pairs the kernels quantize (MMA.x_quant_formats)."""
    return config.resident and quantizes(fmt, act_mode)


# ---- a fused MoE: the grouped form over the expert-sorted block table ----

# A GEMM splits K only where its busy output tiles fill less than this share of the SMs: with 92-180 busy tiles on
# 132 SMs (Qwen3-30B-A3B- and gpt-oss-like layers, 1-16 tokens) K whole was the fastest or within 1% of it at every
# point, and the even-wave splits cost up to 14%: the block table's experts already spread the GEMM over the SMs,
# and each split adds partial sums and their reduction. `python benchmarks/moe_splits.py` times every split pair.
SPLIT_BELOW_SMS = 0.5


def moe_config(query, tokens: int, *, token_tile=None, occupancy=None, fuses=None) -> dict:
    """A fused MoE call of `tokens` tokens: the token tile (config "tokens": 8·mt slots per table block), both GEMMs'
    K splits ("splits": gate/up, down), the routing ("route": "gemm" inside the GEMMs, else the table's maker), the
    CTA's rows where not 128 ("rows"), and at 8-slot blocks the held rows ("held", "x_quant"). The hooks default to
    this family's rules (moe_token_tile, moe_occupancy, moe_fuses); the Hopper grouped backend passes its own."""
    token_tile = token_tile or moe_token_tile
    occupancy = occupancy or moe_occupancy
    fuses = fuses or moe_fuses
    shape = query.moe
    slots = tokens * shape.top_k
    touched = min(slots, shape.experts)
    per_expert = -(-slots // touched)
    height = moe_height(query)
    mt = token_tile(query, per_expert) if height == geometry.FULL_HEIGHT else 1  # short CTAs: 8-slot blocks
    rows = TILE_ROWS * height
    busy_blocks = touched * token_tiles(per_expert, mt)  # routing spread evenly: what a call can expect
    splits = []
    for fmt, n, k in ((query.format, experts.rows13(shape), shape.hidden),
                      (shape.w2_format, shape.hidden, shape.intermediate)):  # fmt: skip
        tiles = output_tiles(busy_blocks, n, rows)
        chunks = -(-k // chunk_k(fmt))
        few = tiles < query.device.sms * SPLIT_BELOW_SMS
        splits.append(even_split(tiles, chunks, occupancy(query, fmt, mt, height)) if few else 1)
    route = "gemm" if fuses(query, slots) else table_maker(slots, decode_kernels())
    config = {"tokens": 8 * mt, "splits": tuple(splits), "route": route}
    if height != geometry.FULL_HEIGHT:
        config["rows"] = rows
    if mt == 1 and moe_holds(query, tokens):
        config.update(moe_held(query, slots, splits, height))
    return config


def moe_height(query) -> int:
    """Row tiles a CTA of both GEMMs: 8 (128 rows) where that fits the device's shared memory a block at one-token
    tiles, else (Overrides.short_ctas) the tallest short form that does; can_implement refuses the rest."""
    limit = geometry.smem_limit(query)
    down = geometry.fitting_heights(query.moe.w2_format, limit)
    heights = [h for h in geometry.fitting_heights(query.format, limit) if h in down]
    short = query.overrides.short_ctas
    return heights[0] if heights and (short or heights[0] == geometry.FULL_HEIGHT) else geometry.FULL_HEIGHT


def moe_token_tile(query, per_expert: int) -> int:
    """The token tile mt (8·mt slots a table block) for `per_expert` slots an expert, both GEMMs' CTAs within the
    device's shared memory a block."""
    limit = geometry.smem_limit(query)
    return min(fitting_token_tile(per_expert, fmt, limit) for fmt in (query.format, query.moe.w2_format))


def moe_occupancy(query, fmt: str, mt: int, height: int) -> int:
    """CTAs of one GEMM (format, token tile, `height` row tiles a CTA) that run at once: what a K split fills."""
    return geometry.concurrent_ctas(query, fmt, mt, height)


# The routing table and the combine inside the GEMMs up to this many token slots: each CTA then ranks the slots
# itself and one CTA an output tile sums its tokens, work that grows with the slots while the two launches it saves
# do not: faster at 4-32 slots (one and four tokens), slower at 64 and 128 (16 tokens of the gpt-oss- and Qwen3-like
# layers). `python benchmarks/moe.py --ts 1,4,16 --backends tensor_core_moe,tensor_core_moe@unfused` re-measures it.
FUSED_MAX_SLOTS = 32


def moe_fuses(query, slots: int) -> bool:
    """Whether a call of `slots` token slots routes in its GEMMs and combines in the down GEMM (config "route":
    "gemm"): Overrides.fuses where set, else up to FUSED_MAX_SLOTS; never past the kernel's routing limits."""
    fits = slots <= geometry.MMA.route_max_slots and query.moe.experts <= geometry.MMA.route_max_experts
    forced = query.overrides.fuses
    wanted = forced if forced is not None else slots <= FUSED_MAX_SLOTS and decode_kernels()
    return fits and wanted


# The MoE table's names for the backend's times with its rows staged and held at 8-slot blocks (moe_held's "held" and
# "x_quant"; `python benchmarks/moe.py --backends tensor_core_moe,tensor_core_moe+held` measures both). Held rows are
# mixed, faster where they save the quantize passes (MXFP4 x mxfp8), slower with bf16 activations (IQ2_XS), so a
# token count holds them only where its table entry has them faster.
STAGED = "tensor_core_moe"
HELD = "tensor_core_moe+held"


def moe_holds(query, tokens: int) -> bool:
    """Whether calls of `tokens` tokens hold their rows: Overrides.holds_rows where set, else where the measured MoE
    table has HELD faster than STAGED at that count (interpolated as the plans read it)."""
    if query.overrides.holds_rows is not None:
        return query.overrides.holds_rows
    found = timings.lookup(query.device.capability, query.format, query.act_mode, query.n, query.k, op="moe",
                           device=query.device.name)  # fmt: skip
    if found is None:
        return False
    entry = found[0]
    held, staged = entry.time(HELD, tokens)[0], entry.time(STAGED, tokens)[0]
    return held is not None and staged is not None and held < staged


def moe_held(query, slots: int, splits: list[int], height: int) -> dict:
    """Per GEMM (gate/up, down): whether its 8-slot blocks hold their rows over the split's K (the dense rule's bytes,
    RESIDENT_MAX_BYTES), and the activation mode the kernel then quantizes them to ("none": bf16, or the operand pass
    where the format has no in-kernel form for it)."""
    shape = query.moe
    held, modes = [], []
    limit = geometry.smem_limit(query)
    for fmt, k, splits_k, mode in ((query.format, shape.hidden, splits[0], query.act_mode),
                                   (shape.w2_format, shape.intermediate, splits[1], shape.act_mode_2)):  # fmt: skip
        chunks = -(-k // chunk_k(fmt))
        per_split = -(-chunks // splits_k)
        holds = held_rows_fit(fmt, slots, chunks, splits_k) and geometry.fits(fmt, 1, height, limit, min(slots, 8),
                                                                              per_split)  # fmt: skip
        held.append(holds)
        modes.append(mode if holds and quantizes(fmt, mode) else "none")
    return {"held": tuple(held), "x_quant": tuple(modes)}
