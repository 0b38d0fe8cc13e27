"""An offline prompt store for the tiny CPU configs: one-digit arithmetic from reasoning-gym,
tokenized with the tiny tokenizer, built once into the assets cache."""

from __future__ import annotations

from pathlib import Path

from mindrl.testing.assets import assets_root, tiny_model_dir

TINY_PROMPTS_VERSION = 1
TINY_PROMPTS_SIZE = 256


def tiny_prompts_dir() -> Path:
    """Cached prompt store (`mindrl.data` format) of TINY_PROMPTS_SIZE one-digit sums."""
    from mindrl.config.compose import CONFIG_DIR
    from mindrl.data.config import load_preprocess_config
    from mindrl.data.preprocess import run_preprocess
    from mindrl.data.store import is_store

    target = assets_root() / f"tiny-prompts-v{TINY_PROMPTS_VERSION}"
    if is_store(target):
        return target
    config = load_preprocess_config(
        "arithmetic_smollm2",
        CONFIG_DIR / "datasets",
        values={
            "tokenizer_name_or_path": str(tiny_model_dir()),
            "output_prefix": str(target),
            "question_suffix": "",
            "seq_length": 64,
            "log_interval": 10_000,
            "reasoning_gym": {
                "dataset": "basic_arithmetic",
                "size": TINY_PROMPTS_SIZE,
                "seed": 0,
                "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
            },
        },
    )
    run_preprocess(config, log=lambda _msg: None)
    return target
