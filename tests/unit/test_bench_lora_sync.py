"""tools/bench/lora_sync.py's bookkeeping: per-step cost and break-even of the two sync paths,
greedy token agreement, the adapter names and config, the summary line (no engine)."""

from __future__ import annotations

import math

import pytest

from tools.bench import lora_sync
from tools.bench.lora_sync import PathCost, break_even_tokens, cheaper_path, verdict


def test_step_cost_is_one_sync_plus_the_tokens_at_the_paths_rate():
    assert PathCost(sync_s=2.0, tok_per_s=100.0).step_seconds(500) == pytest.approx(7.0)


def test_break_even_when_lora_syncs_faster_but_generates_slower():
    merged, lora = PathCost(2.0, 100.0), PathCost(0.5, 50.0)
    # 1.5 s saved per sync, 0.01 s lost per token: equal at 150 tokens
    n = break_even_tokens(merged, lora)
    assert n == pytest.approx(150.0)
    assert merged.step_seconds(n) == pytest.approx(lora.step_seconds(n))
    assert cheaper_path(merged, lora, 100) == "lora"
    assert cheaper_path(merged, lora, 200) == "merged"
    assert verdict(merged, lora) == "lora below N=150 tokens/step, merged above"


def test_break_even_the_other_way_round():
    merged, lora = PathCost(0.5, 50.0), PathCost(2.0, 100.0)
    assert break_even_tokens(merged, lora) == pytest.approx(150.0)
    assert verdict(merged, lora) == "merged below N=150 tokens/step, lora above"


@pytest.mark.parametrize(
    ("merged", "lora", "winner"),
    [
        (PathCost(2.0, 100.0), PathCost(0.5, 100.0), "lora"),  # same rate, cheaper sync
        (PathCost(2.0, 100.0), PathCost(0.5, 120.0), "lora"),  # better at both
        (PathCost(0.5, 100.0), PathCost(2.0, 80.0), "merged"),  # worse at both
        (PathCost(1.0, 100.0), PathCost(1.0, 90.0), "merged"),  # same sync, slower tokens
    ],
)
def test_no_break_even_when_one_path_wins_at_every_size(merged, lora, winner):
    assert break_even_tokens(merged, lora) is None
    assert verdict(merged, lora) == f"{winner} at every N"
    for n in (1, 1e3, 1e6):
        assert cheaper_path(merged, lora, n) == winner


def test_token_match_counts_positions_prefixes_and_whole_sequences():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert lora_sync.token_match(ref, ref) == {
        "position_match": 1.0,
        "prefix_match": 1.0,
        "identical_sequences": 1.0,
    }
    other = [[1, 2, 3, 4], [5, 9, 7, 8]]  # one token differs; greedy runs diverge after it
    assert lora_sync.token_match(ref, other) == {
        "position_match": 7 / 8,
        "prefix_match": 5 / 8,
        "identical_sequences": 0.5,
    }
    assert lora_sync.token_match([[1, 2]], [[1]])["position_match"] == 0.5  # a short one
    with pytest.raises(ValueError):
        lora_sync.token_match(ref, ref[:1])


def test_targets_are_the_seven_projections_and_their_biases_travel_with_them():
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
    ]
    targets = lora_sync.lora_target_names(names)
    assert [t.split(".")[-2] for t in targets] == list(lora_sync.TARGET_MODULES)
    sent = lora_sync.layer_tensor_names(names, targets)
    assert sent == names[2:10]  # the q bias included, embedding and norms left out


def test_adapter_config_has_the_keys_peft_and_vllm_read():
    cfg = lora_sync.peft_adapter_config(16, 32, "/models/base")
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 16 and cfg["lora_alpha"] == 32
    assert cfg["target_modules"] == sorted(lora_sync.TARGET_MODULES)
    assert cfg["base_model_name_or_path"] == "/models/base"


def test_median_and_summary_line():
    assert lora_sync.median([3.0, 1.0, 2.0]) == 2.0
    assert lora_sync.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(lora_sync.median([]))
    models = {
        "tiny": {
            "merged": {"sync_s": 0.147, "tok_per_s": 166.0},
            "lora": {"sync_s": 0.009, "tok_per_s": 59.6},
            "verdict": "lora below N=13 tokens/step, merged above",
            "greedy_match": 1.0,
        },
        "smollm2": {"error": "lora: RuntimeError: no LoRA here"},
    }
    assert lora_sync.format_summary(models) == (
        "lora_sync: tiny sync merged 0.147s lora 0.009s, tok/s merged 166 lora 60, "
        "lora below N=13 tokens/step, merged above, greedy match 1.000; "
        "smollm2 error: lora: RuntimeError: no LoRA here"
    )
