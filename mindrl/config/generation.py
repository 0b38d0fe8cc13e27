"""Which MindSpeed-RL generation a config is, told by its shape, and what that changes.

MindSpeed-RL 1.x (the seed document's generation) and 2.x read some keys differently:
1.x's `use_integrated_worker` defaults to false (the reference is `ref_config` on its own
devices), its `mini_batch_size` counts samples (the actor splits each DP rank's samples into
chunks of `mini_batch_size // DP` with `torch.split`, so a value of at least a step's samples
is one optimizer step on the whole batch), and its GRPO loss is the clipped ratio plus k3 KL
times `init_kl_coef` (it reads neither `kl_penalty` nor `entropy_coeff`). 2.x's config class
refuses the keys 2.x dropped, and builds the reference from `actor_config` unless told not to,
so a config with those keys, or with a `ref_config` and no `use_integrated_worker`, can only
be 1.x: it is read as 1.x, and one line says so. Any other config is read as 2.x; a
`mini_batch_size` valid only as samples is then read as samples, and said.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindrl.config.run import RunConfig

# rl_config keys of 1.x that 2.x's RLConfig no longer has (2.x raises on unknown keys)
ONE_X_ONLY_RL_KEYS = (
    "experience_count",
    "experience_count_actor",
    "experience_count_ref",
    "experience_count_reward",
    "experience_count_rule_reward",
    "update_micro_batch_size",
    "enable_sharding_validate",
)
ONE_X_KL_ESTIMATOR = "k3"  # 1.x's GRPO loss: exp(ref - logp) - (ref - logp) - 1
ONE_X_KL_SPELLINGS = (ONE_X_KL_ESTIMATOR, "low_var_kl")


@dataclass(frozen=True)
class Generation:
    """The generation a config is read as, and the parts of its shape that say so."""

    name: str  # "1.x" or "2.x"
    evidence: tuple[str, ...] = ()

    @property
    def is_1x(self) -> bool:
        return self.name == "1.x"


def read_generation(raw: Mapping[str, Any]) -> Generation:
    """1.x when the config's shape is impossible in 2.x, else 2.x."""
    rl = raw.get("rl_config")
    rl = rl if isinstance(rl, Mapping) else {}
    evidence = []
    if "use_integrated_worker" not in rl:
        separate = [name for name in ("ref_config",) if raw.get(name) is not None]
        if rl.get("reference_resource") is not None:
            separate.append("rl_config.reference_resource")
        if separate:
            evidence.append(f"{' and '.join(separate)} without use_integrated_worker")
    old_keys = [key for key in ONE_X_ONLY_RL_KEYS if key in rl]
    if old_keys:
        evidence.append(f"rl_config.{', '.join(old_keys)} (keys 2.x does not have)")
    return Generation("1.x", tuple(evidence)) if evidence else Generation("2.x")


def as_1x_rl_section(rl: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`rl_config` with 1.x's defaults and loss filled in; the changes, said in words.

    Keys the config sets itself keep their values, except the two 1.x's loss never read
    (`kl_penalty`, `entropy_coeff`): a value other than 1.x's is named in the changes."""
    out = dict(rl)
    changes = []
    if "use_integrated_worker" not in out:
        out["use_integrated_worker"] = False
        changes.append("use_integrated_worker defaults to false (the reference is ref_config)")
    if "mini_batch_size_unit" not in out:
        out["mini_batch_size_unit"] = "samples"
        changes.append("mini_batch_size counts samples")
    given_kl = out.get("kl_penalty")
    out["kl_penalty"] = ONE_X_KL_ESTIMATOR
    if given_kl is not None and given_kl not in ONE_X_KL_SPELLINGS:
        changes.append(
            f"KL estimator {ONE_X_KL_ESTIMATOR} (1.x's loss reads no kl_penalty: {given_kl})"
        )
    if out.get("entropy_coeff"):
        changes.append(
            f"no entropy term (1.x's loss reads no entropy_coeff: {out['entropy_coeff']})"
        )
    out["entropy_coeff"] = 0.0
    return out, changes


def generation_line(generation: Generation, changes: list[str]) -> str:
    """The one line the dry run and every run print for a 1.x config."""
    why = "; ".join(generation.evidence)
    return f"read as MindSpeed-RL 1.x ({why}): " + ", ".join(changes)


def settle_mini_batch_reading(
    run: RunConfig, generation: Generation, unit_given: bool
) -> tuple[RunConfig, str | None]:
    """Take the reading of `mini_batch_size` under which it is valid; None when unchanged.

    1.x: a value of at least a step's samples is the whole batch (one `torch.split` chunk).
    2.x (the default reading, prompts), unit not set by the config: a value that does not
    divide the prompts but divides the samples is read as samples. Values valid under both
    stay as they are (the dry run notes the other reading); under neither, validation
    refuses them."""
    alg = run.rl.algorithm
    mini = alg.mini_batch_size
    if not mini:
        return run, None
    prompts, n = run.train_prompts, alg.n_samples_per_prompt
    samples = prompts * n
    replace: dict[str, Any] = {}
    line = None
    if generation.is_1x and alg.mini_batch_size_unit == "samples" and mini > samples:
        replace["mini_batch_size"] = 0
        line = (
            f"mini_batch_size {mini} samples is more than the {samples} samples of a step "
            "(global_batch_size x n_samples_per_prompt): one optimizer step on the whole "
            "batch, as MindSpeed-RL 1.x's actor splits it"
        )
    elif (
        not unit_given
        and alg.mini_batch_size_unit == "prompts"
        and prompts % mini
        and samples % mini == 0
    ):
        replace["mini_batch_size_unit"] = "samples"
        line = (
            f"mini_batch_size {mini} read as samples (MindSpeed-RL 1.x: it does not divide "
            f"global_batch_size {prompts} as prompts): {alg.epochs * samples // mini} optimizer "
            "step(s) per RL step"
        )
    if not replace:
        return run, None
    algorithm = dataclasses.replace(alg, **replace)
    rl = dataclasses.replace(run.rl, algorithm=algorithm)
    return dataclasses.replace(run, rl=rl), line
