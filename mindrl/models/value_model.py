"""The PPO critic's model: the policy's GPT body with a scalar value head for an output layer.

The head replaces GPTModel's `output_layer` on the last pipeline stage, so megatron's
pipeline schedule, DDP, optimizer and dist_checkpointing treat the critic like any GPT. It
is one `[1, hidden]` weight (no bias, as HF's sequence-classification `score` head),
replicated over the TP ranks: under sequence parallelism the hidden states are gathered
first, so every TP rank sees the whole sequence and computes the same gradient (and hands
back only its own sequence slice's gradient). It starts at
zero (values 0: the first advantages are the plain returns) unless a reward-model checkpoint
brings its `score.weight`.

Values share the log-probs' grid: entry t of `[B, S-1]` is the value of the state after
token t, i.e. before the token at t+1 is generated, so a response token's value sits where
its log-prob does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mindrl.config.model_arch import ModelArchConfig

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel

VALUE_HEAD_PREFIX = "output_layer."  # the head's parameter names in the GPT chunk
HF_SCORE_KEY = "score.weight"  # a reward model's head (AutoModelForSequenceClassification)


class ValueHead(torch.nn.Module):
    """Called as GPTModel calls its output layer; returns ([s, b, 1] values, None)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool) -> None:
        super().__init__()
        # named `weight` like the output layer it replaces: megatron's checkpoint code asks
        # for output_layer.weight by name
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.sequence_parallel = sequence_parallel

    def forward(
        self, hidden_states: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # every TP rank computes the same loss from the whole sequence: the backward takes
            # this rank's slice of the gradient (a reduce-scatter would count it TP times)
            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            )
        return torch.nn.functional.linear(hidden_states, self.weight), None


def critic_arch(arch: ModelArchConfig) -> ModelArchConfig:
    """The policy's architecture with an untied output layer: the head is not the embedding."""
    return dataclasses.replace(arch, untie_embeddings_and_output_weights=True)


def attach_value_head(model: GPTModel) -> GPTModel:
    """Swap the chunk's output layer for a value head (last pipeline stage only)."""
    if model.post_process:
        weight = model.output_layer.weight
        model.output_layer = ValueHead(
            model.config.hidden_size, weight.dtype, bool(model.config.sequence_parallel)
        ).to(weight.device)
    return model


def load_score_head(model_chunks: Sequence[Any], hf_dir: str) -> bool:
    """Copy a reward model's `score.weight` (first label) into the value head; False when
    the folder holds none (a causal-LM checkpoint: the head stays at zero)."""
    from mindrl.checkpoint.hf_io import HFCheckpointReader
    from mindrl.models.gpt import unwrap_model

    reader = HFCheckpointReader(hf_dir)
    try:
        if HF_SCORE_KEY not in reader.weight_map:
            return False
        score = reader.read(HF_SCORE_KEY)
    finally:
        reader.close()
    for chunk in model_chunks:
        gpt = unwrap_model(chunk)
        if gpt.post_process:
            head = gpt.output_layer.weight
            with torch.no_grad():
                head.copy_(score[:1].to(head.dtype))
    return True


def value_grid(output: torch.Tensor, seq: int) -> torch.Tensor:
    """The model's [b, s, 1] output as [b, seq-1] fp32 values on the log-prob grid."""
    return output[:, : seq - 1, 0].float()


def forward_values(
    model_chunks: Sequence[Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    micro_batch_size: int,
) -> torch.Tensor:
    """[B, S-1] fp32 values of every position, no gradients, through megatron's pipeline
    schedule; every pipeline rank returns the same tensor."""
    from mindrl.data.packing import round_up
    from mindrl.models.forward_pass import forward_only_schedule, last_stage_output
    from mindrl.models.logprobs import (
        causal_attention_mask,
        pad_columns,
        position_ids_from_mask,
        sequence_multiple,
    )

    chunks = list(model_chunks)
    device = next(chunks[0].parameters()).device
    batch, asked_seq = input_ids.shape
    seq = round_up(asked_seq, sequence_multiple(chunks))
    if batch % micro_batch_size:
        raise ValueError(f"batch size {batch} is not a multiple of {micro_batch_size}")
    ids = pad_columns(input_ids, seq).to(device)
    mask = pad_columns(attention_mask, seq).to(device)
    micro = [
        (ids[i : i + micro_batch_size], mask[i : i + micro_batch_size])
        for i in range(0, batch, micro_batch_size)
    ]

    def step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        tokens, m = next(data_iterator)
        out = model(tokens, position_ids_from_mask(m), causal_attention_mask(seq, m))

        def finish(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return output.new_zeros((), dtype=torch.float32), {"out": value_grid(output, seq)}

        return out, finish

    results = forward_only_schedule(chunks, micro, step, seq, micro_batch_size)
    result = last_stage_output([r["out"] for r in results], (batch, seq - 1), device)
    return result[:, : asked_seq - 1].cpu()
