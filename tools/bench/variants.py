"""Benchmarks that train one config several ways, one run after the other: each variant in a
fresh process tree (`tools/bench/training_run.py`'s `run_one`), a failed or timed-out run recorded
with its error while the others still run, and the report written with the machine's load.
Used by tools/bench/lora.py, packing.py and async.py."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench import training_run


def run_variants(
    bench: str,
    config: str,
    steps: int,
    variants: dict[str, list[str]],
    work_dir: Path | None,
    timeout_s: float,
    measure: Callable[[Path], dict[str, Any]] | None = None,
    describe: Callable[[dict[str, Any]], str] | None = None,
    pss_gate_mib: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Each variant's overrides on top of `config` for `steps` steps; per variant its
    `training_run.run_one` result plus `measure(out_dir)`, or {"error": ...}. `describe` prints a run's
    progress line (default: `training_run.run_line`); `pss_gate_mib`: `run_tree`'s gated memory
    reading, for runs whose time a PSS poll would disturb."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=f"mindrl-{bench}-") as tmp:
        work = work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, overrides in variants.items():
            print(
                f"{bench}: running {name} ({steps} steps): {overrides_note(overrides)}", flush=True
            )
            out_dir = work / name
            try:
                res = training_run.run_one(
                    name,
                    config,
                    training_run.common_overrides(steps, out_dir) + overrides,
                    out_dir,
                    timeout_s,
                    pss_gate_mib=pss_gate_mib,
                )
            except SystemExit as exc:  # run_tree's failure or timeout: keep the other runs
                print(f"  {name}: FAILED: {exc}", flush=True)
                results[name] = {"error": str(exc)}
                continue
            res["overrides"] = list(overrides)  # on top of the shipped config
            if measure is not None:
                res.update(measure(out_dir))
            print(f"  {name}: {(describe or training_run.run_line)(res)}", flush=True)
            results[name] = res
    return results


def overrides_note(overrides: list[str]) -> str:
    """A variant's difference from the shipped config, as its progress line says it."""
    if not overrides:
        return "the config as shipped (no overrides)"
    return "overrides (not as shipped): " + " ".join(overrides)


def write_report(path: Path, report: dict[str, Any], load_start: tuple[float, ...]) -> None:
    """`report` with the machine (CPU, its matmul flags, cores) and its load before / after,
    as JSON at `path`."""
    from tools.bench.host import host_facts

    report = {
        **report,
        **host_facts(),
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"results: {path}")


def failed(results: dict[str, dict[str, Any]]) -> bool:
    return any("error" in r for r in results.values())


def finish(
    bench: str,
    path: Path,
    report: dict[str, Any],
    load_start: tuple[float, ...],
    summary: Callable[[dict[str, dict[str, Any]]], str],
) -> int:
    """Write `report`; print the summary of its runs as the last line (exit 0), or say that a
    run failed (exit 1)."""
    write_report(path, report, load_start)
    if failed(report["runs"]):
        print(f"{bench}: failed (see the runs' errors above)")
        return 1
    print(summary(report["runs"]))
    return 0
