"""Held-out prompts answered greedily and scored by the same verifiers (`val/*`)."""

from __future__ import annotations

import logging

from mindrl.trainer.rollout_step import generate_batch, step_sampling
from mindrl.trainer.setup import Trainer

logger = logging.getLogger("mindrl.trainer")


def validation_due(t: Trainer, step: int) -> bool:
    freq = t.run.rl.loop.test_freq
    return freq > 0 and step % freq == 0


def validate(t: Trainer, step: int) -> dict[str, float] | None:
    """`val/score` and the per-verifier means on `rl_config.val_data_path` (None without it)."""
    from mindrl.data.dataset import PromptDataset
    from mindrl.trainer.scoring import score_batch

    path = t.run.rl.loop.val_data_path
    if not path:
        logger.warning("validation requested but rl_config.val_data_path is not set")
        return None
    val = PromptDataset(path)
    slices = max(t.roles.generator.rollout_ranks()) + 1
    usable = len(val) - len(val) % slices
    records = val.batch(list(range(usable)))
    batch = generate_batch(
        t.roles.generator, records, step_sampling(t.run, step, validation=True), t.prompts.pad_id
    )
    scored = score_batch(t, batch)
    out = {"val/score": float(scored.scores.mean())}
    out.update({f"val/{k}": v for k, v in scored.metrics.items() if k.endswith("_rewards/mean")})
    return out
