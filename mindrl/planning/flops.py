"""The arithmetic a GRPO step's model phases cannot do without, counted from the model shape
and the step's real tokens: at a machine's matmul rate it is the floor under each phase's
time (tools/bench/roofline.py), so the gap between the floor and the measured time shows
where the next speed-up is.

Counted (one FLOP = one multiply or one add, so a multiply-accumulate is 2):
- every linear layer a token passes through (QKV, proj, the MLP or the top-k experts, the
  router and the shared expert of a MoE layer; multi-latent attention's latent down and up
  projections; a MoE model's dense layers as dense);
- causal attention: for the token at position t, scores and the weighted sum over t
  positions, per query head (MLA: scores over the no-RoPE plus RoPE width, the sum over the
  value width);
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


def attention_linear_macs(arch: ModelArchConfig) -> int:
    """Multiply-accumulates of one layer's attention projections per token. Multi-latent
    attention: the q latent's down and up projections (or one q projection without a latent),
    the kv latent's down projection (with the shared RoPE key) and its up projection to each
    head's no-RoPE key and value, and the output projection from the value heads."""
    h, heads = arch.hidden_size, arch.num_attention_heads
    if arch.multi_latent_attention:
        q_lora, kv_lora = arch.q_lora_rank, arch.kv_lora_rank or 0
        q_up = heads * arch.q_head_dim
        q = h * q_lora + q_lora * q_up if q_lora else h * q_up
        kv_up = kv_lora * heads * ((arch.qk_head_dim or 0) + (arch.v_head_dim or 0))
        kv = h * (kv_lora + (arch.qk_pos_emb_head_dim or 0)) + kv_up
        return q + kv + heads * (arch.v_head_dim or 0) * h
    q, kv = heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return h * (q + 2 * kv) + q * h


def _mlp_macs(h: int, ffn: int, swiglu: bool) -> int:
    return h * (2 * ffn if swiglu else ffn) + ffn * h


def mlp_linear_macs(arch: ModelArchConfig, layer: int) -> int:
    """Multiply-accumulates of global layer `layer`'s MLP per token: a dense MLP, or a MoE
    layer's top-k experts, its router and its shared expert (with its gate)."""
    h = arch.hidden_size
    if not (arch.is_moe and arch.is_moe_layer(layer)):
        return _mlp_macs(h, arch.ffn_hidden_size, arch.swiglu)
    routed = arch.moe_router_topk * _mlp_macs(h, arch.expert_ffn_hidden_size, arch.swiglu)
    shared = arch.shared_expert_ffn_hidden_size
    shared_macs = _mlp_macs(h, shared, arch.swiglu) if shared else 0
    gate = h if shared and arch.shared_expert_gate else 0
    return routed + h * (arch.num_experts or 0) + shared_macs + gate


def linear_macs_per_token(arch: ModelArchConfig) -> int:
    """Multiply-accumulates of every transformer-layer linear one token passes through."""
    attention = attention_linear_macs(arch)
    return sum(attention + mlp_linear_macs(arch, i) for i in range(arch.num_layers))


def attention_macs(arch: ModelArchConfig, tokens: float) -> float:
    """Causal attention over one sequence of `tokens`: position t attends to t positions,
    per query head once for the scores (the query / key head width: MLA's no-RoPE and RoPE
    parts) and once for the weighted sum of the values (the value head width)."""
    heads = arch.num_attention_heads
    value = (arch.v_head_dim or 0) if arch.multi_latent_attention else arch.head_dim
    per_position = heads * (arch.q_head_dim + value)
    return arch.num_layers * per_position * tokens * (tokens + 1) / 2


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
