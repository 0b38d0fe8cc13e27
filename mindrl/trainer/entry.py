"""`cli/train_grpo.py`: parse, compose + validate the config, plan placement and memory, then run.

Hydra's own `@hydra.main` would reject `--dry-run` and change the working directory, so the
command line is parsed here and composed with Hydra's compose API: `--config-name NAME`,
`--config-path DIR`, `--dry-run`, and Hydra-style `key=value` overrides.

A dry run may be made anywhere, e.g. on a laptop for an Ascend cluster: it plans for the
accelerator the config targets (`planning_target`), checks the plan against this machine or
the Ray cluster a real run here would join only when that accelerator is here, and only warns
about input paths missing on this machine. A real run checks everything here, and joins a
running Ray cluster when one is recorded (`resolve_ray_target`), else starts an embedded one.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from mindrl.accelerator import Accelerator, AcceleratorError, mindspeed_args
from mindrl.accelerator.versions import check_versions
from mindrl.cluster.placement import ClusterResources, PlacementPlan
from mindrl.cluster.ray_target import RayConnectError, RayTarget
from mindrl.config import ConfigError, load_run_config, resolved_yaml
from mindrl.config.fates import handoffs
from mindrl.config.meaning import meaning_lines
from mindrl.config.profiler import profiler_problems, profiler_warnings
from mindrl.config.run import RunConfig
from mindrl.data.tokenizer_match import distillation_tokenizer_problems
from mindrl.planning import plan_memory
from mindrl.tools.local_servers import ToolServiceError
from mindrl.trainer.tool_services import tool_service_warnings, tool_services
from mindrl.trainer.trackers import tracker_problems
from mindrl.trainer.worker_env import handed_env


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="train_grpo.py",
        description="GRPO post-training on megatron-core with Ray and vLLM.",
        epilog="Overrides: key=value pairs, e.g. actor_config.lr=1e-6 rl_config.n_samples_per_prompt=4",
    )
    p.add_argument(
        "--config-name", "-cn", required=True, help="a file under configs/, .yaml optional"
    )
    p.add_argument("--config-path", "-cp", default=None, help="config folder (default: configs/)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="compose, validate and print the config, placement plan and memory plan; start "
        "nothing. "
        "Runs anywhere: it plans for the accelerator the config targets and only warns about "
        "input paths missing here",
    )
    p.add_argument(
        "--doctor",
        action="store_true",
        help="with --dry-run: then run cli/doctor.py's quick checks for this config on this "
        "machine or the Ray cluster a real run here would join",
    )
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if a.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    if args.doctor and not args.dry_run:
        p.error("--doctor goes with --dry-run (or run cli/doctor.py --config-name NAME)")
    return args, rest


def doctor_after_dry_run(run: RunConfig, check: PlanCheck) -> int:
    """The doctor's quick checks for `run` (`--dry-run --doctor`): 0 unless one fails."""
    if check.cluster is None:
        print(f"doctor: skipped, no {check.accelerator.name} on this machine to check")
        return 0
    from mindrl.doctor import run_doctor, settings_from_config

    report = run_doctor(settings_from_config(run, check.accelerator), quick=True)
    print("\n".join(report.console_lines()))
    return 1 if report.status == "fail" else 0


@dataclass(frozen=True)
class PlanCheck:
    """A placement plan and what it was checked against (`cluster` None: only the config)."""

    accelerator: Accelerator
    why: str  # how the accelerator was chosen
    plan: PlacementPlan
    cluster: ClusterResources | None
    where: str  # one line: the cluster (or the declaration) the plan was checked against
    ray_target: RayTarget | None
    warnings: tuple[str, ...] = ()

    def fit_problems(self) -> list[str]:
        return self.plan.fit_problems(self.cluster) if self.cluster is not None else []


def _cluster_for(run: RunConfig, acc: Accelerator) -> tuple[ClusterResources, str, RayTarget]:
    """This machine's embedded cluster, or the running cluster a real run here would join."""
    from mindrl.cluster.ray_target import resolve_ray_target
    from mindrl.cluster.resources import (
        describe_resources,
        embedded_cluster_resources,
        running_cluster_resources,
    )

    target = resolve_ray_target(run.runtime)
    if target.address is None:
        cluster = embedded_cluster_resources(acc, run.runtime.ray_num_cpus)
    else:
        cluster = running_cluster_resources(target.address, target.source)
    return cluster, f"{target.describe()}: {describe_resources(cluster)}", target


def plan_for(run: RunConfig, raw: dict[str, Any], *, dry_run: bool = False) -> PlanCheck:
    """The placement plan and the cluster it must fit.

    Real run: the accelerator `runtime.accelerator` gives on this machine (an error when it is
    not here), checked against the cluster the run will use. Dry run: the accelerator the
    config targets (`planning_target`); checked the same way when that accelerator is here,
    else planned for the devices the config declares without importing its runtime.
    """
    from mindrl.accelerator import get_accelerator
    from mindrl.accelerator.device import accelerator_usable, planning_accelerator
    from mindrl.cluster.placement import plan_placement
    from mindrl.cluster.resources import declared_accelerator, planning_target

    warnings: list[str] = []
    if dry_run:
        name, why = planning_target(run.runtime.accelerator, raw)
        here = accelerator_usable(planning_accelerator(name).name)
        acc = get_accelerator(name) if here else planning_accelerator(name)
    else:
        acc = get_accelerator(run.runtime.accelerator)
        why = f"runtime.accelerator: {run.runtime.accelerator}"
        meant, hint = declared_accelerator(raw)
        if run.runtime.accelerator == "auto" and meant and meant != acc.name:
            warnings.append(
                f"runtime.accelerator: auto found {acc.name} on this machine, but the config "
                f"targets {meant} ({hint}); planning for {acc.name}"
            )
        here = True
    if not here:
        plan = plan_placement(run, acc.ray_resource, None)
        where = (
            f"not checked against a cluster: no {acc.name} on this machine, so the plan is for "
            f"the {plan.total_devices} {acc.ray_resource} device(s) the config declares (a "
            "real run checks the cluster it joins)"
        )
        return PlanCheck(acc, why, plan, None, where, None, tuple(warnings))
    cluster, where, target = _cluster_for(run, acc)
    if target.note:
        warnings.append(target.note)
    plan = plan_placement(run, acc.ray_resource, cluster.max_per_node(acc.ray_resource))
    return PlanCheck(acc, why, plan, cluster, where, target, tuple(warnings))


def dry_run_path_warnings(run: RunConfig) -> list[str]:
    """Named inputs missing on this machine: warnings in a dry run (they may exist on the
    cluster the dry run plans for); unset required paths and output folders that cannot be
    created here were already errors while loading."""
    from mindrl.config.validate import missing_path_problems

    return [f"{p} (on this machine; a real run needs it)" for p in missing_path_problems(run)]


def coordinate_on_one_thread() -> None:
    """The driver's torch work is bookkeeping on small tensors (batches, advantages,
    metrics); with more intra-op threads it keeps an OpenMP pool whose idle threads spin on
    the cores the workers compute on, for no gain on tensors that small. The workers'
    thread counts are their own (`MINDRL_NUM_THREADS`)."""
    import torch

    torch.set_num_threads(1)


# Refused keys a dry run still plans around (a real run refuses them): the rest of the config
# has a plan worth showing (MindSpeed-RL's MoE configs ask for expert-parallel rollout over
# vLLM data-parallel replicas).
PLANNED_AROUND = ("generate_config.infer_expert_parallel_size",)


def load_for_entry(args: Any, overrides: list[str]) -> tuple[RunConfig, dict[str, Any], list[str]]:
    """The run config, its raw dict, and the refusals of `PLANNED_AROUND` keys a dry run
    planned without (those keys dropped; the dry run still ends with them as errors)."""
    load = dict(config_dir=args.config_path, local_paths=not args.dry_run)
    try:
        run, raw = load_run_config(args.config_name, overrides, **load)
        return run, raw, []
    except ConfigError as exc:
        keys = [k for k in PLANNED_AROUND if any(p.startswith(f"{k}:") for p in exc.problems)]
        if not args.dry_run or not keys or len(keys) != len(exc.problems):
            raise
        run, raw = load_run_config(args.config_name, [*overrides, *(f"~{k}" for k in keys)], **load)
        note = "; the dry run above planned the run without it (experts over each engine's ranks)"
        return run, raw, [f"{p}{note}" for p in exc.problems]


def main(argv: list[str] | None = None, *, stage: str | None = None) -> int:
    """`stage`: the one stage this command runs (cli/train_dapo.py: ray_dapo); None: the
    config's (cli/train_grpo.py runs ray_grpo and ray_dapo configs alike)."""
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    warnings: list[str] = []
    deferred: list[str] = []
    try:
        run, raw, deferred = load_for_entry(args, overrides)
        if (stage is not None or run.offline) and run.actor.data.stage != stage:
            raise ConfigError(
                [
                    f"megatron_training.stage: {run.actor.data.stage}, but this command runs "
                    f"{stage} (set stage: {stage}, or use cli/train_grpo.py)"
                    if stage is not None
                    else "megatron_training.stage: dpo runs with cli/train_dpo.py"
                ]
            )
        issues = tracker_problems(run.rl.logging)  # wandb / swanlab importable, modes
        issues.extend(distillation_tokenizer_problems(run))  # the teacher reads the same ids
        if issues:
            raise ConfigError(issues)
        if args.dry_run:
            warnings = dry_run_path_warnings(run) + tool_service_warnings(run)
        check = plan_for(run, raw, dry_run=args.dry_run)
        warnings.extend(check.warnings)
        print(f"# resolved config: {run.config_name}\n{resolved_yaml(raw)}")
        acc = check.accelerator
        print(f"accelerator: {acc.name} (backend {acc.dist_backend}); {check.why}")
        verb = f"{check.ray_target.verb} " if check.ray_target and not args.dry_run else ""
        print(f"cluster: {verb}{check.where}")
        print(check.plan.describe())
        for line in meaning_lines(run):
            print(line)
        memory = plan_memory(run, acc.name)  # per role and device, against its memory
        print(memory.describe())
        warnings.extend(memory.warnings)
        problems: list[str] = []
        try:  # warns once for keys only another backend honours; refuses what CPU cannot do
            handed = handoffs(run, acc.name)
        except ConfigError as exc:
            problems.extend(exc.problems)
        problems.extend(profiler_problems(run.profiler, acc.name))
        warnings.extend(
            profiler_warnings(
                run.profiler,
                steps=run.actor.optim.train_iters,
                reference=run.ref is not None,
                critic=run.critic is not None,
                generating_workers=not run.rollout_on_servers,
            )
        )
        if check.cluster is not None:  # the accelerator is here: its software stack too
            findings = check_versions(acc.name, need_vllm=run.generate.rollout_backend == "vllm")
            warnings.extend(f.message for f in findings if f.level == "warning")
            problems.extend(f.message for f in findings if f.level == "error")
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        fit = check.fit_problems()
        problems.extend(fit)
        if not fit:  # a memory plan for devices the run does not get is moot
            problems.extend(memory.problems)
        problems.extend(deferred)  # the refusals a dry run planned around
        if problems:
            raise ConfigError(problems)
        if not args.dry_run:  # before anything in this process imports megatron
            os.environ.update(handed_env(handed))  # what the workers get (worker_env)
            mindspeed_args.prepare_megatron(acc.name)
    except (ConfigError, AcceleratorError, RayConnectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        if check.cluster is None:
            print(
                "dry run: config valid; placement planned for the devices the config declares, "
                "not checked against a cluster; nothing started"
            )
        else:
            print("dry run: config valid, placement fits; nothing started")
        return doctor_after_dry_run(run, check) if args.doctor else 0
    from mindrl.logs import run_logging  # console vs OUTPUT_DIR/logs (runtime.log_level)
    from mindrl.trainer import run_dpo, run_grpo

    coordinate_on_one_thread()
    train = run_dpo if run.offline else run_grpo

    try:
        with run_logging(run.output_dir, run.runtime.log_level), tool_services(run):
            return train(run, raw)
    except RayConnectError as exc:  # the cluster went away between the check and the start
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ToolServiceError as exc:  # a tool's server is down and not ours to stand in for
        print(f"error: {exc}", file=sys.stderr)
        return 2
