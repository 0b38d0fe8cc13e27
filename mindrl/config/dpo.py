"""stage dpo: MindSpeed-RL's offline DPO (`cli/train_dpo.py`, MindSpeed-LLM's DPO trainer).

Its config is one `megatron_training` section (the model, TP / PP / SP, the optimizer, the
pairwise data, the DPO keys below) and no rl_config: `dpo_sections` gives it the sections the
rest of the config builder reads (an actor from `megatron_training`, the reference a snapshot
of `ref_model`'s weights in the actor's processes, as many devices as one TP x PP replica
unless `rl_config.actor_resource.num_npus` says more), saying each choice in one line.
`dpo_problems` holds DPO's cross-field rules and warns for DPO keys set under another stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from mindrl.config.dpo_keys import DPO, DPOKeys
from mindrl.config.fates import is_default, warn_once

if TYPE_CHECKING:
    from mindrl.config.role import RoleConfig
    from mindrl.config.run import RunConfig

# megatron_training.seq_length outside stage dpo (warned once when set)
SEQ_LENGTH_ELSEWHERE = (
    "prompt lengths were bounded when the prompt store was made (cli/preprocess_data.py, the "
    "dataset YAML's seq_length); rollout lengths by generate_config"
)


def is_dpo(raw: Mapping[str, Any]) -> bool:
    training = raw.get("megatron_training")
    return isinstance(training, Mapping) and training.get("stage") == DPO


def dpo_sections(raw: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """`raw` with the sections a stage dpo config leaves out filled in (a copy)."""
    out = dict(raw)
    training = dict(raw.get("megatron_training") or {})
    said = []
    if out.get("actor_config") is None:
        out["actor_config"] = {}
        said.append("the policy is megatron_training's model")
    rl = dict(out.get("rl_config") or {})
    rl.setdefault("use_integrated_worker", True)
    rl.setdefault("reference_in_actor", True)
    rl.setdefault("n_samples_per_prompt", 1)
    resource = dict(rl.get("actor_resource") or {})
    if resource.get("num_npus") is None:
        tp = int(training.get("tensor_model_parallel_size", 1))
        pp = int(training.get("pipeline_model_parallel_size", 1))
        resource["num_npus"] = tp * pp
        said.append(
            f"{tp * pp} device(s): one TP {tp} x PP {pp} replica (rl_config.actor_resource."
            "num_npus for data parallelism)"
        )
    rl["actor_resource"] = resource
    out["rl_config"] = rl
    ref = training.get("ref_model") or training.get("load")
    said.append(f"the reference is {ref}, a weight snapshot in the policy's processes")
    notes.append("stage dpo: " + "; ".join(said))
    if out.get("generate_config"):  # read by the builder like any section, used by nothing
        warn_once(
            "dpo.generate_config",
            "generate_config: no effect with stage dpo (offline: nothing is generated)",
        )
    return out


def dpo_reference(actor: RoleConfig) -> RoleConfig:
    """The reference: the policy's model loaded from `ref_model` (else the policy's load)."""
    load = actor.dpo.ref_model or actor.ckpt.load
    return dataclasses.replace(actor, role="ref", ckpt=dataclasses.replace(actor.ckpt, load=load))


def dpo_problems(run: RunConfig) -> list[str]:
    """DPO's cross-field rules; DPO keys set under another stage are warned once."""
    actor = run.actor
    keys = actor.dpo
    if actor.data.stage != DPO:
        if actor.batch.seq_length != 1024:
            warn_once(
                "BatchConfig.seq_length",
                f"megatron_training.seq_length: {actor.batch.seq_length} has no effect in "
                f"mindrl: {SEQ_LENGTH_ELSEWHERE}",
            )
        for f in fields(DPOKeys):
            if not is_default(f, getattr(keys, f.name)):
                warn_once(
                    f"dpo.{f.name}",
                    f"megatron_training.{f.name}: no effect with stage {actor.data.stage} "
                    "(only stage dpo reads it)",
                )
        if actor.data.is_pairwise_dataset:
            return [
                "megatron_training.is_pairwise_dataset: true needs stage dpo (GRPO, DAPO and "
                f"PPO read prompts; stage is {actor.data.stage})"
            ]
        return []
    problems = []
    try:
        keys.loss_config()
    except ValueError as exc:
        problems.append(f"megatron_training.{exc}")
    gbs, dp = actor.batch.global_batch_size, actor.dp
    mbs = actor.batch.micro_batch_size
    if dp and gbs % (dp * mbs):
        problems.append(
            f"megatron_training.global_batch_size {gbs} pairs must divide into data-parallel "
            f"size {dp} x micro_batch_size {mbs} pairs"
        )
    if run.rl.micro_batching.use_dynamic_bsz:
        problems.append(
            "rl_config.use_dynamic_bsz: not with stage dpo (its micro-batches hold "
            "micro_batch_size whole pairs)"
        )
    return problems
