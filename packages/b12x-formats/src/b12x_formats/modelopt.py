"""ModelOpt quantization configs: `layer_entry` writes a `quantized_layers` entry, `parse_quantization_config`
reads `config.json`'s `quantization_config` or a whole `hf_quant_config.json` and resolves module prefixes.

Mixed precision (`quant_algo: "MIXED_PRECISION"`) lists every quantized module under `quantized_layers`;
single-format configs name one `quant_algo` for all linear layers except `exclude_modules` / `ignore`.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from .quantized import codec_for

MIXED = "MIXED_PRECISION"
ENTRY_KEYS = ("quant_algo", "group_size", "block_payload_bytes", "packing")

# vLLM fuses these checkpoint modules into one layer; every shard must share one format.
FUSED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
# Expert projections of a fused-MoE layer `...mlp.experts`: w13 = gate and up, w2 = down.
MOE_PROJECTIONS = {"w13": ("gate_proj", "up_proj"), "w2": ("down_proj",)}

_LN = re.compile(r"ln(_\w+|\d*)")  # GPT-2 style ln_1, ln_f


def is_norm_module(prefix: str) -> bool:
    """Normalisation layers (input_layernorm, q_norm, model.norm, ln_f, ...) stay floating point."""
    leaf = prefix.rsplit(".", 1)[-1]
    return "norm" in leaf.lower() or bool(_LN.fullmatch(leaf))


def layer_entry(fmt: str) -> dict:
    """The `quantized_layers` entry of a format: exactly quant_algo, group_size, block_payload_bytes, packing
    (the last two are None for formats that are not raw GGML blocks)."""
    spec = codec_for(fmt).spec
    ggml = spec.packing == "ggml"
    return {
        "quant_algo": spec.quant_algo,
        "group_size": spec.group_size,
        "block_payload_bytes": spec.block_bytes if ggml else None,
        "packing": spec.packing,
    }


def validate_entry(prefix: str, entry: dict) -> str:
    """Check one `quantized_layers` entry against the format's facts; returns the canonical format name."""
    where = f"quantized_layers[{prefix!r}]"
    if not isinstance(entry, dict) or "quant_algo" not in entry:
        raise ValueError(f"{where}: expected a dict with 'quant_algo', got {entry!r}")
    try:
        spec = codec_for(entry["quant_algo"]).spec
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    unknown = sorted(set(entry) - set(ENTRY_KEYS) - {"kv_cache_quant_algo", "awq_block_size"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; entries hold {list(ENTRY_KEYS)}")
    group = entry.get("group_size")
    if group is not None and group != spec.group_size:
        raise ValueError(f"{where}: group_size {group} is wrong for {spec.name}; {spec.name} uses {spec.group_size}")
    if spec.packing == "ggml":
        if entry.get("packing") != "ggml":
            raise ValueError(
                f"{where}: {spec.name} stores raw GGML blocks and needs packing: 'ggml', got {entry.get('packing')!r}"
            )
        if group is None:
            raise ValueError(f"{where}: {spec.name} needs group_size {spec.group_size}")
        payload = entry.get("block_payload_bytes")
        if payload != spec.block_bytes:
            raise ValueError(
                f"{where}: block_payload_bytes {payload} is wrong for {spec.name}; each block of "
                f"{spec.group_size} weights is {spec.block_bytes} bytes"
            )
    else:
        if entry.get("packing") not in (None,):
            raise ValueError(
                f"{where}: packing {entry['packing']!r} applies only to GGML block formats, not {spec.name}"
            )
        if entry.get("block_payload_bytes") is not None:
            raise ValueError(f"{where}: block_payload_bytes applies only to GGML block formats, not {spec.name}")
    return spec.name


@dataclass
class QuantizationConfig:
    """A parsed ModelOpt config. `layers` maps module prefixes to canonical format names (mixed precision);
    `default` is the single format of a non-mixed config, applied to linear layers not in `exclude`."""

    layers: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    exclude: list[str] = field(default_factory=list)
    producer: dict | None = None
    kv_cache_quant_algo: str | None = None

    @property
    def is_mixed(self) -> bool:
        return self.default is None

    @property
    def formats(self) -> set[str]:
        return set(self.layers.values()) | ({self.default} if self.default else set())

    def format_for(self, prefix: str) -> str | None:
        """Format of the module at `prefix`, None when it stays floating point. Fused vLLM modules
        (`qkv_proj`, `gate_up_proj`) resolve through their checkpoint shards, which must agree."""
        head, _, leaf = prefix.rpartition(".")
        if leaf in FUSED_SHARDS and prefix not in self.layers:
            shards = [f"{head}.{s}" if head else s for s in FUSED_SHARDS[leaf]]
            return _agree(prefix, {s: self._single(s) for s in shards})
        return self._single(prefix)

    def moe_formats(self, prefix: str, num_experts: int) -> dict[str, str | None]:
        """{"w13": fmt, "w2": fmt} of the fused-MoE layer at `prefix` (e.g. `model.layers.3.mlp.experts`):
        every expert's gate/up must share one format, and every expert's down one format."""
        out = {}
        for role, projections in MOE_PROJECTIONS.items():
            names = [f"{prefix}.{e}.{p}" for e in range(num_experts) for p in projections]
            out[role] = _agree(f"{prefix} ({role})", {n: self._single(n) for n in names})
        return out

    def _single(self, prefix: str) -> str | None:
        if self.is_mixed:
            return self.layers.get(prefix)
        if any(fnmatch.fnmatchcase(prefix, pat) or prefix.startswith(pat.rstrip("*") + ".") for pat in self.exclude):
            return None
        return self.default

    def to_quantization_config(self) -> dict:
        """The `quantization_config` dict for config.json."""
        from . import __version__

        if self.is_mixed:
            body = {
                "quant_algo": MIXED,
                "quantized_layers": {p: layer_entry(f) for p, f in sorted(self.layers.items())},
            }
        else:
            body = {"quant_algo": codec_for(self.default).spec.quant_algo, "exclude_modules": list(self.exclude)}
            group = codec_for(self.default).spec.group_size
            if group is not None:
                body["group_size"] = group
        producer = self.producer or {"name": "b12x-formats", "version": __version__}
        return {
            "quant_method": "modelopt",
            **body,
            "kv_cache_quant_algo": self.kv_cache_quant_algo,
            "producer": producer,
        }

    def to_hf_quant_config(self) -> dict:
        """The legacy `hf_quant_config.json` form of the same config."""
        cfg = self.to_quantization_config()
        producer = cfg.pop("producer")
        cfg.pop("quant_method")
        return {"producer": producer, "quantization": cfg}


def _agree(what: str, formats: dict[str, str | None]) -> str | None:
    distinct = set(formats.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in formats.items())
        raise ValueError(f"{what}: fused shards must share one format, got {detail}")
    return distinct.pop() if distinct else None


def parse_quantization_config(cfg: dict) -> QuantizationConfig:
    """Parse `config.json`'s `quantization_config` (quant_method "modelopt") or a whole `hf_quant_config.json`
    (`{"producer": ..., "quantization": {...}}`). Raises ValueError naming the offending key or layer."""
    if not isinstance(cfg, dict):
        raise ValueError(f"quantization config must be a dict, got {type(cfg).__name__}")
    producer = cfg.get("producer")
    if "quantization" in cfg:  # hf_quant_config.json
        body = cfg["quantization"]
        if not isinstance(body, dict):
            raise ValueError("hf_quant_config.json: 'quantization' must be a dict")
    else:
        method = cfg.get("quant_method")
        if method is not None and str(method).lower() != "modelopt":
            raise ValueError(f"quant_method {method!r} is not a ModelOpt config (expected 'modelopt')")
        body = cfg
    algo = body.get("quant_algo")
    if algo is None:
        raise ValueError("quantization config has no 'quant_algo'")
    kv = body.get("kv_cache_quant_algo")
    if str(algo).upper() == MIXED:
        layers_in = body.get("quantized_layers")
        if not isinstance(layers_in, dict) or not layers_in:
            raise ValueError("MIXED_PRECISION config needs a non-empty 'quantized_layers' dict")
        layers = {}
        for prefix, entry in layers_in.items():
            if is_norm_module(prefix):
                raise ValueError(
                    f"quantized_layers[{prefix!r}]: {prefix} is a normalisation layer; norms stay floating point"
                )
            layers[prefix] = validate_entry(prefix, entry)
        return QuantizationConfig(layers=layers, producer=producer, kv_cache_quant_algo=kv)
    entry = {k: body[k] for k in ("quant_algo", "group_size") if k in body}
    if codec_for(algo).spec.packing == "ggml":
        raise ValueError(f"quant_algo {algo!r}: GGML block formats are only supported inside MIXED_PRECISION configs")
    default = validate_entry("<all layers>", entry)
    exclude = list(body.get("exclude_modules") or body.get("ignore") or [])
    return QuantizationConfig(default=default, exclude=exclude, producer=producer, kv_cache_quant_algo=kv)
