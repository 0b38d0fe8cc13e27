"""Fresh-process helper for test_fused_rope.py: a real megatron GPTModel (TP 1, fp32) built
twice with the same weights, megatron's unfused rope and `apply_rope_fusion` (mindrl's fused
rope in megatron's slots), run forward and backward on the same batch (padded rows with a
causal mask, or one packed row of three sequences with megatron's `thd` parameters); returns
whether outputs and every parameter gradient are equal and how often the fused rope ran.

Arguments: {"arch": ModelArchConfig kwargs, "packed": bool}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.packed_seq_params import PackedSeqParams

    from mindrl.config.model_arch import ModelArchConfig
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.parallel import init_parallel

    init_parallel(1, 1, accelerator="cpu", seed=1)
    arch = ModelArchConfig(**args["arch"])
    plain = build_gpt_model(arch)
    fused = build_gpt_model(arch, config_overrides={"apply_rope_fusion": True})
    fused.load_state_dict(plain.state_dict())

    calls = []
    for slot in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        kernel = getattr(rope_utils, slot)

        def counting(*a: Any, _kernel: Any = kernel, **k: Any) -> Any:
            calls.append(1)
            return _kernel(*a, **k)

        setattr(rope_utils, slot, counting)

    gen = torch.Generator().manual_seed(0)
    if args["packed"]:
        lengths = [11, 20, 9]
        batch, seq = 1, sum(lengths)
        position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
        cu = torch.tensor([0, 11, 31, 40], dtype=torch.int32)
        extra = {
            "attention_mask": None,
            "packed_seq_params": PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=cu,
                cu_seqlens_kv=cu,
                max_seqlen_q=max(lengths),
                max_seqlen_kv=max(lengths),
            ),
        }
    else:
        batch, seq = 2, 40
        position_ids = torch.arange(seq).expand(batch, seq)
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        extra = {"attention_mask": causal[None, None].expand(batch, 1, seq, seq)}
    tokens = torch.randint(0, arch.vocab_size, (batch, seq), generator=gen)
    weights = torch.randn(batch, seq, arch.padded_vocab_size(1), generator=gen)

    def run(model: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.train()
        model.zero_grad()
        logits = model(tokens, position_ids, **extra)
        (logits * weights).sum().backward()
        return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    out_plain, grads_plain = run(plain)
    before = len(calls)
    out_fused, grads_fused = run(fused)
    return {
        "plain_calls": before,
        "fused_calls": len(calls) - before,
        "outputs_equal": bool(torch.equal(out_plain, out_fused)),
        "grads_equal": all(torch.equal(grads_plain[n], g) for n, g in grads_fused.items()),
    }


if __name__ == "__main__":
    json_main(main)
