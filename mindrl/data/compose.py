"""Load ``configs/datasets/NAME.yaml`` plus overrides into a checked ``PreprocessConfig``.

Apart from ``config`` because the result is checked against the handler registry and the
templates too, and the handlers themselves are typed by the config: the loader sits above
both. Every problem is collected and reported at once (one ``ConfigError`` listing unknown
keys, bad values, the handler, the template and, with ``check_paths``, the input, tokenizer
and output paths), so a user fixes a config in one pass rather than one error per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mindrl.config.errors import ConfigError
from mindrl.config.writable import unwritable_reason
from mindrl.data.config import PreprocessConfig, nearest
from mindrl.data.handlers import HANDLERS
from mindrl.data.readers import FILE_FORMATS
from mindrl.data.store import is_store
from mindrl.data.templates import TemplateError, get_template

# MindSpeed-RL handlers for data mindrl does not train on (GRPO prompts only).
_MINDSPEED_ONLY_HANDLERS = {
    "AlpacaStyleInstructionHandler": "SFT instruction data",
    "AlpacaStyleProcessRewardHandler": "process-reward-model data",
}


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
    *,
    check_paths: bool = False,
) -> PreprocessConfig:
    """Compose ``config_dir/NAME.yaml`` with Hydra-style ``key=value`` overrides, then
    ``values`` (typed values taken verbatim, e.g. paths from command-line flags).

    ``check_paths`` also checks the filesystem (input, tokenizer folder, output prefix), as
    the preprocessing command does; tests and tools that only read a config leave it off.
    """
    data = _compose(config_name, config_dir, overrides, values)
    config, problems = PreprocessConfig.collect(data)
    problems += _handler_problems(data)
    problems += _template_problems(data)
    if check_paths:
        problems += path_problems(data)
    if problems or config is None:
        raise ConfigError(problems or ["config could not be built"])
    return config


def _compose(
    config_name: str,
    config_dir: str | Path,
    overrides: Sequence[str],
    values: Mapping[str, Any] | None,
) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    path = resolve_config_path(config_name, config_dir)
    cleaned, problems = [], []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r} is not of the form key=value")
        elif item.startswith("~"):
            problems.append(f"override {item!r}: deleting keys is not supported")
        else:
            cleaned.append(item.lstrip("+"))
    if problems:
        raise ConfigError(problems)
    try:
        base = OmegaConf.load(path)
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(cleaned), dict(values or {}))
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, YAMLError) as exc:
        raise ConfigError(f"{path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return {str(k): v for k, v in data.items()}


def _handler_problems(data: Mapping[str, Any]) -> list[str]:
    name = data.get("handler_name", PreprocessConfig.handler_name)
    if not isinstance(name, str):
        return []  # reported as a type problem
    if name in _MINDSPEED_ONLY_HANDLERS:
        return [
            f"handler_name {name!r} is a MindSpeed-RL handler for "
            f"{_MINDSPEED_ONLY_HANDLERS[name]}, which mindrl (GRPO prompts) does not use; "
            f"available: {', '.join(sorted(HANDLERS))}"
        ]
    if name not in HANDLERS:
        return [
            f"unknown handler_name {name!r}{nearest(name, list(HANDLERS))}; "
            f"available: {', '.join(sorted(HANDLERS))}"
        ]
    if HANDLERS[name].needs_input and not data.get("input"):
        return [f"input is required for handler {name}"]
    return []


def _template_problems(data: Mapping[str, Any]) -> list[str]:
    name = data.get("prompt_type", PreprocessConfig.prompt_type)
    path = data.get("prompt_type_path")
    if not isinstance(name, str) or not (path is None or isinstance(path, str)):
        return []  # reported as type problems
    try:
        template = get_template(name, path)
    except TemplateError as exc:
        return [str(exc)]
    if data.get("enable_thinking") is True and not template.reasoning:
        return [
            f"enable_thinking applies to reasoning templates (qwen3) only; prompt_type "
            f"{name!r} has no thinking switch"
        ]
    return []


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def path_problems(data: Mapping[str, Any]) -> list[str]:
    """Input, tokenizer folder and output prefix problems that would stop the run."""
    problems = []
    source = data.get("input")
    if isinstance(source, str) and source:
        path = Path(source).expanduser()
        if not path.exists():
            problems.append(f"input {source!r}: no such file or folder")
        elif path.is_file() and path.suffix.lower() not in FILE_FORMATS:
            problems.append(
                f"input {source!r}: unsupported format; use {', '.join(sorted(FILE_FORMATS))} "
                "or a folder of such files"
            )
    tokenizer = data.get("tokenizer_name_or_path")
    if isinstance(tokenizer, str) and tokenizer and _looks_local(tokenizer):
        if not Path(tokenizer).expanduser().is_dir():
            problems.append(f"tokenizer_name_or_path {tokenizer!r}: no such folder")
    output = data.get("output_prefix")
    if isinstance(output, str) and output:
        problems += output_problems(output)
    return problems


def output_problems(output_prefix: str | Path) -> list[str]:
    """Why the store certainly cannot be written at ``output_prefix`` (it is built beside it
    and renamed into place, so its folder must be writable too), or that it is a folder of
    something else, which is never overwritten."""
    path = Path(output_prefix).expanduser()
    reason = unwritable_reason(path) or unwritable_reason(path.absolute().parent)
    if reason:
        return [f"output_prefix: {reason}"]
    if path.is_dir() and not is_store(path) and any(path.iterdir()):
        return [f"output_prefix: {path} exists and is not a prompt store; refusing to overwrite it"]
    return []
