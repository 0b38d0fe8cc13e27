"""LoRA on megatron-core over gloo (several processes, fp32): the optimizer holds exactly the
adapters, the losses are the same at TP 1, TP 2 with sequence parallelism and PP 2, the
shared-backbone reference is the frozen base (equal to the policy before training, unchanged
after), and the merged HF export gives transformers the trained policy's log-probs (the
adapter-only checkpoint's exact resume runs end to end in tests/e2e/test_lora_tiny_grpo.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("_lora_rank.py")
TIMEOUT_S = 300.0
TOL = 1e-5
RANK = 4
LOSSES = ("actor/pg_loss", "actor/kl_loss", "grad_norm")


def _train(fresh_process, hf_dir: str, world: int, overrides: list[str], **extra: Any) -> dict:
    args = {"hf_dir": hf_dir, "overrides": overrides, "steps": 2, **extra}
    results = fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)
    for other in results[1:]:
        assert other["metrics"] == results[0]["metrics"]
    return results[0]


def _same_losses(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        for key in LOSSES:
            assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (step, key, x[key], y[key])


def _adapter_elements(hf_dir: Path) -> int:
    """r x (in + out) per adapted linear, from the model's config."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    h, ffn = cfg["hidden_size"], cfg["intermediate_size"]
    head = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head, cfg["num_key_value_heads"] * head
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * ffn) + (ffn + h)
    return RANK * per_layer * cfg["num_hidden_layers"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir) -> dict:
    """TP 1, four steps: the reference run the others are compared with."""
    from tests.fresh_process import FreshProcess

    fresh = FreshProcess(tmp_path_factory.mktemp("lora") / "fresh")
    return _train(fresh, str(tiny_model_dir), 1, [], steps=4)


def test_optimizer_holds_only_the_adapters_and_the_base_stays_frozen(straight, tiny_model_dir):
    expected = _adapter_elements(tiny_model_dir)
    assert straight["trainable_params"] == expected
    assert straight["optimizer_params"] == expected
    assert straight["total_params"] > 20 * expected
    gaps = straight["gaps"]
    assert gaps["policy_vs_base_before"] == 0.0  # B starts at zero: the adapters add nothing
    assert gaps["base_before_vs_after"] == 0.0  # the shared-backbone reference never moves
    assert gaps["policy_vs_base_after"] > 1e-3  # ... while the adapted policy learned


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor_config.tensor_model_parallel_size=2", "megatron_training.sequence_parallel=true"],
        ["actor_config.pipeline_model_parallel_size=2"],
    ],
    ids=["tp2_sp", "pp2"],
)
def test_same_losses_at_another_layout(fresh_process, tiny_model_dir, straight, overrides):
    run = _train(fresh_process, str(tiny_model_dir), 2, overrides, steps=4)
    _same_losses(run["metrics"], straight["metrics"])
    assert run["trainable_params"] == straight["trainable_params"]
    assert run["total_params"] == straight["total_params"]


def _hf_log_probs(model, batch):
    import torch

    mask = batch.attention_mask
    with torch.no_grad():
        logits = model(
            batch.input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    ids = batch.input_ids
    lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lp * batch.response_mask


def test_merged_and_peft_exports_are_the_trained_policy(
    fresh_process, tiny_model_dir, straight, tmp_path
):
    """Weights leave training merged (W + alpha/r B A): what the rollout engine and the HF
    export receive; the adapters alone leave as a PEFT folder. transformers on the merged
    export, and peft's LoRA over the base, both reproduce the trained policy's log-probs (at
    TP 2: the fused QKV / gate-up adapters split like the weights)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mindrl.config import load_run_config
    from tests.integration._scale_rank import synthetic_batch

    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    run = _train(
        fresh_process,
        str(tiny_model_dir),
        2,
        ["actor_config.tensor_model_parallel_size=2"],
        steps=4,
        export=str(merged),
        peft=str(adapter),
    )
    _same_losses(run["metrics"], straight["metrics"])
    cfg, _ = load_run_config("grpo_tiny_cpu", [f"actor_config.load={tiny_model_dir}"])
    batch = synthetic_batch(cfg.actor.model.vocab_size)
    policy = torch.tensor(run["policy"])
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    assert float((_hf_log_probs(model, batch) - policy).abs().max()) < 1e-4
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    changed = [
        name
        for name, p in model.state_dict().items()
        if not torch.equal(p, base.state_dict()[name])
    ]
    assert changed and all(n.endswith("proj.weight") for n in changed), changed
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["base_model_name_or_path"] == str(tiny_model_dir)
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    assert float((_hf_log_probs(peft_model, batch) - policy).abs().max()) < 1e-4
