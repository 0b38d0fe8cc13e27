"""Load ``configs/datasets/NAME.yaml`` plus overrides into a checked ``PreprocessConfig``.

Apart from ``config`` because the result is checked against the handler registry too, and the
handlers themselves are typed by the config: the loader sits above both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mindrl.config.errors import ConfigError
from mindrl.data.config import PreprocessConfig, nearest
from mindrl.data.handlers import check_handler


def resolve_config_path(config_name: str, config_dir: str | Path) -> Path:
    """``NAME`` -> ``config_dir/NAME.yaml``; a path to a YAML file is taken as is."""
    candidate = Path(config_name)
    if candidate.suffix in {".yaml", ".yml"} and candidate.is_file():
        return candidate
    config_dir = Path(config_dir)
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in config_dir.glob("*.yaml"))
        raise ConfigError(
            f"no dataset config {name!r} in {config_dir}{nearest(name, available)}; "
            f"available: {', '.join(available) or '(none)'}"
        )
    return path


def load_preprocess_config(
    config_name: str,
    config_dir: str | Path,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
) -> PreprocessConfig:
    """Compose ``config_dir/NAME.yaml`` with Hydra-style ``key=value`` overrides, then
    ``values`` (typed values taken verbatim, e.g. paths from command-line flags)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    path = resolve_config_path(config_name, config_dir)
    cleaned = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        if item.startswith("~"):
            raise ConfigError(f"override {item!r}: deleting keys is not supported")
        cleaned.append(item.lstrip("+"))
    try:
        base = OmegaConf.load(path)
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(cleaned), dict(values or {}))
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    config = PreprocessConfig.from_dict(data)
    check_handler(config)
    return config
