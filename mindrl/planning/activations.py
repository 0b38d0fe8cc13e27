"""Activation memory of one rank: what megatron-core's layers keep for the backward pass, per
micro-batch, per pipeline stage, under TP / SP / PP / VPP / recompute; and the loss over the
vocabulary on the last stage.

The per-layer count follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models") term by term, but for the layers mindrl builds rather than GPT-3's:
SwiGLU MLPs, grouped-query attention and the kernels each backend runs. Counted with torch's
saved-tensor hooks (bytes per token of one layer, s = sequence, a = heads, Q = a x
head_dim, KV = kv heads x head_dim, F = ffn_hidden_size, e = bytes per activation):

* norms: torch's eager RMSNorm keeps its fp32 input and normalised output (8 h bytes per norm,
  whatever e is); a fused norm (MindSpeed, transformer-engine) keeps its input (e h);
* the QKV and fc1 inputs (e h each) -- these and the norms are whole on every TP rank, split
  over TP only with sequence parallelism;
* attention, split over TP: unfused, q and the GQA-expanded k, v and the context (4 Q e; 6 Q e
  without GQA, where v's view keeps the fused QKV output alive) plus the score matrix, a s
  elements per token kept in fp32 by the softmax and again in e for the product with v (the
  5as/h term of the paper; selective recompute drops it); flash attention keeps q, k, v, the
  output and the log-sum-exp instead; on CPU megatron's local attention runs as torch's fused
  kernel (`models/packed_attention.py`): the unfused path's q, k, v and context, and the
  log-sum-exp in place of the score matrix (its float mask is one tensor the layers share);
* SwiGLU, split over TP: fc1's output (2F), silu's output, the gated product and fc2's input
  (5 F e unfused; a fused SwiGLU keeps its input and output, 3 F e). A MoE layer's F is its
  top-k experts' plus its shared expert's width (the dense MLP's where that is wider and the
  model has dense layers); the router's and the token dispatch's tensors are not counted;
* multi-latent attention (DeepSeek-V3) keeps its q and kv latents (norm and up-projection
  input, whole on every TP rank), the query / key heads at the no-RoPE plus RoPE width, the
  value-width heads, context and output-projection input, and on CPU the probabilities
  (`_mla_layer_bytes`).

Full recompute keeps each checkpointed group's input (e h, / TP with SP) and re-runs one group
at a time in the backward pass. The first pipeline stage of 1F1B holds min(PP, micro-batches)
micro-batches, stage i PP - i; the interleaved schedule holds megatron's warm-up count of
model-chunk micro-batches, 2 (PP - i - 1) + (V - 1) PP + 1, which on stage 0 is the paper's
(1 + (PP - 1) / (PP V)) factor.

Context parallelism (CP) runs the layers on seq / CP tokens of each sequence on every rank, so
the per-token terms are counted for seq / CP tokens; the attention's keys reach over the whole
sequence, and each layer also keeps the keys and values gathered from the other CP ranks for
its backward (`models/context_parallel.py`; Ulysses' head-split q, k, v are of that order).
The final norm runs on the rank's tokens; the loss on the gathered response tokens, whole on
every CP rank.

The loss: mindrl computes logits for the response tokens only (`models/token_select.py`;
every position under SP, where the gather is not local). Per logit element, counted with the
same hooks (tools/bench/memory_plan.py checks it): the update keeps the logits plus ~28
bytes of fp32 log-softmax, entropy-metric and gradient buffers (12 more when the entropy bonus
carries gradients); a forward-only log-prob pass ~12 bytes beside the logits. Where one rank holds
the whole vocabulary (TP 1) the output layer and the log-softmax run a chunk of tokens at a
time (`models/head_log_probs.py`): one chunk's fp32 logits and their gradient, plus the
output weight's fp32 gradient buffer in the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.head_log_probs import chunk_tokens
from mindrl.planning.shapes import RoleShape

EAGER_NORM_BYTES = 8  # per hidden element: torch's RMSNorm keeps fp32 input + normed output
SOFTMAX_BYTES = 4  # attention_softmax_in_fp32: megatron's softmax keeps an fp32 output
LSE_BYTES = 4  # flash attention's log-sum-exp, per head and token
TRAIN_LOSS_BYTES = 28  # fp32 buffers per logit element in the update's loss (hook-counted)
ENTROPY_GRAD_BYTES = 12  # more when the entropy bonus is differentiated (hook-counted)
FORWARD_LOSS_BYTES = 12  # fp32 buffers per logit element in a log-prob pass (hook-counted)
CHUNK_TRAIN_BYTES = 16  # per logit element of one chunk in the backward: logits, p, gradient
CHUNK_FORWARD_BYTES = 12  # per logit element of one chunk in the forward


@dataclass(frozen=True)
class LayerBytes:
    """Bytes one layer keeps per token of a micro-batch on one rank, by how they shard."""

    replicated: float  # norms, QKV and fc1 inputs: whole on each TP rank (/ TP with SP)
    sharded: float  # attention and MLP tensors (already / TP)
    scores: float  # the attention score matrix (already / TP); 0 with flash / selective

    @property
    def total(self) -> float:
        return self.replicated + self.sharded + self.scores


def layer_bytes(shape: RoleShape, seq: int) -> LayerBytes:
    """One layer's activations per token (see the module docstring for each term)."""
    arch, e, t = shape.arch, shape.act_bytes, shape.tp
    h, heads, kv_heads = arch.hidden_size, arch.num_attention_heads, arch.num_kv_heads
    q, kv = heads * arch.head_dim, kv_heads * arch.head_dim
    f = _mlp_width(arch)
    norm_bytes = e if shape.fused_norm else EAGER_NORM_BYTES
    replicated = 2 * norm_bytes * h + 2 * e * h + (2 * h if arch.hidden_dropout > 0 else 0)
    if arch.multi_latent_attention:
        return _mla_layer_bytes(shape, seq, f, replicated, norm_bytes)
    if shape.flash_attention:
        attention = (2 * q + 2 * kv) * e + LSE_BYTES * heads
        scores = 0.0
    else:
        attention = (4 * q if kv_heads != heads else 6 * q) * e
        score_bytes = SOFTMAX_BYTES + (e if e != SOFTMAX_BYTES else 0)
        score_bytes += 1 if arch.attention_dropout > 0 else 0
        scores = heads * seq * score_bytes
        if shape.fused_local_attention:  # the same q, k, v, context; no score matrix
            scores = LSE_BYTES * heads
        if shape.recompute.granularity == "selective":
            scores = 0.0
    if arch.swiglu:
        mlp = (3 if shape.fused_swiglu else 5) * f * e
    else:
        mlp = 2 * f * e
    sp = t if shape.sequence_parallel else 1
    return LayerBytes(replicated / sp, (attention + mlp) / t, scores / t)


def _mlp_width(arch: ModelArchConfig) -> int:
    """The MLP width one token's activations run through: a MoE layer's top-k experts and its
    shared expert; the larger of that and the dense MLP when a MoE model has dense layers (the
    largest layer decides)."""
    pattern = arch.moe_layer_pattern
    widths = [arch.ffn_hidden_size] if not all(pattern) else []
    if any(pattern):
        moe = arch.moe_router_topk * arch.expert_ffn_hidden_size
        widths.append(moe + (arch.shared_expert_ffn_hidden_size or 0))
    return max(widths)


def _mla_layer_bytes(
    shape: RoleShape, seq: int, f: int, replicated: float, norm_bytes: float
) -> LayerBytes:
    """Multi-latent attention's layer: the q and kv latents (whole on every TP rank: megatron's
    local spec gathers the down projections' outputs), each kept by its norm and as its up
    projection's input, the RoPE key sharing the kv latent's storage; then, split over TP, the
    query and key heads (no-RoPE plus RoPE width), the value heads, the context and the output
    projection's input (value width). Torch's fused CPU kernel takes a value width other than
    the query's on its math path, which keeps the probabilities (heads x seq elements)."""
    arch, e, t = shape.arch, shape.act_bytes, shape.tp
    heads, v = arch.num_attention_heads, arch.v_head_dim or 0
    q_lora, kv_lora = arch.q_lora_rank or 0, arch.kv_lora_rank or 0
    rope = arch.qk_pos_emb_head_dim or 0
    latents = (norm_bytes + e) * (q_lora + kv_lora) + e * rope
    if shape.flash_attention:
        attention = heads * (2 * arch.q_head_dim + 2 * v) * e + LSE_BYTES * heads
        scores = 0.0
    else:
        attention = heads * (2 * arch.q_head_dim + 3 * v) * e
        scores = heads * seq * e
        if shape.recompute.granularity == "selective":
            scores = 0.0
    mlp = ((3 if shape.fused_swiglu else 5) if arch.swiglu else 2) * f * e
    sp = t if shape.sequence_parallel else 1
    return LayerBytes((replicated + latents) / sp, (attention + mlp) / t, scores / t)


@dataclass(frozen=True)
class StageActivations:
    """A training rank's activations at the peak of its pipeline schedule."""

    kept: float  # layers' saved tensors of every micro-batch in flight
    recompute: float  # the group re-run during the backward pass (full recompute)
    pipeline: float  # send / receive buffers between stages
    in_flight: float  # micro-batches in flight (model-chunk micro-batches / V)

    @property
    def total(self) -> float:
        return self.kept + self.recompute + self.pipeline


def in_flight_chunks(pp: int, vpp: int, stage: int, n_micro: int) -> int:
    """Model-chunk micro-batches whose activations one rank holds at its peak: 1F1B's
    PP - stage, the interleaved schedule's warm-up + 1 (megatron's counts)."""
    if vpp == 1:
        return max(1, min(pp - stage, n_micro))
    return max(1, min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, n_micro * vpp))


def stage_activations(
    shape: RoleShape, seq: int, stage: int, n_micro: int, vpp: int | None = None
) -> StageActivations:
    """Training activations of one rank at pipeline stage `stage` (micro-batches of
    `shape.micro_batch` sequences of `seq` tokens, `n_micro` of them per optimizer step)."""
    vpp = shape.vpp if vpp is None else vpp
    tokens = shape.micro_batch * seq / shape.cp
    full = layer_bytes(shape, seq).total * tokens + gathered_kv_bytes(shape, seq)
    sp = shape.tp if shape.sequence_parallel else 1
    checkpoint = shape.act_bytes * shape.arch.hidden_size * tokens / sp
    per_chunk = shape.layers_on_stage(stage) // vpp
    rc = shape.recompute
    if rc.granularity == "full":
        k = max(1, min(rc.num_layers, per_chunk))
        if rc.method == "block":
            kept_chunk = k * checkpoint + (per_chunk - k) * full
            rerun = full
        else:  # uniform: groups of k layers, each keeping its input
            kept_chunk = math.ceil(per_chunk / k) * checkpoint
            rerun = k * full
    else:
        kept_chunk, rerun = per_chunk * full, 0.0
    chunks = in_flight_chunks(shape.pp, vpp, stage, n_micro)
    pipeline = 2 * checkpoint if shape.pp > 1 else 0.0  # a send and a receive buffer
    return StageActivations(chunks * kept_chunk, rerun, pipeline, chunks / vpp)


def forward_activations(shape: RoleShape, seq: int, micro_batch: int | None = None) -> float:
    """A forward pass without gradients: one layer's tensors at a time (plus the pipeline
    buffers)."""
    rows = micro_batch or shape.micro_batch
    tokens = rows * seq / shape.cp
    sp = shape.tp if shape.sequence_parallel else 1
    buffers = 2 * shape.act_bytes * shape.arch.hidden_size * tokens / sp if shape.pp > 1 else 0
    return layer_bytes(shape, seq).total * tokens + gathered_kv_bytes(shape, seq, rows) + buffers


def gathered_kv_bytes(shape: RoleShape, seq: int, micro_batch: int | None = None) -> float:
    """One layer's keys and values of the other CP ranks' tokens (0 without CP)."""
    if shape.cp == 1:
        return 0.0
    arch = shape.arch
    if arch.multi_latent_attention:  # each head's key (no-RoPE + RoPE) and value
        kv = arch.num_attention_heads * (arch.q_head_dim + (arch.v_head_dim or 0)) / 2 / shape.tp
    else:
        kv = arch.num_kv_heads * arch.head_dim / shape.tp
    others = (micro_batch or shape.micro_batch) * seq * (1 - 1 / shape.cp)
    return 2 * kv * shape.act_bytes * others


def logits_bytes(
    shape: RoleShape, seq: int, response: int, *, training: bool, entropy_grad: bool = False
) -> float:
    """The last stage's final norm, output-layer input and loss over the vocabulary for one
    micro-batch (response tokens only, every position under SP)."""
    arch, e, t = shape.arch, shape.act_bytes, shape.tp
    tokens = shape.micro_batch * seq
    scored = shape.micro_batch * response
    vocab = arch.padded_vocab_size(t) / t
    sp = t if shape.sequence_parallel else 1
    norm = (e if shape.fused_norm else EAGER_NORM_BYTES) * arch.hidden_size * tokens / sp / shape.cp
    head_input = e * arch.hidden_size * (tokens if shape.sequence_parallel else scored)
    if t == 1:  # the chunked head: one chunk of logits at a time
        chunk = min(scored, chunk_tokens(int(vocab)))
        if training:
            weight_grad = 4 * vocab * arch.hidden_size
            return norm + head_input + CHUNK_TRAIN_BYTES * vocab * chunk + weight_grad
        return norm + head_input + CHUNK_FORWARD_BYTES * vocab * chunk
    logits = e * vocab * (tokens if shape.sequence_parallel else scored)
    if training:
        fp32 = TRAIN_LOSS_BYTES + (ENTROPY_GRAD_BYTES if entropy_grad else 0)
    else:
        fp32 = FORWARD_LOSS_BYTES
    return norm + head_input + logits + fp32 * vocab * scored
