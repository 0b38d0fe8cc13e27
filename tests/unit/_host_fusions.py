"""Fresh-process helper for test_host_fusions.py: a real megatron GPTModel (TP 1) built twice
with the same weights, megatron's unfused norm + SwiGLU and the fused ones
(`use_fused_rms_norm` + megatron's `bias_activation_fusion`), run forward and backward on the
same packed-like batch; returns the largest output and gradient gaps, how many norms were
swapped, whether megatron's fused SwiGLU ran, and the bytes each model kept for its backward.

Arguments: {"arch": ModelArchConfig kwargs, "bf16": bool}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from megatron.core.fusions import fused_bias_swiglu

    from mindrl.config.model_arch import ModelArchConfig
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.host_fusions import use_fused_rms_norm
    from mindrl.models.parallel import init_parallel

    init_parallel(1, 1, accelerator="cpu", seed=1)
    arch = ModelArchConfig(**args["arch"])
    dtype = torch.bfloat16 if args["bf16"] else torch.float32
    plain = build_gpt_model(arch).to(dtype)
    fused = build_gpt_model(arch, config_overrides={"bias_activation_fusion": True}).to(dtype)
    fused.load_state_dict(plain.state_dict())
    swapped = use_fused_rms_norm(fused)

    swiglu_calls = []  # megatron's fused SwiGLU (weighted: MoE experts scale by routing probs)
    for name in ("SwiGLUFunction", "WeightedSwiGLUFunction"):
        function = getattr(fused_bias_swiglu, name)

        def counting_forward(*a: Any, _original: Any = function.forward, **k: Any) -> Any:
            swiglu_calls.append(1)
            return _original(*a, **k)

        function.forward = staticmethod(counting_forward)

    gen = torch.Generator().manual_seed(0)
    batch, seq = 2, 40
    tokens = torch.randint(0, arch.vocab_size, (batch, seq), generator=gen)
    position_ids = torch.arange(seq).expand(batch, seq)
    weights = torch.randn(batch, seq, arch.padded_vocab_size(1), generator=gen)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)  # True: masked
    mask = causal[None, None].expand(batch, 1, seq, seq)

    def run(model: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        model.train()
        model.zero_grad()
        kept = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == "cpu" and not isinstance(t, torch.nn.Parameter):
                kept[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(tokens, position_ids, attention_mask=mask)
        (logits.float() * weights).sum().backward()
        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
        return logits.detach().float(), grads, kept[0]

    out_plain, grads_plain, kept_plain = run(plain)
    out_fused, grads_fused, kept_fused = run(fused)
    return {
        "swapped": swapped,
        "swiglu_calls": len(swiglu_calls),
        "output_gap": float((out_plain - out_fused).abs().max()),
        "output_scale": float(out_plain.abs().max()),
        "grad_gap": max(
            float((grads_plain[n] - g).abs().max() / grads_plain[n].abs().max().clamp_min(1e-12))
            for n, g in grads_fused.items()
        ),
        "kept_plain": kept_plain,
        "kept_fused": kept_fused,
        "finite": bool(torch.isfinite(out_fused).all()),
    }


if __name__ == "__main__":
    json_main(main)
