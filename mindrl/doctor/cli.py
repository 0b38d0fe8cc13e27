"""`cli/doctor.py`: check a machine or cluster before a run, with or without a run config.

`--config-name` composes the config like the training commands (Hydra's compose API, the same
`key=value` overrides) so the checks use its placement, TP, memory plan and save folder.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from mindrl.doctor.runner import ALL_CHECKS, SLOW_CHECKS, run_doctor
from mindrl.doctor.settings import DoctorSettings, default_settings, settings_from_config


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="doctor.py",
        description="Check versions, Ray, devices, collectives, megatron-core, the rollout "
        "engine, the save folder and the environment before an RL run.",
        epilog="Overrides: key=value pairs as for cli/train_grpo.py",
    )
    p.add_argument(
        "--config-name",
        "-cn",
        default=None,
        help="a run config under configs/ (default: no config, defaults)",
    )
    p.add_argument("--config-path", "-cp", default=None, help="config folder (default: configs/)")
    p.add_argument(
        "--quick", action="store_true", help=f"skip the slow checks ({', '.join(SLOW_CHECKS)})"
    )
    p.add_argument(
        "--only", nargs="+", choices=ALL_CHECKS, default=(), help="run only these checks"
    )
    p.add_argument(
        "--save-dir",
        default=None,
        help="the folder the save check writes on one node and reads on the others (default: "
        "the config's actor_config.save, else its output folder, else a temporary folder)",
    )
    p.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON")
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if a.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    if rest and args.config_name is None:
        p.error("key=value overrides need --config-name")
    return args, rest


def load_settings(
    config_name: str | None,
    config_path: str | None,
    overrides: list[str],
    save_dir: str | None = None,
) -> DoctorSettings:
    """The settings for a config (its accelerator, as a real run would pick it) or defaults."""
    from mindrl.accelerator import get_accelerator

    if config_name is None:
        settings = default_settings(get_accelerator())
    else:
        from mindrl.config import load_run_config

        run, _ = load_run_config(config_name, overrides, config_dir=config_path, local_paths=False)
        settings = settings_from_config(run, get_accelerator(run.runtime.accelerator))
    return settings if save_dir is None else replace(settings, save_dir=Path(save_dir))


def main(argv: list[str] | None = None) -> int:
    """0: every check passed or warned; 1: a check failed; 2: the config did not load."""
    from mindrl.accelerator import AcceleratorError
    from mindrl.config import ConfigError

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = load_settings(args.config_name, args.config_path, overrides, args.save_dir)
    except (ConfigError, AcceleratorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_doctor(
        settings,
        quick=args.quick,
        only=args.only,
        progress=lambda r: print(f"... {r.name}: {r.status}", flush=True),
    )
    print("\n".join(report.console_lines()))
    if args.json:
        report.write_json(args.json)
        print(f"report written to {args.json}")
    return 1 if report.status == "fail" else 0
