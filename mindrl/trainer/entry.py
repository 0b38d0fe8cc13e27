"""`cli/train_grpo.py`: parse, compose + validate the config, plan placement, then run.

Hydra's own `@hydra.main` would reject `--dry-run` and change the working directory, so the
command line is parsed here and composed with Hydra's compose API: `--config-name NAME`,
`--config-path DIR`, `--dry-run`, and Hydra-style `key=value` overrides.
"""

from __future__ import annotations

import argparse
import sys

from mindrl.config import ConfigError, load_run_config, resolved_yaml
from mindrl.config.run import RunConfig


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
        help="compose, validate and print the config and placement plan; start nothing",
    )
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if a.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    return args, rest


def plan_for(run: RunConfig):
    """The placement plan and the cluster it must fit (read from Ray when connecting)."""
    from mindrl.accelerator import get_accelerator
    from mindrl.cluster.placement import plan_placement
    from mindrl.cluster.resources import embedded_cluster_resources, running_cluster_resources

    acc = get_accelerator(run.runtime.accelerator)
    if run.runtime.ray_address:
        cluster = running_cluster_resources(run.runtime.ray_address)
    else:
        cluster = embedded_cluster_resources(acc, run.runtime.ray_num_cpus)
    plan = plan_placement(run, acc.ray_resource, cluster.max_per_node(acc.ray_resource))
    return acc, plan, cluster


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run, raw = load_run_config(args.config_name, overrides, config_dir=args.config_path)
        acc, plan, cluster = plan_for(run)
        print(f"# resolved config: {run.config_name}\n{resolved_yaml(raw)}")
        print(f"accelerator: {acc.name} (backend {acc.dist_backend})")
        print(plan.describe())
        problems = plan.fit_problems(cluster)
        if problems:
            raise ConfigError(problems)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("dry run: config valid, placement fits; nothing started")
        return 0
    from mindrl.logs import run_logging  # console vs OUTPUT_DIR/logs (runtime.log_level)
    from mindrl.trainer import run_grpo

    with run_logging(run.output_dir, run.runtime.log_level):
        return run_grpo(run, raw)
