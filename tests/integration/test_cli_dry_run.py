"""`cli/train_grpo.py --dry-run`: composes, validates, prints the config and the placement plan,
starts nothing; a bad config fails before Ray is even imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "cli" / "train_grpo.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_dry_run_of_the_embedded_default(tiny_model_dir):
    proc = _cli("--config-name", "grpo_tiny_cpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# resolved config: grpo_tiny_cpu" in out
    assert "accelerator: cpu (backend gloo)" in out
    assert "group actor+ref: 1 device(s)" in out
    assert "actor    devices=1 TP=1 PP=1 DP=1" in out
    assert "nothing started" in out


def test_dry_run_with_overrides_changes_the_plan(tiny_model_dir):
    proc = _cli(
        "--config-name=grpo_tiny_cpu",
        "--dry-run",
        "rl_config.actor_resource.num_npus=2",
        "actor_config.tensor_model_parallel_size=2",
        "rl_config.colocate_actor_ref=false",
        "+rl_config.reference_resource.num_npus=1",
        "runtime.ray_num_cpus=4",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "actor    devices=2 TP=2 PP=1 DP=1" in proc.stdout
    assert "group ref: 1 device(s)" in proc.stdout


def test_resources_that_do_not_fit_are_rejected(tiny_model_dir):
    proc = _cli(
        "--config-name",
        "grpo_tiny_cpu",
        "--dry-run",
        "rl_config.actor_resource.num_npus=2",
        "runtime.ray_num_cpus=1",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the run needs 2 CPU (actor+ref=2) but the cluster has 1 over 1 node(s)" in proc.stderr


def test_bad_config_fails_before_ray_is_imported():
    code = (
        "import sys; sys.argv=['x','--config-name','r1_zero_qwen25_7b','--dry-run','actor_config.lrr=1'];"
        "from mindrl.trainer.entry import main; rc = main();"
        "print('RC', rc, 'RAY', 'ray' in sys.modules, 'VLLM', 'vllm' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert "RC 2 RAY False VLLM False" in proc.stdout, proc.stdout + proc.stderr
    assert "actor_config.lrr: unknown key (did you mean 'lr'?)" in proc.stderr


def test_unknown_flag_and_missing_config_name():
    proc = _cli("--config-name", "grpo_tiny_cpu", "--dryrun")
    assert proc.returncode == 2 and "--dryrun" in proc.stderr
    proc = _cli("--dry-run")
    assert proc.returncode == 2 and "--config-name" in proc.stderr
