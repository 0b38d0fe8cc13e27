"""Typed configuration of the preprocessing step (``configs/datasets/NAME.yaml``).

Key names follow MindSpeed-RL's data handler config so its YAML files load here; keys that
MindSpeed-RL has but mindrl does not use are not silently accepted: every unknown key is an
error naming the key and the nearest valid one (or why mindrl has no use for a MindSpeed-RL
key). Problems are collected, not raised one by one, so a user fixes a config in one pass
(``PreprocessConfig.collect``). Which handler names exist is the handlers' fact; the
template, handler and path checks are added by ``compose.load_preprocess_config``.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mindrl.config.errors import ConfigError
from mindrl.config.fields import suggest
from mindrl.data.answers import LABEL_FORMATS

MAP_KEY_NAMES = ("prompt", "query", "response", "system", "chosen", "rejected")
BAD_ROW_POLICIES = ("skip", "error")
OVERLONG_POLICIES = ("filter", "error")
TOKENIZER_TYPES = ("HuggingFaceTokenizer", "PretrainedFromHF")


def nearest(key: str, valid: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for a misspelt dataset-config name, or ""."""
    return suggest(key, valid, cutoff=0.5)


# MindSpeed-RL data-handler keys mindrl has no use for, and why (named in the error).
MINDSPEED_ONLY_KEYS = {
    "streaming": "HF streaming loads; mindrl reads local files",
    "json_keys": "pretraining text fields; mindrl stores prompts and labels",
    "split_sentences": "pretraining text splitting",
    "keep_newlines": "pretraining text splitting",
    "interleave_probs": "mixing HF datasets; mindrl reads one local input",
    "overwrite_cache": "the HF datasets cache; mindrl reads local files",
    "cache_dir": "the HF datasets cache; mindrl reads local files",
    "script_data_dir": "HF dataset loading scripts; mindrl reads local files",
    "seed": "dataset mixing; the training sampler has its own seed",
    "pack": "SFT sequence packing",
    "neat_pack": "SFT sequence packing",
    "vocab_file": "megatron tokenizers; mindrl uses the HF tokenizer folder",
    "merge_file": "megatron tokenizers; mindrl uses the HF tokenizer folder",
    "append_eod": "pretraining documents",
    "make_vocab_size_divisible_by": "megatron vocab padding, set in the model config",
    "pad_vocab_size_to": "megatron vocab padding, set in the model config",
    "placeholder_token": "process-reward-model data",
    "reward_tokens": "process-reward-model data",
    "dataset_impl": "megatron's indexed-dataset format; mindrl writes a prompt store",
    "n_subs": "splitting the input between processes; use workers",
    "merge_group_keys": "merging megatron bin/idx sets",
}


def _unknown_key_problems(data: Mapping[str, Any], cls: type, path: str = "") -> list[str]:
    """One problem per unknown key: nearest valid key, or why a MindSpeed-RL key is unused."""
    valid = [f.name for f in dataclasses.fields(cls)]
    problems = []
    for key in data:
        key = str(key)
        if key in valid:
            continue
        why = MINDSPEED_ONLY_KEYS.get(key) if not path else None
        if why:
            problems.append(
                f"unknown key {path + key!r}: a MindSpeed-RL key mindrl does not use ({why}); "
                "remove it"
            )
        else:
            problems.append(
                f"unknown key {path + key!r}{nearest(key, valid)}; valid keys: {', '.join(valid)}"
            )
    return problems


def _type_problems(values: Mapping[str, Any], cls: type, path: str = "") -> list[str]:
    """Values of the wrong type (a YAML typo such as ``workers: four``), named by key."""
    hints = typing.get_type_hints(cls)
    problems = []
    for key, value in values.items():
        hint = hints.get(key)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            if value is None:
                continue  # Optional
            hint = args[0] if len(args) == 1 else None
        base = hint if hint in (int, bool, str) else None
        if base is None:
            continue
        ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
        if not ok:
            problems.append(f"{path + key}: expected {base.__name__}, got {value!r}")
    return problems


@dataclass(frozen=True)
class ReasoningGymConfig:
    """Offline problem generation with reasoning-gym (``handler_name: ReasoningGymHandler``)."""

    dataset: str = "basic_arithmetic"  # reasoning_gym.create_dataset name
    size: int = 1000
    seed: int = 42
    config: dict[str, Any] = field(default_factory=dict)  # extra create_dataset kwargs

    def __post_init__(self) -> None:
        problems = self.value_problems()
        if problems:
            raise ConfigError(problems)

    def value_problems(self) -> list[str]:
        problems = []
        if isinstance(self.size, int) and self.size <= 0:
            problems.append(f"reasoning_gym.size must be > 0, got {self.size}")
        if not isinstance(self.config, dict):
            problems.append("reasoning_gym.config must be a mapping of create_dataset kwargs")
        return problems


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
    seq_length: int | None = None  # max prompt tokens (pairs: prompt + longer answer); None: none
    split: str = "train"  # split of an HF DatasetDict folder
    workers: int = 1
    log_interval: int = 100
    on_bad_row: str = "skip"
    on_overlong: str = "filter"
    report_first_n: int = 20  # how many bad / overlong row numbers the report lists
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    enable_thinking: bool = False  # reasoning templates (qwen3): no empty think block

    def __post_init__(self) -> None:
        problems = self.value_problems()
        if problems:
            raise ConfigError(problems)

    def value_problems(self) -> list[str]:
        """Every problem of this config's values on its own (paths and names are checked by
        ``compose``, which knows the handlers and the templates)."""
        problems = _type_problems(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, type(self)
        )
        mistyped = {p.split(":", 1)[0] for p in problems}  # range checks assume the types

        # `bad` is called with no arguments; `...` lets a lambda bind loop values as defaults
        def check(name: str, bad: Callable[..., bool], message: str) -> None:
            if name not in mistyped and bad():
                problems.append(message)

        check("output_prefix", lambda: not self.output_prefix, "output_prefix is required")
        check(
            "tokenizer_name_or_path",
            lambda: not self.tokenizer_name_or_path,
            "tokenizer_name_or_path is required",
        )
        check(
            "tokenizer_type",
            lambda: self.tokenizer_type not in TOKENIZER_TYPES,
            f"tokenizer_type {self.tokenizer_type!r} is not supported; use one of "
            f"{TOKENIZER_TYPES} (both mean a Hugging Face tokenizer folder or name)",
        )
        for key in self.map_keys:
            check(
                "map_keys",
                lambda key=key: key not in MAP_KEY_NAMES,
                f"unknown key 'map_keys.{key}'{nearest(key, MAP_KEY_NAMES)}; "
                f"valid keys: {', '.join(MAP_KEY_NAMES)}",
            )
        choices = {
            "on_bad_row": (self.on_bad_row, BAD_ROW_POLICIES),
            "on_overlong": (self.on_overlong, OVERLONG_POLICIES),
            "label_format": (self.label_format, LABEL_FORMATS),
        }
        for name, (value, allowed) in choices.items():
            check(
                name,
                lambda value=value, allowed=allowed: value not in allowed,
                f"{name} must be one of {allowed}, got {value!r}",
            )
        check(
            "seq_length",
            lambda: self.seq_length is not None and self.seq_length <= 0,
            f"seq_length must be > 0, got {self.seq_length}",
        )
        for name in ("workers", "log_interval"):
            value = getattr(self, name)
            check(name, lambda value=value: value <= 0, f"{name} must be > 0, got {value}")
        check(
            "report_first_n",
            lambda: self.report_first_n < 0,
            f"report_first_n must be >= 0, got {self.report_first_n}",
        )
        return problems
        if not self.output_prefix:
            problems.append("output_prefix is required")
        if not self.tokenizer_name_or_path:
            problems.append("tokenizer_name_or_path is required")
        if self.tokenizer_type not in TOKENIZER_TYPES:
            problems.append(
                f"tokenizer_type {self.tokenizer_type!r} is not supported; use one of "
                f"{TOKENIZER_TYPES} (both mean a Hugging Face tokenizer folder or name)"
            )
        for key in self.map_keys:
            if key not in MAP_KEY_NAMES:
                problems.append(
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
                problems.append(f"{name} must be one of {allowed}, got {value!r}")
        if self.seq_length is not None and self.seq_length <= 0:
            problems.append(f"seq_length must be > 0, got {self.seq_length}")
        for name in ("workers", "log_interval"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.report_first_n < 0:
            problems.append(f"report_first_n must be >= 0, got {self.report_first_n}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        """Plain form for printing and for the store's meta.json."""
        out = dataclasses.asdict(self)
        out["dataset_additional_keys"] = list(self.dataset_additional_keys)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessConfig:
        """Validate key names, normalize MindSpeed-RL's value spellings, build the config;
        ``ConfigError`` lists every problem found."""
        config, problems = cls.collect(data)
        if problems or config is None:
            raise ConfigError(problems or ["config could not be built"])
        return config

    @classmethod
    def collect(cls, data: Mapping[str, Any]) -> tuple[PreprocessConfig | None, list[str]]:
        """(config or None, every problem): unknown keys, unparsable values, bad values."""
        problems = _unknown_key_problems(data, cls)
        valid = {f.name for f in dataclasses.fields(cls)}
        values = {str(k): v for k, v in data.items() if str(k) in valid}
        for key, parse in (
            ("map_keys", _parse_map_keys),
            ("dataset_additional_keys", _parse_key_list),
        ):
            try:
                values[key] = parse(values.get(key))
            except ConfigError as exc:
                problems.extend(exc.problems)
                values.pop(key, None)
        rg = values.pop("reasoning_gym", None)
        if rg is not None:
            rg_config, rg_problems = _collect_reasoning_gym(rg)
            problems.extend(rg_problems)
            if rg_config is not None:
                values["reasoning_gym"] = rg_config
        for key in ("input", "output_prefix", "tokenizer_name_or_path", "prompt_type_path"):
            if values.get(key) is not None and not isinstance(values[key], (dict, list)):
                values[key] = str(values[key])
        values.setdefault("output_prefix", "")
        values.setdefault("tokenizer_name_or_path", "")
        try:
            config = cls(**values)
        except ConfigError as exc:
            return None, problems + exc.problems
        return (None if problems else config), problems


def _collect_reasoning_gym(value: Any) -> tuple[ReasoningGymConfig | None, list[str]]:
    if not isinstance(value, Mapping):
        return None, ["reasoning_gym must be a mapping"]
    problems = _unknown_key_problems(value, ReasoningGymConfig, "reasoning_gym.")
    valid = {f.name for f in dataclasses.fields(ReasoningGymConfig)}
    values: dict[str, Any] = {  # their types: `_type_problems` below
        k: (dict(v) if k == "config" and isinstance(v, Mapping) else v)
        for k, v in value.items()
        if k in valid and v is not None
    }
    type_problems = _type_problems(values, ReasoningGymConfig, "reasoning_gym.")
    if type_problems:
        return None, problems + type_problems
    try:
        return ReasoningGymConfig(**values), problems
    except ConfigError as exc:
        return None, problems + exc.problems


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
