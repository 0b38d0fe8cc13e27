"""Context parallelism in the plan: the rank grid (TP x PP x CP x DP), the memory plan's
activations per rank (the layers run on seq / CP tokens), the sequence chunking, and
MindSpeed-RL's own long-response DAPO configs (20k, 32k; CP 2, ring) dry-run unchanged, read
from the MindSpeed-RL mirror when this machine has it."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import torch

from mindrl.config import load_run_config
from mindrl.models.context_parallel import chunk_index, global_order
from mindrl.planning.activations import forward_activations, stage_activations
from mindrl.planning.shapes import role_shape

MIRROR = Path("/work/.mirror/Ascend+MindSpeed-RL/repo")


def test_chunks_are_megatrons_load_balanced_pairs():
    assert chunk_index(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    ranks = torch.cat([chunk_index(12, 3, r) for r in range(3)])
    assert ranks[global_order(12, 3)].tolist() == list(range(12))
    with pytest.raises(ValueError, match="multiple of 2 x CP = 4"):
        chunk_index(10, 2, 0)


def test_cp_is_in_the_rank_grid_and_halves_the_layers_activations():
    """The long-response CPU config: CP 2 on the actor and the reference."""
    run, _ = load_run_config(
        "grpo_tiny_long_cp2_cpu",
        ["rl_config.actor_resource.num_npus=4", "megatron_training.global_batch_size=4"],
    )
    assert (run.actor.cp, run.actor.dp, run.ref.cp) == (2, 2, 2)
    assert run.actor.parallel.context_parallel_algo == "megatron_cp_algo"
    shape = role_shape(run.actor, "cpu")
    assert "CP2 DP2" in shape.describe()
    whole = dataclasses.replace(shape, cp=1)
    seq = 8192
    for cp2, cp1 in (
        (stage_activations(shape, seq, 0, 1).total, stage_activations(whole, seq, 0, 1).total),
        (forward_activations(shape, seq), forward_activations(whole, seq)),
    ):
        # half the layers' tokens, plus the keys / values gathered from the other rank
        assert 0.5 * cp1 < cp2 < 0.6 * cp1, (cp2, cp1)


def test_cp_must_divide_the_devices_with_tp_and_pp():
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"x CP \(2\) = 2 does not divide"):
        load_run_config(
            "grpo_tiny_cpu",
            ["rl_config.actor_resource.num_npus=3", "actor_config.context_parallel_size=2"],
        )


def test_shared_prompts_with_cp_are_refused_at_config_time_and_not_suggested():
    from mindrl.config.errors import ConfigError
    from mindrl.config.fast_settings import fast_settings_left_off

    with pytest.raises(ConfigError, match="share_prompt_forward with actor_config's context"):
        load_run_config(
            "grpo_tiny_long_cp2_cpu",
            ["rl_config.share_prompt_forward=true", "rl_config.use_remove_padding=true"],
            local_paths=False,
        )
    run, _ = load_run_config("grpo_tiny_long_cp2_cpu", [], local_paths=False)
    assert not any("share_prompt_forward" in s for s in fast_settings_left_off(run))


def _mindspeed_configs(folder: Path, names: tuple[str, ...]) -> None:
    if not MIRROR.is_dir():
        pytest.skip("no MindSpeed-RL mirror on this machine")
    (folder / "model").mkdir(parents=True)
    for name in (*names, "model/qwen25_32b"):
        text = subprocess.run(
            ["git", f"--git-dir={MIRROR}", "show", f"HEAD:configs/{name}.yaml"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("name", ["dapo_qwen25_32b_A2_20k", "dapo_qwen25_32b_A3_32k"])
def test_mindspeed_long_response_dapo_configs_dry_run_unchanged(
    name, tmp_path, capsys, monkeypatch
):
    from mindrl.trainer.entry import main

    folder = tmp_path / "configs"
    _mindspeed_configs(folder, (name,))
    monkeypatch.delenv("MINDRL_ACCELERATOR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no_ray"))
    rc = main(["--config-path", str(folder), "--config-name", name, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "TP=8 PP=2 CP=2 DP=" in out, out
    assert "actor TP8 PP2 CP2 DP" in out  # the memory plan per rank, at CP 2
    assert not [line for line in err.splitlines() if line.startswith("error: ")], err
