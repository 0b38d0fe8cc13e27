"""Typed configuration of the preprocessing step (``configs/datasets/NAME.yaml``).

Key names follow MindSpeed-RL's data handler config so its YAML files load here; keys that
MindSpeed-RL has but mindrl does not use are not silently accepted: every unknown key is an
error naming the key and the nearest valid one. Which handler names exist is the handlers'
fact (``handlers.check_handler``); ``compose.load_preprocess_config`` applies both checks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mindrl.config.errors import ConfigError
from mindrl.config.fields import suggest
from mindrl.data.answers import LABEL_FORMATS

MAP_KEY_NAMES = ("prompt", "query", "response", "system")
BAD_ROW_POLICIES = ("skip", "error")
OVERLONG_POLICIES = ("filter", "error")
TOKENIZER_TYPES = ("HuggingFaceTokenizer", "PretrainedFromHF")


def nearest(key: str, valid: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for a misspelt dataset-config name, or ""."""
    return suggest(key, valid, cutoff=0.5)


def _check_keys(data: Mapping[str, Any], cls: type, path: str = "") -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ConfigError(
                f"unknown key {path + str(key)!r}{nearest(str(key), valid)}; "
                f"valid keys: {', '.join(valid)}"
            )


@dataclass(frozen=True)
class ReasoningGymConfig:
    """Offline problem generation with reasoning-gym (``handler_name: ReasoningGymHandler``)."""

    dataset: str = "basic_arithmetic"  # reasoning_gym.create_dataset name
    size: int = 1000
    seed: int = 42
    config: dict[str, Any] = field(default_factory=dict)  # extra create_dataset kwargs

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ConfigError(f"reasoning_gym.size must be > 0, got {self.size}")
        if not isinstance(self.config, dict):
            raise ConfigError("reasoning_gym.config must be a mapping of create_dataset kwargs")


@dataclass(frozen=True)
class PreprocessConfig:
    """Everything one preprocessing run needs; built once from YAML + overrides."""

    output_prefix: str
    tokenizer_name_or_path: str
    input: str | None = None
    handler_name: str = "R1AlpacaStyleInstructionHandler"
    tokenizer_type: str = "HuggingFaceTokenizer"
    tokenizer_not_use_fast: bool = False
    prompt_type: str = "empty"
    prompt_type_path: str | None = None  # templates.json; None = configs/model/templates.json
    system: str | None = None  # None = the template's default system prompt
    question_suffix: str = ""  # appended (after a space) to plain-text questions
    map_keys: dict[str, str] = field(default_factory=dict)  # canonical name -> input column
    dataset_additional_keys: tuple[str, ...] = ()
    label_format: str = "auto"  # R1AlpacaStyle handlers: auto / raw / gsm8k / boxed / numeric
    seq_length: int | None = None  # max prompt tokens; None = no limit
    split: str = "train"  # split of an HF DatasetDict folder
    workers: int = 1
    log_interval: int = 100
    on_bad_row: str = "skip"
    on_overlong: str = "filter"
    report_first_n: int = 20  # how many bad / overlong row numbers the report lists
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)

    def __post_init__(self) -> None:
        if not self.output_prefix:
            raise ConfigError("output_prefix is required")
        if not self.tokenizer_name_or_path:
            raise ConfigError("tokenizer_name_or_path is required")
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise ConfigError(
                f"tokenizer_type {self.tokenizer_type!r} is not supported; use one of "
                f"{TOKENIZER_TYPES} (both mean a Hugging Face tokenizer folder or name)"
            )
        for key in self.map_keys:
            if key not in MAP_KEY_NAMES:
                raise ConfigError(
                    f"unknown key 'map_keys.{key}'{nearest(key, MAP_KEY_NAMES)}; "
                    f"valid keys: {', '.join(MAP_KEY_NAMES)}"
                )
        choices = {
            "on_bad_row": (self.on_bad_row, BAD_ROW_POLICIES),
            "on_overlong": (self.on_overlong, OVERLONG_POLICIES),
            "label_format": (self.label_format, LABEL_FORMATS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")
        if self.seq_length is not None and self.seq_length <= 0:
            raise ConfigError(f"seq_length must be > 0, got {self.seq_length}")
        for name in ("workers", "log_interval"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.report_first_n < 0:
            raise ConfigError(f"report_first_n must be >= 0, got {self.report_first_n}")

    def to_dict(self) -> dict[str, Any]:
        """Plain form for printing and for the store's meta.json."""
        out = dataclasses.asdict(self)
        out["dataset_additional_keys"] = list(self.dataset_additional_keys)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessConfig:
        """Validate key names, normalize MindSpeed-RL's value spellings, build the config."""
        _check_keys(data, cls)
        values = dict(data)
        values["map_keys"] = _parse_map_keys(values.get("map_keys"))
        values["dataset_additional_keys"] = _parse_key_list(values.get("dataset_additional_keys"))
        rg = values.get("reasoning_gym")
        if rg is None:
            values.pop("reasoning_gym", None)
        else:
            if not isinstance(rg, Mapping):
                raise ConfigError("reasoning_gym must be a mapping")
            _check_keys(rg, ReasoningGymConfig, "reasoning_gym.")
            values["reasoning_gym"] = ReasoningGymConfig(
                **{
                    k: (dict(v) if k == "config" and v else v)
                    for k, v in rg.items()
                    if v is not None
                }
            )
        for key in ("input", "output_prefix", "tokenizer_name_or_path", "prompt_type_path"):
            if values.get(key) is not None:
                values[key] = str(values[key])
        values.setdefault("output_prefix", "")
        values.setdefault("tokenizer_name_or_path", "")
        return cls(**values)


def _parse_map_keys(value: Any) -> dict[str, str]:
    """MindSpeed-RL writes map_keys as a mapping or as a JSON string; "" means absent."""
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"map_keys is not valid JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise ConfigError(f"map_keys must be a mapping, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items() if v not in (None, "")}


def _parse_key_list(value: Any) -> tuple[str, ...]:
    """A list, or MindSpeed-RL's bare string / comma-separated form."""
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        return tuple(k.strip() for k in value.split(",") if k.strip())
    if isinstance(value, Sequence):
        return tuple(str(k) for k in value)
    raise ConfigError(f"dataset_additional_keys must be a list, got {type(value).__name__}")
