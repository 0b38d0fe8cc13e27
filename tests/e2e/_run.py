"""Helpers for the end-to-end tests: run cli/train_grpo.py in a subprocess and read its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "cli" / "train_grpo.py"
VOLATILE = ("time", "e2e_tps", "update_tps", "vllm_tps", "reward/score_time_s", "resharding/")


def train_cmd(out: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        str(CLI),
        "--config-name",
        "grpo_tiny_cpu",
        f"runtime.output_dir={out}",
        f"actor_config.save={out}/ckpt",
        *overrides,
    ]


def run_train(out: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_cmd(out, *overrides), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def comparable(record: dict) -> dict:
    """A step's metrics without wall-clock quantities."""
    return {
        k: v
        for k, v in record.items()
        if not k.startswith("timing/") and not any(k.startswith(p) for p in VOLATILE)
    }
