"""The arithmetic a GRPO step's model phases cannot do without, counted from the model shape
and the step's real tokens: at a machine's matmul rate it is the floor under each phase's
time (tools/bench/roofline.py), so the gap between the floor and the measured time shows
where the next speed-up is.

Counted (one FLOP = one multiply or one add, so a multiply-accumulate is 2):
- every linear layer a token passes through (QKV, proj, the MLP or the top-k experts and the
  router of a MoE layer);
- causal attention: for the token at position t, scores and the weighted sum over t
  positions, per query head;
- the output layer only where a log-prob is needed: the response tokens (running it over
  prompt positions, or over padding, is overhead the floor does not include);
- a prompt once for all the samples drawn from it: its samples' rows start with the same
  tokens, so one pass over them serves every row (vLLM's prefix caching does that in the
  rollout, `share_prompt_forward` in the training passes; running it once per row is overhead
  the floor does not include). Each response token still attends to its prompt.
Generation (prefill + decode with a KV cache) does the same linear and attention arithmetic
as one forward pass over the whole sequence. A training backward pass is twice the forward
(input and weight gradients), once when the weights are frozen (LoRA's base: input
gradients only; the adapters' share is left out); full recompute adds a forward. Norms,
rotary embeddings, softmax and the optimizer are left out: at these shapes they are a few
percent. Attention is counted at the mean sequence length, which under-counts it slightly
when lengths vary (the quadratic term's mean is above the mean's square).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.model_arch import ModelArchConfig


def linear_macs_per_token(arch: ModelArchConfig) -> int:
    """Multiply-accumulates of every transformer-layer linear one token passes through."""
    h, d = arch.hidden_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_kv_heads * d
    ffn = arch.expert_ffn_hidden_size
    mlp = h * (2 * ffn if arch.swiglu else ffn) + ffn * h
    if arch.num_experts is not None:
        mlp = arch.moe_router_topk * mlp + h * arch.num_experts  # routed experts + router
    return arch.num_layers * (h * (q + 2 * kv) + q * h + mlp)


def attention_macs(arch: ModelArchConfig, tokens: float) -> float:
    """Causal attention over one sequence of `tokens`: position t attends to t positions,
    once for the scores and once for the weighted sum, per query head dimension."""
    q = arch.num_attention_heads * arch.head_dim
    return arch.num_layers * 2 * q * tokens * (tokens + 1) / 2


def forward_flops(
    arch: ModelArchConfig, prompt: float, response: float, samples_per_prompt: int = 1
) -> float:
    """One forward pass over one sequence, with log-probs of its response tokens; its prompt's
    own arithmetic (linears and the prompt's attention to itself) is split over the
    `samples_per_prompt` rows that share it."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    others = 1.0 - 1.0 / samples_per_prompt  # the share of the prompt other rows compute
    tokens = prompt + response
    macs = linear_macs_per_token(arch) * (tokens - others * prompt)
    macs += attention_macs(arch, tokens) - others * attention_macs(arch, prompt)
    macs += arch.hidden_size * arch.vocab_size * response  # output layer
    return 2.0 * macs


@dataclass(frozen=True)
class StepTokens:
    """What one RL step processes: `samples` sequences of mean prompt and response length,
    `samples_per_prompt` of them drawn from each prompt."""

    samples: int
    prompt: float
    response: float
    samples_per_prompt: int = 1


def phase_flops(
    arch: ModelArchConfig,
    step: StepTokens,
    *,
    epochs: int = 1,
    full_recompute: bool = False,
    frozen_base: bool = False,
) -> dict[str, float]:
    """The floor FLOPs of each model phase of one step, named as the step's `timing/*`
    metrics name them: rollout (generation), ref and old_log_prob (a forward each), update
    (forward + backward per epoch)."""
    forward = step.samples * forward_flops(
        arch, step.prompt, step.response, step.samples_per_prompt
    )
    backward = (1.0 if frozen_base else 2.0) * forward
    update = forward + backward + (forward if full_recompute else 0.0)
    return {
        "rollout": forward,
        "ref": forward,
        "old_log_prob": forward,
        "update": epochs * update,
    }
