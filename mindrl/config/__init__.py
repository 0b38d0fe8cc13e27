"""Typed, validated run configuration composed from the YAML tree under `configs/`."""

from mindrl.config.build import build_run_config
from mindrl.config.compose import (
    compose_raw,
    load_run_config,
    resolved_yaml,
    save_resolved_config,
)
from mindrl.config.errors import ConfigError
from mindrl.config.generate import GenerateConfig, SamplingConfig
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.paths import CONFIG_DIR
from mindrl.config.rl import RLConfig
from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig, RuntimeConfig
from mindrl.config.validate import cross_field_problems, validate

__all__ = [
    "CONFIG_DIR",
    "ConfigError",
    "GenerateConfig",
    "ModelArchConfig",
    "RLConfig",
    "RoleConfig",
    "RunConfig",
    "RuntimeConfig",
    "SamplingConfig",
    "build_run_config",
    "compose_raw",
    "cross_field_problems",
    "load_run_config",
    "resolved_yaml",
    "save_resolved_config",
    "validate",
]
