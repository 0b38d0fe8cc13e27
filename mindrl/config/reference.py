"""Where the reference lives: `rl_config.reference_in_actor` (a weight snapshot in the actor's
processes) needs the integrated reference, whose shapes are the actor's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.fates import warn_once

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig


def reference_in_actor_problems(run: RunConfig) -> list[str]:
    """`reference_in_actor` needs the integrated reference (actor_config's architecture and
    layout: the snapshot has the actor's shapes); without a reference, or with the LoRA
    shared backbone (already in the actor), it changes nothing and says so."""
    res = run.rl.resources
    if not res.reference_in_actor:
        return []
    if not res.use_integrated_worker:
        return [
            "rl_config.reference_in_actor: the snapshot has the actor's shapes; it needs "
            "use_integrated_worker: true (the reference built from actor_config), not ref_config"
        ]
    if run.ref is None:
        why = "there is no reference model"
    elif run.shares_backbone:
        why = "share_backbone already holds the reference in the actor"
    else:
        return []
    warn_once("reference_in_actor", f"rl_config.reference_in_actor: no effect here ({why})")
    return []
