"""MindSpeed's `use_fused_rotary_pos_emb` off the NPU: mindrl's fused rotary embedding gives
megatron's unfused rope's outputs and gradients bit for bit (plain and packed batches, fp32 and
bf16), falls back to megatron's code where it does not apply, and a GPT model built with the
key computes what the unfused model computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.common.embeddings.rope_utils import (
    _apply_rotary_pos_emb_bshd,
    _apply_rotary_pos_emb_thd,
)

from mindrl.config import load_run_config
from mindrl.models.fused_rope import fused_rope_bshd, fused_rope_thd, install_fused_rope
from mindrl.models.scale import transformer_overrides
from tests.unit._model_files import arch_kwargs


def _angles(rows: int, dim: int, rotary: int | None = None) -> torch.Tensor:
    rotary = rotary or dim
    inv = 1.0 / (10000 ** (torch.arange(0, rotary, 2).float() / rotary))
    half = torch.outer(torch.arange(rows).float(), inv)
    return torch.cat([half, half], -1)[:, None, None, :]


def _value_and_grad(fn, x: torch.Tensor, grad_out: torch.Tensor, *args):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, *args)
    out.backward(grad_out)
    return out.detach(), x.grad


class _SingleRankGroup:
    """What megatron's unfused packed rope reads of its context-parallel group."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 2])
def test_the_fused_rope_is_megatrons_unfused_rope_bit_for_bit(dtype, batch):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, batch, 3, 64, generator=gen).to(dtype)
    grad_out = torch.randn(37, batch, 3, 64, generator=gen).to(dtype)
    freqs = _angles(37, 64)
    want = _value_and_grad(_apply_rotary_pos_emb_bshd, x, grad_out, freqs)
    got = _value_and_grad(fused_rope_bshd, x, grad_out, freqs)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    # only cos and sin ([s, 1, 1, d]) are kept for the backward, nothing of the input's size
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: kept.append(t.numel()) or t, lambda t: t
    ):
        fused_rope_bshd(x.detach().requires_grad_(True), freqs)
    assert kept and max(kept) == freqs.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("exact_offsets", [False, True])
def test_packed_sequences_rotate_by_their_own_positions_as_megatrons_thd_rope(dtype, exact_offsets):
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 17, 1, 9]
    total = sum(lengths)
    cu_seqlens = torch.tensor([0, 5, 22, 23, 32], dtype=torch.int32)
    x = torch.randn(total, 4, 32, generator=gen).to(dtype)
    grad_out = torch.randn(total, 4, 32, generator=gen).to(dtype)
    # megatron's two layouts: angles of positions 0..max_len-1, or one row per packed token
    freqs = _angles(total if exact_offsets else 20, 32)
    if exact_offsets:
        freqs = freqs * 1.5  # rows that are not 0..total-1 of one sequence
    group = _SingleRankGroup()
    want = _value_and_grad(
        _apply_rotary_pos_emb_thd, x, grad_out, cu_seqlens, freqs, False, False, 1.0, group
    )
    got = _value_and_grad(fused_rope_thd, x, grad_out, cu_seqlens, freqs)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_what_the_fused_rope_does_not_cover_runs_megatrons_code():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(11, 2, 2, 64, generator=gen)
    grad_out = torch.randn(11, 2, 2, 64, generator=gen)
    partial = _angles(11, 64, rotary=32)  # rotary_percent 0.5: half of each head rotates
    want = _value_and_grad(_apply_rotary_pos_emb_bshd, x, grad_out, partial)
    got = _value_and_grad(fused_rope_bshd, x, grad_out, partial)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    full = _angles(11, 64)
    interleaved = _value_and_grad(fused_rope_bshd, x, grad_out, full, True)
    megatron = _value_and_grad(
        lambda t, f: _apply_rotary_pos_emb_bshd(t, f, rotary_interleaved=True), x, grad_out, full
    )
    assert torch.equal(interleaved[0], megatron[0])


def test_install_fills_only_empty_slots():
    saved = rope_utils.fused_apply_rotary_pos_emb, rope_utils.fused_apply_rotary_pos_emb_thd
    try:
        rope_utils.fused_apply_rotary_pos_emb = None
        rope_utils.fused_apply_rotary_pos_emb_thd = len  # stands for transformer engine's kernel
        install_fused_rope()
        assert rope_utils.fused_apply_rotary_pos_emb is fused_rope_bshd
        assert rope_utils.fused_apply_rotary_pos_emb_thd is len
    finally:
        rope_utils.fused_apply_rotary_pos_emb, rope_utils.fused_apply_rotary_pos_emb_thd = saved


def test_the_key_sets_megatrons_rope_fusion_on_cpu():
    run, _ = load_run_config("grpo_tiny_cpu", ["actor_config.use_fused_rotary_pos_emb=true"])
    assert transformer_overrides(run.actor)["apply_rope_fusion"] is True
    plain, _ = load_run_config("grpo_tiny_cpu", [])
    assert "apply_rope_fusion" not in transformer_overrides(plain.actor)


@pytest.mark.parametrize("packed", [False, True])
def test_a_gpt_model_with_the_fused_rope_computes_the_unfused_one(fresh_process, packed):
    script = Path(__file__).with_name("_fused_rope_model.py")
    res = fresh_process(script, {"arch": arch_kwargs("tiny"), "packed": packed}, timeout_s=600)
    assert res["fused_calls"] >= 2 * arch_kwargs("tiny")["num_layers"]  # queries and keys
    assert res["outputs_equal"] and res["grads_equal"]
