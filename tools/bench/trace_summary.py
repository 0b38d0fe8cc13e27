"""Where a profiled stage call's time goes, read from the Chrome trace mindrl's profiler writes
(`profiler_config.integrated`, workers/profiling.py).

Per stage range (`actor_update`, ...) on its thread: its wall time, the time inside torch
operators (the outermost `cpu_op` events within it, so nested operators count once), the rest
(`between_ms`: Python and framework work between operators: vLLM's engine loop, megatron's
schedule, the autograd engine's own bookkeeping), and the operators with the most self time
(an operator's time less that of the operators it called).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

TOP_OPERATORS = 5


def _events(trace: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]


def _inside(event: dict[str, Any], outer: dict[str, Any]) -> bool:
    return (
        event["tid"] == outer["tid"]
        and outer["ts"] <= event["ts"]
        and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]
    )


def _self_times(ops: list[dict[str, Any]]) -> Counter:
    """Each operator name's time less that of the operators nested in its calls (`ops`: one
    thread's, sorted by start, longest first at equal starts)."""
    own: Counter = Counter()
    stack: list[dict[str, Any]] = []
    for op in ops:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= op["ts"]:
            stack.pop()
        own[op["name"]] += op["dur"]
        if stack:
            own[stack[-1]["name"]] -= op["dur"]
        stack.append(op)
    return own


def _accumulate(trace: Path, stages: tuple[str, ...], rows: dict[str, dict[str, Any]]) -> None:
    """Add the outermost ranges of `stages` in `trace` to `rows` (sums, self-time Counters)."""
    events = _events(trace)
    ranges = [e for e in events if e["name"] in stages and e.get("cat") == "user_annotation"]
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"])
    )
    for r in ranges:
        if any(o is not r and o["name"] == r["name"] and _inside(r, o) for o in ranges):
            continue  # a call of the same stage inside another: counted there
        inner = [o for o in ops if _inside(o, r)]
        outermost, end = 0.0, -1.0
        for o in inner:  # sorted by start: an operator starting before `end` is nested
            if o["ts"] >= end:
                outermost += o["dur"]
                end = o["ts"] + o["dur"]
        row = rows.setdefault(
            r["name"], {"calls": 0, "wall_ms": 0.0, "operator_ms": 0.0, "own": Counter()}
        )
        row["calls"] += 1
        row["wall_ms"] += r["dur"] / 1e3
        row["operator_ms"] += outermost / 1e3
        row["own"].update(_self_times(inner))


def _finished(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    for row in rows.values():
        own = row.pop("own")
        row["between_ms"] = row["wall_ms"] - row["operator_ms"]
        row["top"] = [[name, round(us / 1e3, 2)] for name, us in own.most_common(TOP_OPERATORS)]
        for key in ("wall_ms", "operator_ms", "between_ms"):
            row[key] = round(row[key], 2)
    return rows


def stage_breakdown(trace: Path, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """stage -> {calls, wall_ms, operator_ms, between_ms, top: [[operator, self_ms], ...]},
    summed over the stage's outermost ranges in `trace`."""
    rows: dict[str, dict[str, Any]] = {}
    _accumulate(trace, stages, rows)
    return _finished(rows)


def folder_breakdown(folder: Path, stages: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """`stage_breakdown` over every trace under `folder` (a run's profiler_data): a stage
    captured once per call has one trace per call, summed here (a call is in one trace only:
    inside another capture it is a range of that one, never a capture of its own)."""
    rows: dict[str, dict[str, Any]] = {}
    for trace in sorted(folder.glob("*/*.pt.trace.json")):
        _accumulate(trace, stages, rows)
    return _finished(rows)


def describe_breakdown(breakdown: dict[str, dict[str, Any]]) -> list[str]:
    """One line per stage: wall, operators, between, the top operators."""
    lines = []
    for stage, row in breakdown.items():
        share = row["between_ms"] / row["wall_ms"] if row["wall_ms"] else 0.0
        top = ", ".join(f"{name} {ms:.1f}" for name, ms in row["top"][:3])
        lines.append(
            f"  {stage}: {row['calls']} call(s), {row['wall_ms']:.1f} ms, operators "
            f"{row['operator_ms']:.1f}, between them {row['between_ms']:.1f} ({share:.0%}); "
            f"most self time: {top}"
        )
    return lines
