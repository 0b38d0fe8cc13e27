"""Run by test_memory_plan.py through the `fresh_process` fixture (megatron's parallel state
is process-global): build real megatron-core GPT models on CPU and report what the memory
plan predicts from the architecture alone.

Arguments: {"archs": [ModelArchConfig keyword dicts], "tp": int, "pp": int, "dtype": str,
"saved": [batch, seq] or null, "fused": bool (mindrl's compiled RMSNorm and megatron's fused
SwiGLU, as `use_fused_rmsnorm` / `use_fused_swiglu` build them on CPU)}. Result: {"tp_rank",
"pp_rank", "params": [this rank's parameter count per arch], "saved": [bytes the forward pass
keeps for backward per arch (unique storages, parameters excluded), when asked]}.
"""

from typing import Any

from tests.fresh_process import json_main


def saved_bytes(model: Any, batch: int, seq: int, vocab: int) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of one forward."""
    import torch

    from mindrl.models.logprobs import causal_attention_mask

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, vocab, (batch, seq))
    positions = torch.arange(seq)[None].expand(batch, seq)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, positions, causal_attention_mask(seq))
    return sum(seen.values())


def main(args: dict[str, Any]) -> dict[str, Any]:
    from mindrl.config.model_arch import ModelArchConfig
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.host_fusions import use_fused_rms_norm
    from mindrl.models.parallel import init_parallel

    info = init_parallel(args["tp"], args["pp"], accelerator="cpu", seed=1)
    counts, saved = [], []
    for kwargs in args["archs"]:
        arch = ModelArchConfig(**kwargs)
        fused = bool(args.get("fused"))
        overrides = {"bias_activation_fusion": True} if fused else None
        model = build_gpt_model(arch, params_dtype=args["dtype"], config_overrides=overrides)
        if fused:
            use_fused_rms_norm(model)
        counts.append(sum(p.numel() for p in model.parameters()))
        if args.get("saved"):
            model.train()
            batch, seq = args["saved"]
            saved.append(saved_bytes(model, batch, seq, arch.vocab_size))
    return {"tp_rank": info.tp_rank, "pp_rank": info.pp_rank, "params": counts, "saved": saved}


if __name__ == "__main__":
    json_main(main)
