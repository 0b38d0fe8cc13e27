"""Plot a run's metrics.jsonl as one PNG: one subplot per metric family, x = step.

    python tools/plot_metrics.py OUTPUT_DIR/metrics.jsonl [--out PNG] [--keys KEY ...]

Default families: reward (grpo/score and every *_rewards/mean, with a moving average, since
per-step reward is noisy), response length, KL, entropy, timing, validation (val/*). ``--keys`` replaces them:
one subplot per key, where a key may be a glob such as ``actor/*``. Families with no data
are left out. Lines with null values (non-finite metrics) leave gaps.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.figure import Figure  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout as is
from mindrl.trainer.metrics import merged_step_records  # noqa: E402


@dataclass(frozen=True)
class Family:
    """One subplot: the metric keys (globs) it shows and whether to add a moving average."""

    title: str
    patterns: tuple[str, ...]
    smooth: bool = False
    ylabel: str = ""
    exclude: tuple[str, ...] = ()


DEFAULT_FAMILIES: tuple[Family, ...] = (
    Family(
        "reward", ("grpo/score", "*_rewards/mean"), smooth=True, ylabel="score", exclude=("val/*",)
    ),
    Family("response length", ("response_length/mean", "response_length/*"), ylabel="tokens"),
    Family("KL", ("actor/kl_loss", "actor/ppo_kl")),
    Family("entropy", ("actor/entropy",), ylabel="nats / token"),
    Family("timing", ("timing/*",), ylabel="seconds"),
    Family("validation", ("val/score", "val/*_rewards/mean"), ylabel="score"),
)


def load_metrics(jsonl_path: str | Path) -> list[dict[str, Any]]:
    """One merged record per step, sorted by step (`merged_step_records`)."""
    return merged_step_records(jsonl_path)


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` finite values (NaN until one is seen)."""
    out, buf = [], []
    for v in values:
        if math.isfinite(v):
            buf.append(v)
            if len(buf) > window:
                buf.pop(0)
        out.append(sum(buf) / len(buf) if buf else math.nan)
    return out


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for r in records:
        if key in r:
            v = r[key]
            steps.append(int(r["step"]))
            values.append(math.nan if v is None else float(v))
    return steps, values


def _keys_for(family: Family, all_keys: list[str]) -> list[str]:
    chosen: list[str] = []
    for pattern in family.patterns:
        for key in all_keys:
            if any(fnmatch.fnmatchcase(key, x) for x in family.exclude):
                continue
            if fnmatch.fnmatchcase(key, pattern) and key not in chosen:
                chosen.append(key)
    return chosen


def make_figure(records: list[dict[str, Any]], keys: Sequence[str] | None = None) -> Figure:
    """The figure: one axes per family (or per ``keys`` entry) that has data."""
    families = DEFAULT_FAMILIES if not keys else tuple(Family(k, (k,), smooth=False) for k in keys)
    all_keys = sorted({k for r in records for k in r if k not in ("step", "time")})
    panels = [(f, ks) for f in families if (ks := _keys_for(f, all_keys))]
    if not panels:
        raise ValueError("no metric to plot: none of the requested keys is in the file")
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True, squeeze=False
    )
    window = max(2, min(10, len(records) // 5))
    for ax, (family, fam_keys) in zip(axes[:, 0], panels):
        for i, key in enumerate(fam_keys):
            steps, values = _series(records, key)
            color = f"C{i % 10}"
            if family.smooth and len(values) > window:
                ax.plot(steps, values, color=color, alpha=0.3, linewidth=1)
                ma = moving_average(values, window)
                ax.plot(steps, ma, color=color, linewidth=2, label=f"{key} (avg {window})")
            else:
                marker = "." if len(values) <= 60 else None  # dots only while they stay apart
                ax.plot(steps, values, color=color, linewidth=1.5, marker=marker, label=key)
        ax.set_title(family.title, fontsize=10, loc="left")
        ax.set_ylabel(family.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best", ncol=2 if len(fam_keys) > 4 else 1)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return fig


def plot_metrics(
    jsonl_path: str | Path, out_png: str | Path | None = None, keys: Sequence[str] | None = None
) -> Path:
    """Write the PNG (default: next to the JSONL, same name with .png) and return its path."""
    jsonl_path = Path(jsonl_path)
    out = Path(out_png) if out_png is not None else jsonl_path.with_suffix(".png")
    records = load_metrics(jsonl_path)
    if not records:
        raise ValueError(f"{jsonl_path} holds no metric records")
    fig = make_figure(records, keys)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics_jsonl", help="a run's metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG path (default: METRICS_JSONL with .png)")
    p.add_argument("--keys", nargs="+", default=None, help="metric keys or globs, one subplot each")
    args = p.parse_args(argv)
    try:
        print(plot_metrics(args.metrics_jsonl, args.out, args.keys))
    except (OSError, ValueError) as exc:
        print(f"plot_metrics: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
