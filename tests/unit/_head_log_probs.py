"""Fresh-process helper for test_head_log_probs.py: a real megatron GPTModel (TP 1) run under
`select_tokens` with and without `hidden_only`; the scored tokens' log-probs and entropies
and every parameter's gradient of one weighted loss, by the plain path (logits, then the
log-softmax) and the chunked head (`head_log_probs`).

Arguments: {"arch": ModelArchConfig kwargs, "entropy_grad": bool, "chunk_bytes": int,
"bf16": bool (the model's weights and compute in bf16; DDP's gradient buffers stay fp32)}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    import mindrl.models.head_log_probs as chunked
    from mindrl.config.model_arch import ModelArchConfig
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.parallel import init_parallel
    from mindrl.models.token_select import TokenSelection

    chunked.CHUNK_BYTES = args["chunk_bytes"]  # several chunks on this small batch
    init_parallel(1, 1, accelerator="cpu", seed=1)
    arch = ModelArchConfig(**args["arch"])
    dtype = torch.bfloat16 if args.get("bf16") else torch.float32
    model = build_gpt_model(arch).to(dtype)
    model.train()
    gen = torch.Generator().manual_seed(0)
    batch, seq = 3, 24
    tokens = torch.randint(0, arch.vocab_size, (batch, seq), generator=gen)
    attention = torch.ones(batch, seq, dtype=torch.long)
    attention[1, :6] = 0  # left padding
    response = attention[:, 1:].clone()
    response[:, :8] = 0  # the prompt is not scored
    selection = TokenSelection.from_mask(response)
    weights = torch.randn(selection.size, generator=gen)
    entropy_weights = torch.randn(selection.size, generator=gen)
    entropy_grad = args["entropy_grad"]

    inputs, loss_weights = (tokens, attention, selection), (weights, entropy_weights)
    results = {}
    for hidden_only in (False, True):
        model.zero_grad()
        used_head, picked, entropy = _loss_backward(
            model, arch, hidden_only, inputs, loss_weights, entropy_grad
        )
        results[hidden_only] = {
            "used_head": used_head,
            "picked": picked.detach(),
            "entropy": entropy.detach(),
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()},
        }
    plain, fused = results[False], results[True]
    grad_gap = max(
        float((plain["grads"][n].float() - g.float()).abs().max())
        for n, g in fused["grads"].items()
    )
    ddp_gaps, embedding_layouts = {}, set()
    # megatron's DDP: the chunked head adds into main_grad itself (with and without overlapped
    # reduction); megatron's own output layer makes a dense gradient; the word embedding's
    # gradient arrives as its looked-up rows (sparse) in both
    for hidden_only, overlap in ((True, False), (True, True), (False, False)):
        ddp_grads, layouts = _ddp_grads(
            model, arch, hidden_only, overlap, inputs, loss_weights, entropy_grad, dtype
        )
        embedding_layouts |= layouts
        ddp_gaps[hidden_only, overlap] = max(
            float((plain["grads"][n].float() - ddp_grads[n]).abs().max()) for n in plain["grads"]
        )
    return {
        "ddp_grad_gap": max(ddp_gaps.values()),
        "ddp_embedding_grad_layouts": sorted(embedding_layouts),
        "plain_used_head": plain["used_head"],
        "fused_used_head": fused["used_head"],
        "log_prob_gap": float((plain["picked"] - fused["picked"]).abs().max()),
        "entropy_gap": float((plain["entropy"] - fused["entropy"]).abs().max()),
        "log_prob_scale": float(plain["picked"].abs().max()),
        "grad_gap": grad_gap,
        "grad_scale": max(float(g.float().abs().max()) for g in plain["grads"].values()),
        "finite": all(bool(torch.isfinite(g).all()) for g in fused["grads"].values()),
    }


def _loss_backward(model, arch, hidden_only, inputs, loss_weights, entropy_grad):  # type: ignore[no-untyped-def]
    """One weighted loss of the scored tokens' log-probs (and entropies with `entropy_grad`)
    through `model`, backward: by the chunked head (`hidden_only`) or the plain logits and
    log-softmax. Returns (whether the chunked head ran, log-probs, entropies)."""
    import mindrl.models.head_log_probs as chunked
    from mindrl.models.logprobs import (
        causal_attention_mask,
        log_probs_and_entropy,
        position_ids_from_mask,
    )
    from mindrl.models.token_select import select_tokens, selected_logits

    tokens, attention, selection = inputs
    weights, entropy_weights = loss_weights
    with select_tokens(model, selection, hidden_only=hidden_only) as head:
        out = model(
            tokens,
            position_ids_from_mask(attention),
            causal_attention_mask(tokens.shape[1], attention),
        )
    labels = selection.labels(tokens)
    if head.weight is not None:
        picked, entropy = chunked.head_log_probs(
            out[0],
            head.weight,
            labels,
            vocab_size=arch.vocab_size,
            entropy=True,
            entropy_grad=entropy_grad,
        )
    else:
        picked, entropy = log_probs_and_entropy(
            selected_logits(out, selection),
            labels,
            vocab_size=arch.vocab_size,
            entropy_grad=entropy_grad,
        )
    loss = (picked * weights).sum()
    if entropy_grad:
        loss = loss + (entropy * entropy_weights).sum()
    loss.backward()
    return head.weight is not None, picked, entropy


def _ddp_grads(model, arch, hidden_only, overlap, inputs, loss_weights, entropy_grad, dtype):  # type: ignore[no-untyped-def]
    """The loss (by the chunked head with `hidden_only`) through a copy of `model` in
    megatron's DDP (fp32 gradient buffers, `overlap` gradient reduction): each parameter's
    `main_grad` after the reduction, and the layouts of the gradients that reached the word
    embedding's weight from its lookup."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from mindrl.models.gpt import build_gpt_model

    copy = build_gpt_model(arch).to(dtype)
    copy.load_state_dict(model.state_dict())
    config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=overlap)
    ddp = DistributedDataParallel(copy.config, config, copy)
    ddp.train()
    ddp.zero_grad_buffer()
    layouts: set[str] = set()
    lookup = copy.embedding.word_embeddings.weight
    handle = lookup.register_hook(lambda g: layouts.add(str(g.layout)))
    used_head, _, _ = _loss_backward(ddp, arch, hidden_only, inputs, loss_weights, entropy_grad)
    handle.remove()
    assert used_head == hidden_only
    ddp.finish_grad_sync()
    grads = {n: p.main_grad.detach().clone() for n, p in copy.named_parameters()}
    return grads, layouts


if __name__ == "__main__":
    json_main(main)
