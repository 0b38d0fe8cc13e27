"""Run by test_profiler_worker.py through the `fresh_process` fixture: an ActorWorker (world
of one, real megatron-core, HF rollout engine) makes its stage calls over three steps with
MindSpeed-RL's `profiler_config.integrated`: first the update and the reference pass listed
for step 2, then `stage: all` over steps 1-2 on the same worker, the run ending after step 1.

Arguments: {"out": DIR}. Result: per capture folder, each trace file's name and the stage
ranges it holds, in order; and the folders `profile_finish` reported."""

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from tests.fresh_process import json_main

P = "+profiler_config.integrated."
STAGE_NAMES = {
    "actor_generate",
    "actor_compute_log_prob",
    "reference_compute_log_prob",
    "actor_update",
}


def _calls(worker: Any, batch: Any, prompts: list[list[int]], step: int) -> None:
    """One step's stage calls, as the driver makes them in the integrated layout."""
    from mindrl.algorithms import compute_advantages
    from mindrl.rollout import RolloutSampling

    worker.profile_step(step)
    worker.generate_in_rollout_mode(prompts, RolloutSampling(n=2, max_tokens=4, seed=step))
    old = worker.compute_log_prob(batch)
    ref = worker.compute_ref_log_prob(batch)
    adv = compute_advantages("group_norm", torch.rand(batch.size), 8, batch.response_mask)
    worker.update(batch.with_tensors(old_log_probs=old, advantages=adv, ref_log_probs=ref), step)


def _captures(root: Path) -> dict[str, list[tuple[str, list[str]]]]:
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for trace in sorted(root.glob("*/*.pt.trace.json")):
        events = json.loads(trace.read_text())["traceEvents"]
        ranges = [e["name"] for e in events if e.get("name") in STAGE_NAMES and e.get("ph") == "X"]
        ranges.sort(key=lambda n: n)  # compared as sets of calls per trace
        out.setdefault(trace.parent.name, []).append((trace.name.split(".")[0], ranges))
    return out


def main(args: dict[str, Any]) -> dict[str, Any]:
    from _actor_setup import actor_and_sampled_batch

    from mindrl.data.dataset import PromptDataset

    listed, whole = Path(args["out"]) / "listed", Path(args["out"]) / "all"
    run, worker, batch = actor_and_sampled_batch(
        [
            "rl_config.use_integrated_worker=true",
            "~ref_config",
            "+rl_config.reference_in_actor=true",
            f"{P}profile=true",
            f"{P}profile_save_path={listed}",
            f"{P}stage=[actor_update,reference_compute_log_prob]",
            f"{P}profile_step_start=2",
            f"{P}profile_step_end=3",
        ]
    )
    ds = PromptDataset(run.actor.data.data_path)
    prompts = [list(ds[i].prompt_ids) for i in range(2)]
    for step in (1, 2, 3):
        _calls(worker, batch, prompts, step)
    finished_listed = worker.profile_finish()

    profiler = dataclasses.replace(
        run.profiler,
        stage="all",
        profile_save_path=str(whole),
        profile_step_start=1,
        profile_step_end=3,
    )
    worker.run = dataclasses.replace(run, profiler=profiler)
    worker._stage_profiler = None  # the worker builds its profiler from run.profiler once
    _calls(worker, batch, prompts, 1)
    finished_all = worker.profile_finish()  # the run ended inside the window
    return {
        "listed": _captures(listed),
        "all": _captures(whole),
        "finished": [finished_listed, finished_all],
    }


if __name__ == "__main__":
    json_main(main)
