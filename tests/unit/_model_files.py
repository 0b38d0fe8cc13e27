"""The shipped model YAML files (`configs/model/NAME.yaml`) as ModelArchConfig keywords, for
tests that build a model or plan one from the same numbers the run would read."""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from mindrl.config.model_arch import ModelArchConfig
from tests.fresh_process import REPO

MODEL_DIR = REPO / "configs" / "model"


def arch_kwargs(name: str = "tiny", **changes: object) -> dict:
    """The file's ModelArchConfig fields (its other keys left out), with `changes` applied.
    Read with OmegaConf, as Hydra composes the model files (YAML 1.1 would read 1e-6 as a
    string)."""
    ((_, values),) = OmegaConf.to_container(OmegaConf.load(MODEL_DIR / f"{name}.yaml")).items()
    fields = {f.name for f in dataclasses.fields(ModelArchConfig)}
    return {**{k: v for k, v in values.items() if k in fields}, **changes}
