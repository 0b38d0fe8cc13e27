"""Sequence packing's planning and layout (mindrl.data.packing), the segmented attention
against a block-diagonal mask, the driver's padding metric, and the config keys' fates
(the multi-process loss and gradient parity: tests/integration/test_packing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mindrl.data.batch import build_sample_batch
from mindrl.data.packing import (
    PackingSettings,
    balanced_partitions,
    pack_rows,
    pass_packing,
    plan_micro_batches,
)
from tests.layouts import PADDED_LAYOUT


def _every_row_once(groups: list[list[int]], n: int) -> None:
    assert sorted(sum(groups, [])) == list(range(n))


def test_partitions_fit_the_budget_in_as_few_groups_as_it_allows():
    lengths = [10, 9, 8, 1, 1, 1]
    groups = balanced_partitions(lengths, 15)
    _every_row_once(groups, 6)
    assert all(sum(lengths[i] for i in g) <= 15 for g in groups)
    assert len(groups) == 3  # 30 tokens need 2, but 10 + 9 + 8 cannot share 2 groups of 15
    assert all(g == sorted(g) for g in groups)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)


def test_partitions_balance_tokens_and_respect_row_caps_and_a_minimum_count():
    lengths = [5] * 8
    assert [len(g) for g in balanced_partitions(lengths, 20)] == [4, 4]
    capped = balanced_partitions(lengths, 100, max_rows=3)
    assert len(capped) == 3 and max(len(g) for g in capped) <= 3
    _every_row_once(capped, 8)
    assert len(balanced_partitions(lengths, 100, min_parts=5)) == 5
    assert len(balanced_partitions([5, 5], 100, min_parts=5)) == 2  # never an empty group


def test_a_sample_longer_than_the_budget_names_the_key():
    with pytest.raises(ValueError, match="sample 1 has 50 tokens.*max_packing_token_size=40"):
        balanced_partitions([10, 50], 40)


def test_without_dynamic_batches_micro_batches_keep_micro_batch_size_rows_in_order():
    settings = PackingSettings(remove_padding=True)
    assert plan_micro_batches([3, 4, 5, 6, 7], settings, 2) == [[0, 1], [2, 3], [4]]


def test_each_pass_reads_its_own_budget_as_mindspeed_rl_does():
    from mindrl.config import load_run_config

    run, _ = load_run_config(
        "grpo_tiny_moe_cpu",  # sets no budget: each pass keeps MindSpeed-RL's default
        [
            "rl_config.use_remove_padding=true",
            "rl_config.use_dynamic_bsz=true",
            "rl_config.max_packing_token_size=999",  # sets none of the passes' budgets
            "rl_config.ref_max_packing_token_size=300",
            "rl_config.update_dynamic_max_batch_size=4",
        ],
        check_paths=False,
    )
    cfg = run.rl.micro_batching
    assert pass_packing(cfg, "ref") == PackingSettings(True, True, 300, None)
    assert pass_packing(cfg, "actor") == PackingSettings(True, True, 4096, None)
    assert pass_packing(cfg, "update") == PackingSettings(True, True, 4096, 4)
    with pytest.raises(ValueError, match="pass must be one of"):
        pass_packing(cfg, "critic")


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = build_sample_batch([[5, 6], [7], [8, 9, 10]], [[11, 12, 13], [14, 15], [16]], 0)
    return batch.input_ids, batch.attention_mask, batch.response_mask


def test_packed_rows_restart_positions_and_segments_at_each_sample():
    ids, mask, _ = _rows()
    packed = pack_rows(ids, mask, multiple=4)
    assert packed.tokens.tolist() == [[5, 6, 11, 12, 13, 7, 14, 15, 8, 9, 10, 16]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]]
    assert packed.cu_seqlens.tolist() == [0, 5, 8, 12]
    assert packed.max_seqlen == 5
    fixed = pack_rows(ids, mask, length=16)  # the pipeline's one length: a padding segment
    assert fixed.cu_seqlens.tolist() == [0, 5, 8, 12, 16]
    assert fixed.position_ids[0, 12:].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="exceeds the fixed length"):
        pack_rows(ids, mask, length=10)


def test_packed_selection_reads_each_response_token_from_its_own_position():
    ids, mask, response = _rows()
    packed = pack_rows(ids, mask)
    selection = packed.selection(response)
    wanted = response.nonzero().tolist()
    assert sorted(zip(selection.rows.tolist(), selection.cols.tolist())) == sorted(
        map(tuple, wanted)
    )
    # the label read in the packed sequence is the token the grid cell predicts
    assert torch.equal(selection.labels(packed.tokens), ids[selection.rows, selection.cols + 1])
    assert selection.model_cols.tolist() == sorted(selection.model_cols.tolist())
    grid = selection.scatter(torch.ones(selection.size))
    assert torch.equal(grid, response)


def test_left_padded_rows_are_refused():
    ids = torch.tensor([[0, 5, 6]])
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(ids, torch.tensor([[0, 1, 1]]))


def test_segmented_attention_equals_a_block_diagonal_causal_mask_with_grouped_heads():
    from mindrl.models.packed_attention import segmented_causal_attention

    gen = torch.Generator().manual_seed(0)
    t, heads, groups, dim = 11, 4, 2, 8
    q = torch.randn(t, heads, dim, generator=gen)
    k = torch.randn(t, groups, dim, generator=gen)
    v = torch.randn(t, groups, dim, generator=gen)
    cu = torch.tensor([0, 4, 5, 11], dtype=torch.int32)
    out = segmented_causal_attention(q, k, v, cu, scale=dim**-0.5)

    segment = torch.repeat_interleave(torch.arange(3), cu[1:] - cu[:-1])
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(t, t).tril().bool()
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * dim**-0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hqk,khd->qhd", probs, vv).reshape(t, -1)
    assert out.shape == (t, heads * dim)
    assert torch.allclose(out, expected, atol=1e-6)


def test_driver_padding_fraction_counts_what_each_layout_feeds():
    from mindrl.config import load_run_config
    from mindrl.trainer.step_metrics import pass_padding_fraction

    prompts = [[5] * 4, [5] * 2, [5] * 6, [5] * 2]
    responses = [[6] * 4, [6] * 2, [6] * 2, [6] * 2]  # lengths 8, 4, 8, 4
    batch = build_sample_batch(prompts, responses, 0)

    def fraction(*overrides: str) -> float:
        run, _ = load_run_config(
            "grpo_tiny_cpu",
            [*PADDED_LAYOUT, "actor_config.micro_batch_size=2", *overrides],
            check_paths=False,
        )
        return pass_padding_fraction(batch, run, run.actor, "actor")

    # padded: micro-batches [8, 4] and [8, 4], each fed 2 x 8 = 32 tokens for 24 real
    assert fraction() == pytest.approx(1 - 24 / 32)
    assert fraction("rl_config.use_remove_padding=true") == 0.0
    # budget 12 without packing: [8, 4] twice again, balanced by tokens
    assert fraction(
        "rl_config.use_dynamic_bsz=true", "rl_config.actor_max_packing_token_size=12"
    ) == pytest.approx(1 - 24 / 32)


def test_budgeted_micro_batches_under_a_pipeline_need_packing():
    from mindrl.config import load_run_config
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match="use_dynamic_bsz.*sends one micro-batch shape"):
        load_run_config(
            "grpo_tiny_cpu",
            [
                "actor_config.pipeline_model_parallel_size=2",
                "rl_config.actor_resource.num_npus=2",
                *PADDED_LAYOUT,
                "rl_config.use_dynamic_bsz=true",
            ],
            check_paths=False,
        )


def test_the_memory_plan_counts_a_budgeted_micro_batch_as_its_tokens():
    from mindrl.config import load_run_config
    from mindrl.planning.phases import build_plan
    from mindrl.planning.shapes import Lengths

    budget = [
        "rl_config.use_dynamic_bsz=true",
        "rl_config.update_max_packing_token_size=1000",
        "rl_config.ref_max_packing_token_size=3000",
    ]
    # grpo_tiny_cpu: a reference worker of its own (ref_config)
    padded, _ = load_run_config("grpo_tiny_cpu", list(PADDED_LAYOUT), check_paths=False)
    run, _ = load_run_config("grpo_tiny_cpu", [*PADDED_LAYOUT, *budget], check_paths=False)
    seq = Lengths.of(run).seq
    shapes = {p.role: p.shape.micro_batch for p in build_plan(run, "cpu").roles}
    assert shapes == {"actor": -(-1000 // seq), "ref": -(-3000 // seq)}
    plain = {p.role: p.shape.micro_batch for p in build_plan(padded, "cpu").roles}
    assert plain == {"actor": 8, "ref": 16}  # the config's micro_batch_size


def test_a_row_cap_below_one_is_refused():
    from mindrl.config import load_run_config
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match="update_dynamic_max_batch_size"):
        load_run_config(
            "grpo_tiny_cpu", ["rl_config.update_dynamic_max_batch_size=0"], check_paths=False
        )


def test_fused_padded_attention_equals_megatrons_on_the_real_tokens(fresh_process):
    """Left-padded causal batch, grouped-query heads: torch's fused kernel gives megatron's
    unfused outputs and gradients on the real tokens, and nothing non-finite on the padding
    (a fully masked padding row attends to itself)."""
    script = Path(__file__).with_name("_fused_attention.py")
    res = fresh_process(script, {}, timeout_s=300)
    assert res["fused_ok"] and res["finite"]
    assert res["max_abs_diff"] < 1e-5
