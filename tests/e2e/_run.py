"""Helpers for the end-to-end tests: run cli/train_grpo.py in a fresh process (the
fresh-process runner of tests/fresh_process.py: bounded, killed with its process tree by pid
on timeout) and read its outputs."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.fresh_process import REPO as ROOT
from tests.fresh_process import ProcessRun, run_process

CLI = ROOT / "cli" / "train_grpo.py"
DAPO_CLI = ROOT / "cli" / "train_dapo.py"
PPO_CLI = ROOT / "cli" / "train_ppo.py"
VOLATILE = ("time", "e2e_tps", "update_tps", "vllm_tps", "reward/score_time_s", "resharding/")
TRAIN_TIMEOUT_S = 600.0  # one tiny run, Ray and the workers' start-up included


def train_cmd(
    out: Path, *overrides: str, config: str = "grpo_tiny_cpu", cli: Path = CLI
) -> list[str]:
    """The command line of a run of `config` (a tiny-model config) writing to `out`."""
    return [
        sys.executable,
        str(cli),
        "--config-name",
        config,
        f"runtime.output_dir={out}",
        f"actor_config.save={out}/ckpt",
        *overrides,
    ]


def run_train(
    out: Path,
    *overrides: str,
    timeout_s: float = TRAIN_TIMEOUT_S,
    config: str = "grpo_tiny_cpu",
    cli: Path = CLI,
) -> ProcessRun:
    """Run the trainer to completion (returncode, stdout, stderr); each run's logs are kept in
    a new folder beside `out`. Raises FreshProcessError, after killing the run's process tree,
    on timeout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix=f"{out.name}.logs-", dir=out.parent))
    cmd = train_cmd(out, *overrides, config=config, cli=cli)
    return run_process(cmd, timeout_s=timeout_s, cwd=ROOT, log_dir=log_dir)


def checkpoint_of_step(save_dir: Path, step: int, dest: Path) -> Path:
    """A save folder holding only `save_dir`'s checkpoint of `step` (a resume starts there
    while the original run's later checkpoints stay untouched)."""
    import shutil

    name = f"iter_{step:07d}"
    shutil.copytree(save_dir / name, dest / name)
    (dest / "latest_checkpointed_iteration.txt").write_text(str(step))
    return dest


def read_metrics(out: Path) -> list[dict]:
    """The run's metrics.jsonl, one dict per record."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def comparable(record: dict) -> dict:
    """A step's metrics without wall-clock quantities."""
    return {
        k: v
        for k, v in record.items()
        if not k.startswith("timing/") and not any(k.startswith(p) for p in VOLATILE)
    }


def first_and_last_scores(metrics: list[dict], window: int = 5) -> tuple[float, float]:
    """Mean grpo/score of the first and of the last `window` steps (how much a run learned)."""
    scores = [m["grpo/score"] for m in metrics]
    return sum(scores[:window]) / window, sum(scores[-window:]) / window
