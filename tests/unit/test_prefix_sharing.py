"""Rows sharing a prompt (`rl_config.share_prompt_forward`, mindrl.data.prefix_sharing): the
block layout, the planning by a budget that counts a prompt once, the attention over blocks
against each row's own causal attention, and the key's refusals (the multi-process loss and
gradient parity: tests/integration/test_packing.py)."""

from __future__ import annotations

import pytest
import torch

from mindrl.data.batch import build_sample_batch
from mindrl.data.packing import PackingSettings, balanced_partitions
from mindrl.data.prefix_sharing import (
    pack_shared,
    plan_shared_micro_batches,
    prompt_families,
    shared_group_tokens,
)
from tests.layouts import PADDED_LAYOUT

A, B = [5, 6, 7], [8, 9]


def _batch(prompts: list[list[int]], responses: list[list[int]]):
    return build_sample_batch(prompts, responses, 0)


def test_rows_with_the_same_prompt_tokens_form_a_family_wherever_they_sit():
    batch = _batch([A, B, A, A[:2]], [[1], [2], [3, 4], [5]])
    assert prompt_families(batch.input_ids, batch.prompt_lengths) == [[0, 2], [1], [3]]


def test_a_block_holds_the_prompt_once_then_each_response_at_its_own_positions():
    batch = _batch([A, B, A], [[10, 11], [12], [13, 14, 15]])
    rows = pack_shared(batch.input_ids, batch.attention_mask, batch.prompt_lengths, multiple=4)
    assert rows.tokens[0].tolist() == [5, 6, 7, 10, 11, 13, 14, 15, 8, 9, 12, 0]
    assert rows.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 2, 0]
    assert rows.segments.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 0, 0, 1, 0]
    assert rows.block_bounds.tolist() == [0, 8, 11, 12]  # the padding tail is a block
    assert rows.real_tokens == 11
    assert rows.rope_length == 6


def test_each_scored_cell_reads_its_own_rows_token_and_predicts_its_next():
    batch = _batch([A, B, A, A], [[10, 11], [12], [13, 14, 15], [16]])
    rows = pack_shared(batch.input_ids, batch.attention_mask, batch.prompt_lengths)
    sel = rows.selection(batch.response_mask, batch.input_ids)
    _, packed_cols, _ = sel.model_cells()
    # the hidden state read for cell (r, j) is row r's token j at row r's position j
    assert torch.equal(rows.tokens[0, packed_cols], batch.input_ids[sel.rows, sel.cols])
    assert torch.equal(rows.position_ids[0, packed_cols], sel.cols)
    assert torch.equal(sel.labels(rows.tokens), batch.input_ids[sel.rows, sel.cols + 1])
    assert torch.equal(sel.scatter(torch.ones(sel.size)), batch.response_mask.float())
    assert packed_cols.tolist() == sorted(packed_cols.tolist())  # megatron's sequence order
    # the three rows of prompt A read its last token (position 2) for their first response token
    assert (packed_cols == 2).sum() == 3


@pytest.mark.parametrize("multiple", [1, 8])  # 8: a padding tail after the last block
def test_attention_over_blocks_equals_each_rows_own_causal_attention(multiple):
    from mindrl.models.shared_prefix import shared_prefix_params

    gen = torch.Generator().manual_seed(0)
    batch = _batch([A, B, A, A], [[10, 11], [12], [13, 14, 15], [16]])
    rows = pack_shared(
        batch.input_ids, batch.attention_mask, batch.prompt_lengths, multiple=multiple
    )
    total, heads, kv_heads, dim = rows.tokens.shape[1], 4, 2, 8
    # per-token features that depend only on (token, position), as q / k / v do after RoPE
    table = torch.randn(20, 8, heads + 2 * kv_heads, dim, generator=gen)
    feats = table[rows.tokens[0], rows.position_ids[0]]
    q, k, v = feats.split([heads, kv_heads, kv_heads], dim=1)
    params = shared_prefix_params(rows, "cpu")
    layout = params.attention_layout(q.device, q.dtype)
    assert params.attention_layout(q.device, q.dtype) is layout  # built once per micro-batch
    out = layout.attend(q, k, v, scale=0.3, dropout=0.0).view(total, heads, dim)
    assert torch.isfinite(out).all()  # the padding tail too
    sel = rows.selection(batch.response_mask, batch.input_ids)
    _, packed_cols, _ = sel.model_cells()
    for r, j, p in zip(sel.rows.tolist(), sel.cols.tolist(), packed_cols.tolist()):
        n = j + 1  # row r's tokens 0..j, at positions 0..j
        own = table[batch.input_ids[r, :n], torch.arange(n)]
        rq, rk, rv = own.split([heads, kv_heads, kv_heads], dim=1)
        rk, rv = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (rk, rv))
        weights = torch.softmax(torch.einsum("hd,khd->hk", rq[-1], rk) * 0.3, dim=-1)
        expected = torch.einsum("hk,khd->hd", weights, rv)
        assert torch.allclose(out[p], expected, atol=1e-6), (r, j)
    assert (
        rows.real_tokens
        == shared_group_tokens(
            batch.input_ids, batch.attention_mask, batch.prompt_lengths, [[0, 1, 2, 3]]
        )[0]
    )


def test_items_standing_for_several_rows_count_them_against_the_row_cap():
    groups = balanced_partitions([10, 10, 10], 100, max_rows=4, rows=[3, 3, 1])
    assert sorted(sorted(g) for g in groups) == [[0, 2], [1]]
    with_one_row_each = balanced_partitions([10, 10, 10], 100, max_rows=4)
    assert with_one_row_each == [[0, 1, 2]]


def test_budgets_count_a_shared_prompt_once_and_keep_its_rows_together():
    prompts = [[1] * 20] * 4 + [[2] * 20] * 4
    batch = _batch(prompts, [[7] * 10] * 8)
    settings = PackingSettings(remove_padding=True, dynamic_bsz=True, max_tokens=60)
    groups = plan_shared_micro_batches(
        batch.input_ids, batch.attention_mask, batch.prompt_lengths, settings, 4
    )
    # one prompt and its four responses: 20 + 4 x 10 = 60 tokens (4 x 30 unshared)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a budget below a family's block cuts it (its prompt once per piece), rows capped too
    small = PackingSettings(remove_padding=True, dynamic_bsz=True, max_tokens=45, max_rows=2)
    groups = plan_shared_micro_batches(
        batch.input_ids, batch.attention_mask, batch.prompt_lengths, small, 4
    )
    assert sorted(sum(groups, [])) == list(range(8))
    fed = shared_group_tokens(batch.input_ids, batch.attention_mask, batch.prompt_lengths, groups)
    for g, tokens in zip(groups, fed):
        assert len(g) <= 2
        assert tokens <= 45
    assert len(groups) == 4
    # without dynamic batch sizes: micro_batch_size rows in batch order
    fixed = PackingSettings(remove_padding=True, share_prompts=True)
    assert plan_shared_micro_batches(
        batch.input_ids, batch.attention_mask, batch.prompt_lengths, fixed, 3
    ) == [[0, 1, 2], [3, 4, 5], [6, 7]]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([], "set use_remove_padding: true with it"),
        (["rl_config.use_remove_padding=true", "runtime.accelerator=npu"], "local attention"),
    ],
)
def test_sharing_prompts_needs_packing_and_the_local_attention(overrides, match):
    from mindrl.config import load_run_config
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_run_config(
            "grpo_tiny_cpu",
            [*PADDED_LAYOUT, "rl_config.share_prompt_forward=true", *overrides],
            check_paths=False,
        )


def test_the_driver_counts_the_tokens_a_shared_pass_feeds():
    from mindrl.config import load_run_config
    from mindrl.trainer.step_metrics import pass_padding_fraction

    batch = _batch([A] * 4, [[1, 2], [3], [4, 5, 6], [7]])

    def fraction(*overrides: str) -> float:
        run, _ = load_run_config(
            "grpo_tiny_cpu",
            ["actor_config.micro_batch_size=4", "rl_config.use_remove_padding=true", *overrides],
            check_paths=False,
        )
        return pass_padding_fraction(batch, run, run.actor, "actor")

    assert fraction() == 0.0
    assert fraction("rl_config.share_prompt_forward=true") == 0.0  # 3 + 7 tokens, none padding


def test_left_padded_rows_and_rows_shorter_than_their_prompt_are_refused():
    batch = _batch([A, A], [[1, 2], [3]])
    with pytest.raises(ValueError, match="right-padded"):
        pack_shared(batch.input_ids, batch.attention_mask.flip(-1), batch.prompt_lengths)
    with pytest.raises(ValueError, match="shorter than its prompt"):
        pack_shared(batch.input_ids, batch.attention_mask, batch.prompt_lengths + 3)


def test_sharing_prompts_without_packing_is_refused_where_settings_are_made():
    with pytest.raises(ValueError, match="needs remove_padding"):
        PackingSettings(share_prompts=True)
