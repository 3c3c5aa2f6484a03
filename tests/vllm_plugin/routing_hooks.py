"""Forward hooks that record MoE routing inside vLLM's model (run_vllm.py --record-routing). A module of its own:
apply_model pickles the functions by reference, and a worker process (tensor parallelism) imports them from here."""

from __future__ import annotations


def record_routing(model) -> int:
    """Hooks that keep, per forward of `model`, its token ids, positions and every MoE router's logits (float32,
    layer order) in `model.b12x_routing`; returns the number of routers. Runs in the worker (apply_model)."""
    records = model.b12x_routing = []
    gates = [module for name, module in model.named_modules() if name.endswith(".mlp.gate")]

    def before(module, args, kwargs):
        named = dict(zip(("input_ids", "positions"), args, strict=False)) | kwargs  # passed either way
        ids, positions = named["input_ids"], named["positions"]
        records.append({"ids": ids.tolist(), "positions": positions.tolist(), "routers": [None] * len(gates)})

    def after(layer):
        def hook(module, args, output):
            logits = output[0] if isinstance(output, tuple) else output  # linear layers return (out, bias)
            records[-1]["routers"][layer] = logits.float().tolist()

        return hook

    model.register_forward_pre_hook(before, with_kwargs=True)
    for layer, gate in enumerate(gates):
        gate.register_forward_hook(after(layer))
    return len(gates)


def recorded_routing(model) -> list:
    return model.b12x_routing
