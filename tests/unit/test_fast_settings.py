"""The fast settings each config leaves off (mindrl/config/fast_settings.py): none in the
SmolLM2 CPU configs, only what cannot apply or is kept on purpose in the tiny ones, the
benchmarks' list in MindSpeed-RL's own configs (whose values stay theirs), and the one line
the dry run prints."""

from __future__ import annotations

import pytest

from mindrl.accelerator.cpu_precision import fast_cpu_precision
from mindrl.config import load_run_config
from mindrl.config.fast_settings import fast_settings_left_off, fast_settings_line

REFERENCE_LAYOUT = (
    "rl_config.use_integrated_worker: true with reference_in_actor: true (no ref_config)"
)
PACKING = [
    "rl_config.use_remove_padding: true",
    "rl_config.use_dynamic_bsz: true (with *_max_packing_token_size budgets)",
]


def _left_off(config: str, *overrides: str) -> list[str]:
    return fast_settings_left_off(load_run_config(config, list(overrides), check_paths=False)[0])


def _fp32_note() -> list[str]:
    """What an fp32 CPU config is told on this machine: bf16 where bf16 is its fast path."""
    fast = fast_cpu_precision()
    return ["megatron_training.bf16: true (this CPU's fast matmuls: bf16)"] if fast.bf16 else []


@pytest.mark.parametrize("name", ["grpo_smollm2_cpu", "gspo_smollm2_cpu", "dapo_smollm2_cpu"])
def test_the_smollm2_configs_ship_every_fast_setting(name):
    # their precision is the machine's own (${cpu_precision:...}), so none is left off here
    assert _left_off(name) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("grpo_tiny_cpu", [REFERENCE_LAYOUT]),  # its reference worker is kept on purpose
        ("gspo_tiny_cpu", [REFERENCE_LAYOUT]),
        ("grpo_lora_tiny_cpu", []),  # the reference is already the LoRA base
        ("dapo_tiny_cpu", []),  # no reference model
        ("ppo_tiny_cpu", []),
        # MoE: no packing (the router's loss would change); vLLM eager (its compiled mode over
        # the CPU MoE experts is not checked)
        (
            "grpo_tiny_moe_cpu",
            [
                REFERENCE_LAYOUT,
                *PACKING,
                "rl_config.share_prompt_forward: true",
                "generate_config.enforce_eager: false",
            ],
        ),
        (
            # its rollout is the HF engine, so vLLM's compiled mode is not listed
            "grpo_tiny_deepseek_cpu",
            [REFERENCE_LAYOUT, *PACKING, "rl_config.share_prompt_forward: true"],
        ),
    ],
)
def test_the_tiny_configs_leave_off_only_what_is_kept_on_purpose(name, expected):
    assert _left_off(name) == [*expected, *_fp32_note()]


def test_a_setting_turned_off_is_named_and_one_that_cannot_apply_is_not():
    off = _left_off(
        "grpo_smollm2_cpu",
        "rl_config.share_prompt_forward=false",
        "generate_config.enforce_eager=true",
        "rl_config.reference_in_actor=false",
    )
    assert off == [
        "rl_config.reference_in_actor: true",  # the integrated worker is already on
        "rl_config.share_prompt_forward: true",
        "generate_config.enforce_eager: false",
    ]
    # the HF rollout engine has no compiled mode; one optimizer step needs no in_update
    assert (
        _left_off(
            "grpo_smollm2_cpu",
            "generate_config.enforce_eager=true",
            "generate_config.rollout_backend=hf",
        )
        == []
    )


def test_mindspeed_rl_configs_keep_their_values_and_are_told_what_is_off():
    run = load_run_config("grpo_qwen25_7b", check_paths=False)[0]
    mb = run.rl.micro_batching
    assert not mb.use_remove_padding and not mb.use_dynamic_bsz and run.generate.enforce_eager
    off = fast_settings_left_off(run)
    assert off[:3] == [REFERENCE_LAYOUT, *PACKING]
    assert "generate_config.enforce_eager: false" in off
    # NPU: shared prompts are refused there and the CPU precision probe is not asked
    assert not any("share_prompt_forward" in o or "bf16" in o for o in off)
    assert fast_settings_line(run) == "fast settings left off: " + "; ".join(off)


def test_the_dry_run_prints_the_line(capsys):
    from mindrl.trainer.entry import main

    assert main(["--config-name", "grpo_smollm2_cpu", "--dry-run"]) == 0
    assert "fast settings left off: none\n" in capsys.readouterr().out
    assert main(["--config-name", "grpo_tiny_cpu", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fast settings")]
    assert lines == ["fast settings left off: " + "; ".join([REFERENCE_LAYOUT, *_fp32_note()])]
