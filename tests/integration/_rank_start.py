"""Start-up of a rank script: one mindrl worker per gloo rank, launched by `run_json_ranks`
(tests/fresh_process.py), which sets WORLD_SIZE, RANK and MASTER_ADDR / MASTER_PORT; the
worker's `init_model` joins that world and starts megatron on it.

Every rank script starts the same way: library warnings off (they would bury the rank's own
traceback in stderr), one torch thread per rank (the ranks share the machine's cores), and
the run config with the world as the actor's device count, so the worker's TP x PP x DP
matches the ranks launched.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tests.layouts import PADDED_LAYOUT

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

# Two rows per micro-batch and per mini-batch: several of each from the small synthetic batch.
SMALL_BATCHES = ("actor_config.micro_batch_size=2", "rl_config.mini_batch_size=2")


def rank_run_config(config_name: str, overrides: Sequence[str]) -> RunConfig:
    """`config_name` in the padded layout (`PADDED_LAYOUT`: the layouts the rank scripts
    compare are MindSpeed-RL's defaults; a test turns packing on by its `overrides`, which
    come after it), on as many devices as this world has ranks."""
    warnings.filterwarnings("ignore")
    import torch

    from mindrl.config import load_run_config

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    run, _ = load_run_config(
        config_name, [f"rl_config.actor_resource.num_npus={world}", *PADDED_LAYOUT, *overrides]
    )
    return run
