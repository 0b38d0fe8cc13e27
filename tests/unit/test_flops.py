"""The step's floor FLOPs (mindrl/planning/flops.py): a hand count on a 1-layer model, the
linear count against the megatron parameter count, and a forward pass of real HF models
(dense GQA and a top-2 MoE) under torch's FLOP counter; and the roofline table the bench
builds from them."""

from __future__ import annotations

import pytest

from mindrl.config.model_arch import ModelArchConfig
from mindrl.planning.flops import (
    StepTokens,
    attention_macs,
    forward_flops,
    linear_macs_per_token,
    phase_flops,
)
from mindrl.planning.params import layer_params

ONE_LAYER = dict(
    num_layers=1,
    hidden_size=4,
    ffn_hidden_size=8,
    num_attention_heads=2,
    vocab_size=10,
    max_position_embeddings=32,
)
GQA = dict(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=96,
    num_attention_heads=4,
    group_query_attention=True,
    num_query_groups=2,
    vocab_size=128,
    max_position_embeddings=64,
)
MOE = dict(
    GQA,
    model_type_hf="qwen3_moe",
    qk_layernorm=True,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=32,
)


def test_a_one_layer_model_by_hand():
    arch = ModelArchConfig(**ONE_LAYER)
    # qkv 4 x (4 + 4 + 4) + proj 4 x 4 + fc1 4 x 16 + fc2 8 x 4
    assert linear_macs_per_token(arch) == 48 + 16 + 64 + 32
    # 3 tokens: positions attend to 1, 2, 3 others, scores + sum, 4 query dims
    assert attention_macs(arch, 3) == 2 * 4 * (1 + 2 + 3)
    # prompt 2 + response 1: 3 tokens through the layers, one through the 4 x 10 output
    assert forward_flops(arch, 2, 1) == 2 * (160 * 3 + 48 + 40)

    # two rows sharing that prompt: its 2 tokens once (linears 2 x 160, attention 2 x 4 x 3),
    # each row's response token 160 + attention over 3 positions 2 x 4 x 3 + output 40
    pair_macs = 160 * 2 + 2 * 4 * 3 + 2 * (160 + 2 * 4 * 3 + 40)
    # one row's FLOPs: half the pair's MACs, 2 FLOPs a MAC
    assert forward_flops(arch, 2, 1, samples_per_prompt=2) == pair_macs
    with pytest.raises(ValueError, match="samples_per_prompt must be >= 1"):
        forward_flops(arch, 2, 1, samples_per_prompt=0)
    assert phase_flops(arch, StepTokens(4, 2, 1, samples_per_prompt=2))["ref"] == 2 * 2 * pair_macs

    step = StepTokens(samples=5, prompt=2, response=1)
    plain = phase_flops(arch, step)
    assert plain["rollout"] == plain["ref"] == plain["old_log_prob"] == 5 * 1136
    assert plain["update"] == 3 * 5 * 1136
    assert phase_flops(arch, step, epochs=2)["update"] == 6 * 5 * 1136
    assert phase_flops(arch, step, full_recompute=True)["update"] == 4 * 5 * 1136
    assert phase_flops(arch, step, frozen_base=True)["update"] == 2 * 5 * 1136


def test_linear_macs_are_the_layer_weights_without_norms():
    arch = ModelArchConfig(**GQA)
    norms = 2 * arch.hidden_size
    assert linear_macs_per_token(arch) == arch.num_layers * (layer_params(arch) - norms)


def _hf_forward_flops(arch: ModelArchConfig, tokens: int) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from mindrl.models.hf_arch import hf_config_from_arch

    cfg = hf_config_from_arch(arch)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "eager"  # attention as matmuls the counter sees
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, arch.vocab_size, (1, tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    return counter.get_total_flops()


@pytest.mark.parametrize("shape", [GQA, MOE], ids=["dense_gqa", "moe_top2"])
def test_the_count_matches_torchs_flop_counter_on_a_real_model(shape):
    arch = ModelArchConfig(**shape)
    tokens = 24
    measured = _hf_forward_flops(arch, tokens)
    # HF runs the output layer at every position and attention over the full square (then
    # masks it): account for both, the rest must be our count exactly
    q = arch.num_attention_heads * arch.head_dim
    full_square = 2 * 2 * arch.num_layers * q * tokens * tokens
    expected = forward_flops(arch, prompt=0, response=tokens)
    expected += full_square - 2 * attention_macs(arch, tokens)
    if arch.num_experts is not None:
        # transformers' batched expert kernel is invisible to the counter (its router and
        # everything else is counted): take the routed experts out; the hand count checks them
        expert = 3 * arch.hidden_size * arch.expert_ffn_hidden_size
        expected -= 2 * arch.num_layers * tokens * arch.moe_router_topk * expert
    assert measured == expected


def test_a_moe_layer_counts_its_top_k_experts_and_router_by_hand():
    arch = ModelArchConfig(
        **ONE_LAYER,
        model_type_hf="qwen3_moe",
        qk_layernorm=True,
        num_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=2,
    )
    # attention 48 + 16; two experts of 4 x 4 (gate, up) + 2 x 4 (down); router 4 x 8
    assert linear_macs_per_token(arch) == 64 + 2 * (16 + 8) + 32


# a step's metrics as the roofline reads them: 10 prompt and 6 response tokens per sample
STEP_RECORD = {
    "prompt_length/mean": 10.0,
    "response_length/mean": 6.0,
    "timing/rollout": 0.2,
    "timing/ref": 0.05,
    "timing/update": 0.3,
    "timing/old_log_prob": 0.0,  # not run at one epoch
}


def _tiny_run_and_rows(tmp_path, records: list[dict]):
    """grpo_tiny_cpu's RunConfig and the roofline's rows read back from `records` written as
    a metrics.jsonl."""
    import json

    from mindrl.config import load_run_config
    from tools.bench import roofline

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_run_config("grpo_tiny_cpu", check_paths=False)[0], roofline.step_rows(metrics)


def test_the_roofline_table_reads_metrics_and_skips_absent_phases(tmp_path):
    from tools.bench import roofline

    record = STEP_RECORD
    run, rows = _tiny_run_and_rows(
        tmp_path,
        [
            {"step": 1, "timing/step": 9.0, **record, "timing/rollout": 5.0},
            {"step": 2, "timing/step": 1.0, **record},
            {"step": 2, "val/score": 0.5},
        ],
    )
    table = roofline.roofline(run, rows, gflops=10.0)

    per_prompt = run.rl.algorithm.n_samples_per_prompt
    samples = run.train_prompts * per_prompt
    flops = phase_flops(run.actor.model, StepTokens(samples, 10.0, 6.0, per_prompt))
    # each prompt once for its samples: below the floor of every row running its own prompt
    assert per_prompt > 1
    assert flops["rollout"] < phase_flops(run.actor.model, StepTokens(samples, 10.0, 6.0))["ref"]
    assert set(table["phases"]) == {"rollout", "ref", "update"}  # step 1 left out, too
    rollout = table["phases"]["rollout"]
    assert rollout["measured_s"] == 0.2
    assert rollout["gflop"] == pytest.approx(flops["rollout"] / 1e9, rel=1e-3)
    assert rollout["floor_s"] == pytest.approx(flops["rollout"] / 1e10, abs=5e-5)  # 4 places
    assert rollout["floor_fraction"] == pytest.approx(flops["rollout"] / 1e10 / 0.2, abs=5e-5)
    floor = sum(p["floor_s"] for p in table["phases"].values())
    assert table["step_floor_fraction"] == pytest.approx(floor / 1.0, rel=1e-3)
    assert roofline.summary_line("tiny", table).startswith("roofline tiny: step ")


def test_the_roofline_rate_is_the_mean_of_the_rates_before_and_after_the_run(tmp_path, monkeypatch):
    """The host's speed drifts over a run: the floor takes the mean of a matmul rate measured
    before the run and one after, and the table shows both."""
    from tools.bench import roofline

    run, rows = _tiny_run_and_rows(
        tmp_path, [{"step": s, "timing/step": 1.0, **STEP_RECORD} for s in (1, 2)]
    )
    measured_after: list[str] = []

    def after(dtype: str) -> float:  # the measurement made after the run, at a known rate
        measured_after.append(dtype)
        return 30.0

    monkeypatch.setattr(roofline, "matmul_gflops", after)
    table = roofline.measure(run, rows, before_gflops=10.0)
    assert measured_after == ["fp32"]  # grpo_tiny_cpu trains in fp32
    assert table["matmul_gflops"] == 20.0
    assert table["matmul_gflops_samples"] == [10.0, 30.0]
    assert table["phases"] == roofline.roofline(run, rows, gflops=20.0)["phases"]
    assert "at 20 GFLOP/s (before / after: 10 / 30)" in roofline.summary_line("tiny", table)
    alone = roofline.measure(run, rows)
    assert alone["matmul_gflops"] == 30.0 and alone["matmul_gflops_samples"] == [30.0]
    assert "before / after" not in roofline.summary_line("tiny", alone)


MLA_TWO_LAYERS = dict(
    ONE_LAYER,
    num_layers=2,
    model_type_hf="deepseek_v3",
    multi_latent_attention=True,
    q_lora_rank=3,
    kv_lora_rank=5,
    qk_head_dim=2,
    qk_pos_emb_head_dim=1,
    v_head_dim=3,
    qk_layernorm=True,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True,
)


def test_mla_shared_experts_and_dense_layers_by_hand():
    arch = ModelArchConfig(**MLA_TWO_LAYERS)
    # attention: q latent 4 x 3 + q up 3 x 2 heads x (2 + 1); kv latent with the RoPE key
    # 4 x (5 + 1) + kv up 5 x 2 heads x (2 + 3); output 2 heads x 3 x 4
    attention = (12 + 18) + (24 + 50) + 24
    dense = 4 * 16 + 8 * 4  # layer 0: the dense MLP of ffn 8
    # layer 1: two experts of 4 x 4 + 2 x 4, the router 4 x 4, one shared expert of ffn 2
    moe = 2 * (16 + 8) + 16 + (16 + 8)
    assert linear_macs_per_token(arch) == 2 * attention + dense + moe
    # 3 tokens: 1 + 2 + 3 positions, per head scores over 2 + 1 and the sum over 3 dims
    assert attention_macs(arch, 3) == 2 * 2 * (3 + 3) * (1 + 2 + 3)
    # the weights a token meets are the parameters less the norms (2 layer norms, the latents')
    per_layer_norms = 2 * 4 + 3 + 5
    routed_idle = 2 * (4 * 4 + 2 * 4)  # 2 of the 4 experts are not the token's
    assert linear_macs_per_token(arch) == (
        layer_params(arch, layer=0)
        + layer_params(arch, layer=1)
        - 2 * per_layer_norms
        - routed_idle
    )


DEEPSEEK = dict(
    MLA_TWO_LAYERS,
    num_layers=3,
    hidden_size=64,
    ffn_hidden_size=96,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=64,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_head_dim=16,
    qk_pos_emb_head_dim=8,
    v_head_dim=16,
    num_experts=8,
    moe_router_topk=2,
    moe_ffn_hidden_size=32,
)


def test_the_mla_count_matches_torchs_flop_counter_on_a_real_deepseek():
    arch = ModelArchConfig(**DEEPSEEK)
    tokens = 24
    measured = _hf_forward_flops(arch, tokens)
    heads, value = arch.num_attention_heads, arch.v_head_dim or 0
    full_square = 2 * arch.num_layers * heads * (arch.q_head_dim + value) * tokens * tokens
    expected = forward_flops(arch, prompt=0, response=tokens)
    expected += full_square - 2 * attention_macs(arch, tokens)
    expert = 3 * arch.hidden_size * arch.expert_ffn_hidden_size
    moe_layers = sum(arch.moe_layer_pattern)
    expected -= 2 * moe_layers * tokens * arch.moe_router_topk * expert
    assert measured == expected
