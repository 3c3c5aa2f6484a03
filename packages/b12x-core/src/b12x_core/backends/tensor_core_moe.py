"""The fused MoE on the tensor-core GEMM (b12x_kernels.mma_gemm, grouped; csrc/mma_gemm.cuh): the linear path's
repacked layouts and decode functors driven by the expert-sorted block table (b12x_core.moe_blocks), one launch
per GEMM over every touched expert.

- gate/up GEMM: token tile = one table block of 8·mt slots of one expert, input rows gathered (slot // top_k);
  gated SiLU's gate and up rows are interleaved at prepare time (tensor_core.experts) so the epilogue writes
  silu(gate)·up, ReLU² likewise; K split for decode-sized calls with the in-order ticket reduction.
- down GEMM: each K split writes its float32 slot rows; the combine (b12x_kernels.tiles.moe_combine) sums splits
  and each token's top-k rows in order: deterministic, no atomics on data.
- The intermediate's mxfp8 / nvfp4 quantization runs between them (b12x_kernels.act_quant), as the Triton path.
- Fused (decode-sized calls, up to configure.FUSED_MAX_SLOTS slots): no table launch and no combine launch. Each CTA
  of both GEMMs finds its block of the table from the ids (the same blocks), and the down GEMM's last CTA of each
  output tile combines its columns (a ticket each). With held rows that quantize in the kernel a call is two launches.
- Held rows: at 8-slot blocks each GEMM can hold its block's gathered rows over its split's K in shared memory (the
  dense path's resident form), and then quantizes them there for the modes its format pairs with
  (MMA.x_quant_formats), with no operand pass. A token count holds them where the measured MoE table has this
  backend faster so (its configure.HELD times, benchmarks/moe.py) than staged; unmeasured, it stages them.

- Short CTAs: where a format's 128-row CTA does not fit the device's shared memory a block (SM12x's 99 KB and
  IQ2_XS's 40 KB of grid and sign tables), both GEMMs run 112- or 96-row CTAs at 8-slot blocks (config "rows")
  instead of leaving the layer to the Triton MoE; tests/kernels/test_mma_moe.py holds them to the reference, planned
  as an SM12x on an SM90 GPU. SM90's 227 KB fits every 128-row CTA, so its plans never take them.
  (`Overrides.short_ctas` off: the 128-row CTAs only.)

TensorCoreMoEWgmma (`tensor_core_moe_wgmma`) runs the same call on the Hopper grouped GEMM (below).

Configuration per token count (tensor_core.configure.moe_config, the family's rules in one module): the token tile
from the mean slots per expert; each GEMM's K whole unless its expected busy output tiles fill less than half the SMs
(then split for even waves over SMs × CTAs per SM); the routing ("route"): "gemm" (fused, above) up to
configure.FUSED_MAX_SLOTS slots, else the table's maker as the Triton path's; held rows at 8-slot blocks.
"""

from __future__ import annotations

import torch

from .. import workspace
from ..moe_blocks import block_table, max_blocks
from ..tensor_core import configure, experts, gemm, geometry, layout, wgmma
from . import operands
from .base import Backend, config_ranges, cuda_reason

MODES = geometry.MMA.grouped_act_modes


class TensorCoreMoE(Backend):
    name, op = "tensor_core_moe", "moe"
    reads = ("mma",)  # its own expert stack (tensor_core.experts), not the checkpoint layout the Triton MoE reads
    tickets_needed = 1

    @classmethod
    def can_implement(cls, q):
        shape = q.moe
        for fmt in (q.format, shape.w2_format):
            if fmt not in layout.FORMATS:
                return False, f"has no layout for {fmt}"
        for mode in (q.act_mode, shape.act_mode_2):
            if mode not in MODES:
                return False, f"needs bf16-exact activations ({', '.join(MODES)}), not {mode}"
        for what, rows in (("w13", experts.rows13(shape)), ("w2", shape.hidden)):
            if rows % 16:
                return False, f"stacks experts in 16-row tiles: {what} needs rows per expert % 16 == 0, has {rows}"
        if shape.hidden % 8 or shape.intermediate % 8:
            return False, "stages activations in 16-byte pieces: needs H % 8 == 0 and I % 8 == 0"
        why = cuda_reason(q, triton=True)
        shortest = min(geometry.CTA_HEIGHTS) if q.overrides.short_ctas else geometry.FULL_HEIGHT
        for fmt in (q.format, shape.w2_format):  # SM12x's 99 KB: IQ2_XS's 128-row grouped CTA does not fit
            why = why or geometry.smem_reason(q, fmt, shortest)
        if why:
            return False, why
        return True, "tensor-core grouped GEMMs over expert-sorted slots (weights decoded into bf16 MMA fragments)"

    def __init__(self, query, weights):
        super().__init__(query, weights)
        self.tickets_needed = 1  # gate/up split-K tickets of the largest call its plan rows make (reserve)
        shape = query.moe
        w13, w2 = weights
        order = None
        if shape.activation == "silu":
            order = experts.interleave_gate_up(shape.intermediate, gate_first=shape.w13_order == "gate_up")
        # the stacks live with the weights: every tensor-core MoE backend of the plan reads the same copy
        self.w13, self.w2 = experts.of(w13, order), experts.of(w2)
        self.input_scales = (w13.input_scale, w2.input_scale)

    @classmethod
    def call_config(cls, query, tokens: int) -> dict:
        """The configuration of a call of `tokens` tokens (tensor_core.configure.moe_config) under this class's
        hooks: its token tile, its GEMMs' occupancy, whether it routes in the GEMMs."""
        return configure.moe_config(query, tokens, token_tile=cls._token_tile, occupancy=cls._occupancy,
                                    fuses=cls._fuses)  # fmt: skip

    # The hooks the Hopper grouped backend (TensorCoreMoEWgmma) overrides: the mma.sync kernel's rules here.
    _token_tile = staticmethod(configure.moe_token_tile)
    _occupancy = staticmethod(configure.moe_occupancy)
    _fuses = staticmethod(configure.moe_fuses)

    @classmethod
    def configs(cls, query, lo, hi, layout=None):
        return config_ranges(lo, hi, lambda t: cls.call_config(query, t))

    @staticmethod
    def table_blocks(query, tokens: int, config: dict) -> int:
        """Entries of the block table a call of `tokens` tokens launches over (the most any routing needs)."""
        return max_blocks(tokens * query.moe.top_k, query.moe.experts, config["tokens"])

    @classmethod
    def tickets(cls, query, rows) -> int:
        """Tickets the largest call of these plan rows takes: gate/up split K one per (table block, CTA's rows) of
        a split call; the fused combine one per CTA's rows of the down GEMM (the GEMMs run one after the other,
        each leaving its tickets zero)."""

        def tiles(blocks: int, n: int, config: dict) -> int:
            return geometry.output_tiles(blocks, n, config.get("rows", geometry.ROWS_PER_CTA))

        rows13 = experts.rows13(query.moe)
        split = [tiles(cls.table_blocks(query, last, c), rows13, c) for _, last, c in rows if c["splits"][0] > 1]
        combine = [tiles(1, query.moe.hidden, c) for _, _, c in rows if c["route"] == "gemm"]
        return max([1, *split, *combine])

    def reserve(self, rows):
        self.tickets_needed = self.tickets(self.query, rows)
        workspace.reserve_tickets(self.query.device.device, self.tickets_needed)

    def _specs(self, tokens: int, config: dict) -> list:
        """Scratch: quantized x; gate/up split sums (float32); the intermediate and its quantized copy; the
        down GEMM's float32 slot rows per split (the combine's input)."""
        shape = self.query.moe
        slots = tokens * shape.top_k
        s13, s2 = config["splits"]
        xq2 = config.get("x_quant", ("none", "none"))[1]  # quantized in the kernel: no operand buffer
        x_specs = self._x_specs(tokens, config)
        partial13 = [((s13, slots, experts.rows13(shape)), torch.float32)] if s13 > 1 else []
        inter = [((slots, shape.intermediate), torch.bfloat16)]
        inter_specs = operands.bf16_specs(shape.act_mode_2, slots, shape.intermediate) if xq2 == "none" else []
        out = [((s2, slots, shape.hidden), torch.float32)]
        return x_specs + partial13 + inter + inter_specs + out + self._launch_specs(tokens, config)

    def _launch_specs(self, tokens: int, config: dict) -> list:
        """Scratch the GEMM launches themselves take: none (the mma.sync kernels read their operands in place)."""
        return []

    def _launch(self, args: bytes, a, y, slots: int, ws, stream: int, scratch: list, **grouped) -> None:
        """One grouped GEMM launch (gemm.launch's arguments; `scratch`: the tensors of _launch_specs)."""
        gemm.launch(args, a, y, slots, ws, stream, **grouped)

    def _x_specs(self, tokens: int, config: dict) -> list:
        """The gate/up input's operand pass buffers, none where the kernel quantizes x itself (x_quant)."""
        if config.get("x_quant", ("none", "none"))[0] != "none":
            return []
        return operands.bf16_specs(self.query.act_mode, tokens, self.query.moe.hidden)

    def scratch_bytes(self, tokens, config):
        return workspace.nbytes(self._specs(tokens, config))

    def _args(self, mt: int, s13: int, s2: int, top_k: int, config: dict) -> tuple[bytes, bytes]:
        """Both GEMMs' kernel argument blocks: gate/up with the activation fused and its input gathered per
        slot, down writing float32 slot rows per split for the combine; rows held and quantized where the
        configuration says (call_config's "held", "x_quant")."""
        shape = self.query.moe
        held13, held2 = config.get("held", (False, False))
        xq13, xq2 = config.get("x_quant", ("none", "none"))
        s_in13, s_in2 = self.input_scales
        tiles = config.get("rows", geometry.ROWS_PER_CTA) // geometry.TILE_ROWS
        w13 = self.w13.shard.args(gemm.MmaConfig(mt, s13, tiles=tiles, resident=held13), shape.intermediate,
                                  shape.activation, self.w13.row_scale, top_k, xq13,
                                  operands.in_kernel_scale(xq13, s_in13))  # fmt: skip
        w2 = self.w2.shard.args(gemm.MmaConfig(mt, s2, tiles=tiles, resident=held2), 0, "f32", self.w2.row_scale,
                                x_quant=xq2, x_quant_scale=operands.in_kernel_scale(xq2, s_in2))  # fmt: skip
        return w13, w2

    def run(self, x, topk_weights, topk_ids, *, config):
        from ..kernels import tiles

        q, shape = self.query, self.query.moe
        t, k = topk_ids.shape
        slots = t * k
        s13, s2 = config["splits"]
        mt = config["tokens"] // 8
        fused = config["route"] == "gemm"
        if fused:  # each GEMM's CTAs find their table blocks from the ids
            grouped = dict(routed=(topk_ids.to(torch.int32).reshape(-1).contiguous(), shape.experts,
                                   self.table_blocks(q, t, config)))  # fmt: skip
        else:
            grouped = dict(table=block_table(topk_ids, shape.experts, config["tokens"], config["route"]))
        carved = workspace.carve(x.device, self._specs(t, config))
        n_launch = len(self._launch_specs(t, config))
        carved, scratch = carved[: len(carved) - n_launch], carved[len(carved) - n_launch :]
        xq13, xq2 = config.get("x_quant", ("none", "none"))
        n_x = len(self._x_specs(t, config))
        x_buffers, carved = carved[:n_x], carved[n_x:]
        partial13 = carved.pop(0) if s13 > 1 else None
        inter, *inter_buffers, out = carved
        stream = torch.cuda.current_stream(x.device).cuda_stream
        tickets = workspace.tickets(x.device, self.tickets_needed)
        s_in13, s_in2 = self.input_scales
        args13, args2 = self._args(mt, s13, s2, k, config)

        x_in = x if xq13 != "none" else operands.bf16_operands(x.contiguous(), q.act_mode, s_in13, x_buffers or None)[0]
        ws13 = gemm.MmaWorkspace(tickets.view(torch.float32) if partial13 is None else partial13, tickets)
        self._launch(args13, x_in.contiguous(), inter, slots, ws13, stream, scratch, **grouped)
        inter_in = inter
        if xq2 == "none":
            inter_in, _ = operands.bf16_operands(inter, shape.act_mode_2, s_in2, inter_buffers or None)
        y = torch.empty(t, shape.hidden, dtype=torch.bfloat16, device=x.device)
        weights = topk_weights.to(torch.float32).contiguous()
        ws2 = gemm.MmaWorkspace(out, tickets)
        if fused:  # the down GEMM combines its slot rows into y
            self._launch(args2, inter_in.contiguous(), y, slots, ws2, stream, scratch, combine_w=weights, **grouped)
            return y
        self._launch(args2, inter_in.contiguous(), None, slots, ws2, stream, scratch, **grouped)
        return tiles.moe_combine(out, weights, y)


class TensorCoreMoEWgmma(TensorCoreMoE):
    """The fused MoE on the Hopper form of the tensor-core GEMM (b12x_kernels.wgmma_gemm, grouped;
    csrc/wgmma_gemm.cu), the grouped warpgroup GEMM for prefill-sized calls: the same expert stacks (one
    copy: experts.of), block table, epilogues and combine as TensorCoreMoE, each table block's 32-128 slots one
    expert's as the warpgroup MMA's N, the weights decoded in registers as its A operand. Each GEMM stages its
    activations in the MMA's operand order first (wgmma.staged_bytes), so it is two launches.

    IQ2, whose per-chunk factor (d) takes a second accumulator set, runs 32- and 64-slot blocks. It leaves
    TensorCoreMoE the decode-sized forms (routing and combine inside the GEMMs, held rows). Compute capability 9.0
    only. Last among the MoE backends and never a default: a plan picks it only at the token counts where the
    measured MoE table (benchmarks/moe.py) has it faster."""

    name = "tensor_core_moe_wgmma"

    @classmethod
    def can_implement(cls, q):
        ok, why = super().can_implement(q)
        if not ok:
            return ok, why
        for fmt in (q.format, q.moe.w2_format):
            if fmt not in wgmma.GROUPED_FORMATS:
                return False, f"its grouped form decodes {', '.join(wgmma.GROUPED_FORMATS)}, not {fmt}"
        if q.device.capability != wgmma.CAPABILITY:
            return False, f"wgmma is an sm_90a instruction: needs compute capability 9.0, this is {q.device.arch}"
        return True, "Hopper grouped GEMMs over expert-sorted slots (weights decoded as the warpgroup MMA's operand)"

    @staticmethod
    def _token_tile(query, per_expert: int) -> int:
        return min(wgmma.grouped_token_tile(per_expert, fmt) for fmt in (query.format, query.moe.w2_format))

    @staticmethod
    def _occupancy(query, fmt: str, mt: int, height: int) -> int:  # the wgmma kernel's CTAs are 128 rows high
        return wgmma.concurrent_ctas(fmt, mt, query.device.sms, measured=geometry.kernels_run(query))

    @staticmethod
    def _fuses(query, slots: int) -> bool:
        return False  # the grouped wgmma kernel reads the block table (MmaCall::ids is the mma.sync kernel's)

    def _launch_specs(self, tokens: int, config: dict) -> list:
        """The activation staging both GEMMs share (one after the other on the stream): the table's blocks × the
        block's slots, over the larger K."""
        shape = self.query.moe
        rows = self.table_blocks(self.query, tokens, config) * config["tokens"]
        nbytes = max(wgmma.staged_bytes(self.query.format, rows, shape.hidden),
                     wgmma.staged_bytes(shape.w2_format, rows, shape.intermediate))  # fmt: skip
        return [((nbytes,), torch.uint8)]

    def _launch(self, args: bytes, a, y, slots: int, ws, stream: int, scratch: list, **grouped) -> None:
        (staged,) = scratch
        wgmma.launch(args, a, y, slots, ws, staged, stream, table=grouped["table"])
