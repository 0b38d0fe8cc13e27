"""Compose the YAML tree under `configs/` with Hydra, then build and validate the typed config."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from mindrl.config.build import build_run_config
from mindrl.config.errors import ConfigError
from mindrl.config.paths import CONFIG_DIR
from mindrl.config.run import RunConfig
from mindrl.config.secrets import redacted
from mindrl.config.validate import validate

# Hydra's warning for a defaults list without `_self_` (a regex for warnings.filterwarnings)
MISSING_SELF_WARNING = r".*Defaults list is missing `_self_`"


def _hydra_override(arg: str) -> str:
    """`a.b=c` -> `++a.b=c`: set or add, so a typo reaches mindrl's own unknown-key check
    (which names the path and suggests the right key) instead of Hydra's struct error."""
    if arg.startswith(("+", "~")) or "=" not in arg:
        return arg
    key = arg.split("=", 1)[0]
    return f"++{arg}" if "." in key else arg


def compose_raw(
    config_name: str,
    overrides: list[str] | tuple[str, ...] = (),
    config_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Hydra-compose `config_name` (with or without .yaml) plus overrides into plain dicts."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from mindrl.config.resolvers import register_resolvers

    register_resolvers()
    config_dir = Path(config_dir or CONFIG_DIR).resolve()
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    if not (config_dir / f"{name}.yaml").is_file():
        available = sorted(p.stem for p in config_dir.glob("*.yaml"))
        from mindrl.config.fields import suggest

        raise ConfigError(
            f"--config-name: no config {name!r} in {config_dir} (available: {available})"
            + suggest(name, available)
        )
    try:
        with (
            warnings.catch_warnings(),
            initialize_config_dir(config_dir=str(config_dir), version_base=None),
        ):
            # MindSpeed-RL's configs list no `_self_`: Hydra then puts the file's own keys
            # last, as MindSpeed-RL's own Hydra composition does. Its warning about the
            # missing entry asks the user to change nothing that would change the result.
            warnings.filterwarnings("ignore", message=MISSING_SELF_WARNING, category=UserWarning)
            cfg = compose(config_name=name, overrides=[_hydra_override(o) for o in overrides])
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{name}: {exc}".strip()) from None
    assert isinstance(raw, dict)
    return {str(key): value for key, value in raw.items()}  # YAML keys: all strings here


def load_run_config(
    config_name: str,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    config_dir: str | Path | None = None,
    check_paths: bool = True,
    local_paths: bool = True,
) -> tuple[RunConfig, dict[str, Any]]:
    """Compose, type, validate. Returns the typed config and the resolved raw tree.

    `local_paths=False` (a dry run) skips only "exists on this machine" checks of inputs,
    which the caller reports as warnings: required-but-unset paths and unwritable outputs
    are still problems, reported with all the others in one pass."""
    raw = compose_raw(config_name, overrides, config_dir)
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    run = build_run_config(raw, name)
    validate(run, check_paths=check_paths, local_paths=local_paths)
    return run, raw


def resolved_yaml(raw: dict[str, Any]) -> str:
    """The config as YAML, secrets redacted (it is printed and saved with the run)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(redacted(raw)))


def save_resolved_config(raw: dict[str, Any], output_dir: str | Path) -> Path:
    """Write `resolved_config.yaml` into the run's output folder (atomically)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "resolved_config.yaml"
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(resolved_yaml(raw))
    tmp.replace(path)
    return path
