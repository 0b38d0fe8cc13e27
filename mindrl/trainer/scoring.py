"""Scoring a rollout batch: rule verifiers on the decoded responses, or a reward model.

Returns what it computed (scores, metrics, the completions to log) instead of keeping any
of it for later: the loop decides what to log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mindrl.data.batch import SampleBatch

if TYPE_CHECKING:
    from mindrl.config.rl_features import DapoConfig
    from mindrl.rewards.scorer import RewardScorer
    from mindrl.trainer.setup import Trainer
    from mindrl.workers.facades import RewardModelGroup


@dataclass(frozen=True)
class Scored:
    scores: torch.Tensor  # [B] float32, the reward of each sample
    metrics: dict[str, float]
    completions: list[dict[str, Any]] = field(default_factory=list)
    per_function: dict[str, torch.Tensor] = field(default_factory=dict)  # [B] unweighted

    def select(self, index: torch.Tensor) -> Scored:
        """Samples `index` (the metrics stay those of the whole batch)."""
        rows = index.tolist()
        return Scored(
            self.scores[index],
            self.metrics,
            [self.completions[i] for i in rows] if self.completions else [],
            {name: values[index] for name, values in self.per_function.items()},
        )

    @staticmethod
    def concat(parts: list[Scored], metrics: dict[str, float]) -> Scored:
        return Scored(
            torch.cat([p.scores for p in parts]),
            metrics,
            [c for p in parts for c in p.completions],
            {k: torch.cat([p.per_function[k] for p in parts]) for k in parts[0].per_function},
        )


def response_texts(batch: SampleBatch, tokenizer: Any) -> list[str]:
    out = []
    for ids, p, n in zip(batch.input_ids, batch.prompt_lengths, batch.response_lengths):
        out.append(tokenizer.decode(ids[int(p) : int(p) + int(n)], skip_special_tokens=True))
    return out


def score_with_verifiers(
    batch: SampleBatch,
    scorer: RewardScorer,
    tokenizer: Any,
    max_tokens: int,
    overlong: DapoConfig | None = None,
) -> Scored:
    """`rl_config.verifier_function` x `verifier_weight` on each decoded response, plus
    DAPO's overlong buffer penalty when `overlong.overlong_buffer_enable`."""
    from mindrl.algorithms.dapo import overlong_buffer_penalty
    from mindrl.rewards.types import SampleMeta

    texts = response_texts(batch, tokenizer)
    extras = batch.meta.get("extra") or [{}] * batch.size
    agents = batch.meta.get("agent") or [None] * batch.size  # multi-turn: retool_reward's count
    metas = [
        SampleMeta(
            response_length=int(n),
            max_length=max_tokens,
            finish_reason=f,
            extra=x,
            tool_calls=None if a is None else a.tool_calls,
        )
        for n, f, x, a in zip(
            batch.response_lengths.tolist(), batch.meta["finish_reason"], extras, agents
        )
    ]
    result = scorer.score(texts, batch.meta["label"], metas)
    scores = torch.tensor(result.scores, dtype=torch.float32)
    metrics = dict(result.metrics)
    if overlong is not None and overlong.overlong_buffer_enable:
        penalty = overlong_buffer_penalty(
            batch.response_lengths,
            overlong.rollout_max_tokens,
            overlong.overlong_buffer,
            overlong.overlong_buffer_penalty_factor,
        )
        scores = scores + penalty
        metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
    completions = [
        {"prompt": p, "response": t, "label": lab, "score": s}
        for p, t, lab, s in zip(
            batch.meta["prompt_text"], texts, batch.meta["label"], scores.tolist()
        )
    ]
    if "policy_version" in batch.meta:  # off-policy modes: the weights each sample came from
        for record, version in zip(completions, batch.meta["policy_version"]):
            record["policy_version"] = int(version)
    per_function = {
        name: torch.tensor(values, dtype=torch.float32)
        for name, values in result.per_function.items()
    }
    return Scored(scores, metrics, completions, per_function)


def score_with_reward_model(batch: SampleBatch, reward_model: RewardModelGroup) -> Scored:
    scores = reward_model.scores(batch)
    return Scored(scores, {"reward_model/mean": float(scores.mean())})


def score_batch(t: Trainer, batch: SampleBatch) -> Scored:
    """The rule verifiers (rule_reward), the reward model (a reward role), or both: then
    the weighted verifier sum plus reward_model_weight x the model's score."""
    model = None
    if t.roles.reward is not None:
        model = score_with_reward_model(batch, t.roles.reward)
        if t.scorer is None:
            return model
    assert t.scorer is not None
    max_tokens = t.run.generate.sampling_config.max_tokens
    rules = score_with_verifiers(batch, t.scorer, t.prompts.tokenizer, max_tokens, t.run.rl.dapo)
    if model is None:
        return rules
    return combined(rules, model, t.run.rl.reward.reward_model_weight)


def combined(rules: Scored, model: Scored, weight: float) -> Scored:
    """Rule scores plus `weight` x the reward model's, per sample (both sets of metrics)."""
    scores = rules.scores + weight * model.scores
    completions = [{**c, "score": s} for c, s in zip(rules.completions, scores.tolist())]
    return Scored(
        scores,
        {**rules.metrics, **model.metrics},
        completions,
        {**rules.per_function, "reward_model": model.scores},
    )
