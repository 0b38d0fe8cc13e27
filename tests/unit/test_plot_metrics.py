"""tools/plot_metrics.py: a PNG with one subplot per metric family present in the JSONL."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path

from mindrl.trainer.metrics import MetricsLogger
from tools import plot_metrics as tool


def write_run(out: Path, steps: int = 30) -> Path:
    """A metrics.jsonl written by the real logger: noisy rising reward, a NaN entropy step."""
    rng = random.Random(0)
    with MetricsLogger(out, use_tensorboard=False, total_steps=steps, stream=io.StringIO()) as m:
        for s in range(1, steps + 1):
            acc = min(1.0, s / steps + rng.uniform(-0.2, 0.2))
            m.log(
                s,
                {
                    "grpo/score": acc + 0.1,
                    "base_acc_rewards/mean": acc,
                    "strict_format_rewards/mean": 0.1,
                    "response_length/mean": 100 - s,
                    "response_length/max": 150 - s,
                    "response_length/min": 50 - s,
                    "actor/kl_loss": 0.001 * s,
                    "actor/ppo_kl": 0.0005 * s,
                    "actor/entropy": float("nan") if s == 5 else 2.0 - s / steps,
                    "timing/step": 7.0 + rng.random(),
                    "timing/rollout": 4.0 + rng.random(),
                    "actor/lr": 1e-6,
                },
            )
            if s % 10 == 0:  # validation: a second record of the same step
                m.log(s, {"val/score": s / steps, "val/base_acc_rewards/mean": s / steps})
    return out / "metrics.jsonl"


def test_plot_writes_png_with_one_subplot_per_family(tmp_output_dir: Path) -> None:
    import matplotlib.image as mpimg

    jsonl = write_run(tmp_output_dir)
    records = tool.load_metrics(jsonl)
    fig = tool.make_figure(records)
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "reward",
        "response length",
        "KL",
        "entropy",
        "timing",
        "validation",
    ]
    val_lines = {line.get_label(): line for line in fig.axes[5].get_lines()}
    assert sorted(val_lines) == ["val/base_acc_rewards/mean", "val/score"]
    assert list(val_lines["val/score"].get_xdata()) == [10, 20, 30]
    # the merged step-10 record keeps both its training and its validation metrics
    step10 = next(r for r in records if r["step"] == 10)
    assert step10["val/score"] == 10 / 30 and "grpo/score" in step10
    reward_labels = [line.get_label() for line in fig.axes[0].get_lines()]
    window = max(2, min(10, 30 // 5))
    assert [lab for lab in reward_labels if not lab.startswith("_")] == [
        f"grpo/score (avg {window})",
        f"base_acc_rewards/mean (avg {window})",
        f"strict_format_rewards/mean (avg {window})",
    ]

    png = tool.plot_metrics(jsonl, tmp_output_dir / "plots" / "run.png")
    assert png == tmp_output_dir / "plots" / "run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = mpimg.imread(png).shape[:2]
    # figsize (9, 2.6 per subplot) at 100 dpi
    assert (width, height) == (900, round(2.6 * 6 * 100))


def test_moving_average_formula() -> None:
    ma = tool.moving_average([1.0, 3.0, math.nan, 5.0, 7.0], 2)
    assert ma == [1.0, (1 + 3) / 2, (1 + 3) / 2, (3 + 5) / 2, (5 + 7) / 2]


def test_keys_select_subplots_and_missing_families_are_dropped(tmp_output_dir: Path):
    jsonl = write_run(tmp_output_dir, steps=6)
    fig = tool.make_figure(tool.load_metrics(jsonl), keys=["actor/*", "timing/step", "nope"])
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["actor/*", "timing/step"]
    actor_keys = sorted(line.get_label() for line in fig.axes[0].get_lines())
    assert actor_keys == ["actor/entropy", "actor/kl_loss", "actor/lr", "actor/ppo_kl"]

    only_reward = tmp_output_dir / "reward_only.jsonl"
    only_reward.write_text(
        "\n".join(json.dumps({"step": s, "time": 0.0, "grpo/score": s / 4}) for s in (1, 2, 3))
    )
    assert len(tool.make_figure(tool.load_metrics(only_reward)).axes) == 1


def test_cli_prints_png_path_and_later_duplicate_key_wins(tmp_output_dir, capsys):
    jsonl = tmp_output_dir / "m.jsonl"
    rows = [{"step": 1, "actor/entropy": 1.0}, {"step": 2, "actor/entropy": 2.0}]
    rows.append({"step": 2, "actor/entropy": 5.0, "val/score": 0.5})
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "act')
    records = tool.load_metrics(jsonl)
    assert [(r["step"], r["actor/entropy"]) for r in records] == [(1, 1.0), (2, 5.0)]
    assert records[1]["val/score"] == 0.5
    assert tool.main([str(jsonl)]) == 0
    png = tmp_output_dir / "m.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.stat().st_size > 1000
    assert tool.main([str(jsonl), "--keys", "nope"]) == 1
