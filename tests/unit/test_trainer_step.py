"""The GRPO step and the rollout reassembly on the driver, with small in-process fakes of the
role facades (no Ray, no models): what the loop sends where, in which order, and what it
does with the answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from mindrl.algorithms.kl import FixedKLController
from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.data.tokenizer import LoadedTokenizer
from mindrl.rollout.base import RolloutRow
from mindrl.trainer.grpo import grpo_step, recomputes_old_log_probs
from mindrl.trainer.rollout_step import assemble_rollouts
from mindrl.trainer.setup import Prompts, Trainer
from mindrl.workers.facades import RolloutGenerator


def _row(prompt: int, tokens: list[int]) -> RolloutRow:
    return RolloutRow(prompt, tokens, [-0.5] * len(tokens), "stop")


def test_assemble_rollouts_orders_slices_and_offsets_prompt_indices():
    # 3 slices of 2 prompts; ranks 0,1 share slice 0 (inference TP 2), rank 1 returns None
    rows = assemble_rollouts(
        [2, 2, 2],
        [0, 0, 1, 2],
        [[_row(0, [1]), _row(1, [2])], None, [_row(0, [3]), _row(1, [4])], [_row(1, [5])]],
    )
    assert [r.prompt_index for r in rows] == [0, 1, 2, 3, 5]
    assert [r.token_ids for r in rows] == [[1], [2], [3], [4], [5]]


def test_assemble_rollouts_names_a_slice_nobody_returned():
    with pytest.raises(RuntimeError, match="prompt slice 1"):
        assemble_rollouts([1, 1], [0, 1], [[_row(0, [1])], None])


# ------------------------------------------------------------------ fakes of the facades
@dataclass
class Record:
    prompt_ids: tuple[int, ...]
    label: str
    prompt_text: str


class FakeDataset:
    def __init__(self, n: int) -> None:
        self.records = [Record((10 + i, 11 + i), str(i), f"p{i}") for i in range(n)]

    def batch(self, indices: list[int]) -> list[Record]:
        return [self.records[i] for i in indices]


class FakeSampler:
    def __init__(self, batch: int) -> None:
        self.batch, self.calls = batch, 0

    def next_batch(self) -> list[int]:
        start = self.calls * self.batch
        self.calls += 1
        return list(range(start, start + self.batch))


class FakeTokenizer:
    pad_token_id = 0

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


@dataclass
class FakeGenerator(RolloutGenerator):
    """Two generating ranks; response i of a prompt is i+1 copies of token 7 (so lengths
    and therefore scores differ within a group)."""

    calls: list[str] = field(default_factory=list)

    def rollout_ranks(self) -> list[int]:
        return [0, 1]

    def generate(self, prompts_per_rank, sampling, tools_kwargs_per_rank=None):
        self.calls.append("generate")
        return [
            [_row(p, [7] * (i + 1)) for p in range(len(prompts)) for i in range(sampling.n)]
            for prompts in prompts_per_rank
        ]

    def rollout_mode(self) -> None:
        self.calls.append("rollout_mode")

    def train_mode(self) -> None:
        self.calls.append("train_mode")


@dataclass
class FakeActor(FakeGenerator):
    updates: list[Any] = field(default_factory=list)

    def log_probs(self, batch):
        self.calls.append("log_probs")
        return torch.full(batch.response_mask.shape, -1.0) * batch.response_mask

    def update(self, batch, step):
        self.calls.append("update")
        self.updates.append((batch, step))
        return {"actor/pg_loss": 0.25, "grad_norm": 1.0}

    def sync_weights(self):
        self.calls.append("sync_weights")
        return {"timing/resharding_to_infer": 0.0, "resharding/bytes": 8.0}


@dataclass
class FakePending:
    value: torch.Tensor
    calls: list[str]

    def result(self) -> torch.Tensor:
        self.calls.append("ref_result")
        return self.value


@dataclass
class FakeRef:
    calls: list[str] = field(default_factory=list)

    def log_probs(self, batch):
        return self.start_log_probs(batch).result()

    def start_log_probs(self, batch):
        self.calls.append("ref_start")
        return FakePending(
            torch.full(batch.response_mask.shape, -0.9) * batch.response_mask, self.calls
        )


@dataclass
class FakeRoles:
    actor: FakeActor
    ref: FakeRef | None
    reward: Any = None
    rollout: Any = None
    critic: Any = None
    teacher: Any = None  # on-policy distillation's teacher (none here)

    @property
    def generator(self):
        return self.actor


class LengthScorer:
    """Scores a response by its token count: deterministic and different within a group."""

    def score(self, texts, labels, metas):
        scores = [float(len(t.split())) for t in texts]
        return type(
            "R",
            (),
            {
                "scores": scores,
                "metrics": {"len_rewards/mean": 1.0},
                "per_function": {"digit_share": scores},
            },
        )()


def _trainer(overrides: list[str]) -> tuple[Trainer, FakeActor]:
    run, _ = load_run_config("grpo_tiny_cpu", ["rl_config.n_samples_per_prompt=4", *overrides])
    actor = FakeActor()
    gbs = run.actor.batch.global_batch_size
    prompts = Prompts(FakeDataset(4 * gbs), FakeSampler(gbs), LoadedTokenizer(FakeTokenizer()))
    t = Trainer(
        run=run,
        prompts=prompts,
        roles=FakeRoles(actor, FakeRef()),  # type: ignore[arg-type]
        scorer=LengthScorer(),  # type: ignore[arg-type]
        kl_ctrl=FixedKLController(0.0),
        metrics=None,  # type: ignore[arg-type]
        checkpoints=None,  # type: ignore[arg-type]
        start_step=0,
    )
    return t, actor


def test_grpo_step_calls_the_roles_in_order_and_leaves_batches_alone():
    t, actor = _trainer(["rl_config.mini_batch_size=8"])  # all 8 prompts: one step
    assert not recomputes_old_log_probs(t.run)  # one optimizer step: on-policy
    metrics, scored = grpo_step(t, step=3)
    assert actor.calls == ["rollout_mode", "generate", "train_mode", "update", "sync_weights"]
    batch, step = actor.updates[0]
    assert step == 3
    gbs, n = t.run.actor.batch.global_batch_size, 4
    assert batch.size == gbs * n
    assert "old_log_probs" not in batch.tensors  # on-policy: the update's own are used
    assert set(batch.tensors) >= {"advantages", "ref_log_probs", "rollout_log_probs"}
    # group-normalised: advantages of each group sum to ~0 over its samples
    per_sample = (batch.tensors["advantages"] * batch.response_mask).sum(
        -1
    ) / batch.response_mask.sum(-1)
    assert per_sample.view(-1, n).sum(-1).abs().max() < 1e-4
    # the responses are 1..n tokens of 7; the length scorer's scores come back per sample
    assert scored.scores.view(-1, n)[0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert len(scored.completions) == batch.size
    assert metrics["grpo/score"] == pytest.approx(2.5)
    assert metrics["actor/pg_loss"] == 0.25 and metrics["resharding/bytes"] == 8.0
    for key in ("timing/rollout", "timing/update", "response_length/mean", "e2e_tps"):
        assert key in metrics


def test_grpo_step_recomputes_old_log_probs_when_a_batch_gets_several_optimizer_steps():
    # 2 prompts x 4 samples per step; the old log-probs by their own pass (MindSpeed-RL's way)
    t, actor = _trainer(["rl_config.mini_batch_size=2", "rl_config.recompute_old_log_prob=auto"])
    assert recomputes_old_log_probs(t.run)
    t.roles.ref.calls = actor.calls  # one record of both roles' calls
    metrics, _ = grpo_step(t, step=0)
    # the reference pass starts first and the old-policy pass runs while it goes
    assert actor.calls[actor.calls.index("ref_start") :] == [
        "ref_start",
        "log_probs",
        "ref_result",
        "update",
        "sync_weights",
    ]
    assert max(metrics["timing/ref"], metrics["timing/old_log_prob"]) <= metrics["timing/log_probs"]
    batch, _ = actor.updates[0]
    assert torch.equal(batch.tensors["old_log_probs"], -1.0 * batch.response_mask)
    assert "rollout/logprob_abs_diff" in metrics  # measured on the driver from old log-probs


def test_with_old_log_probs_in_update_the_driver_runs_no_old_policy_pass():
    t, actor = _trainer(
        ["rl_config.mini_batch_size=2", "rl_config.recompute_old_log_prob=in_update"]
    )
    assert not recomputes_old_log_probs(t.run)
    grpo_step(t, step=0)
    assert "log_probs" not in actor.calls  # the actor's update makes them
    batch, _ = actor.updates[0]
    assert "old_log_probs" not in batch.tensors
    # the KL-in-reward penalty reads them before the update: the pass stays
    kl, _ = _trainer(
        [
            "rl_config.mini_batch_size=2",
            "rl_config.recompute_old_log_prob=in_update",
            "rl_config.use_kl_loss=false",
            "rl_config.use_kl_in_reward=true",
        ]
    )
    assert recomputes_old_log_probs(kl.run)


def test_old_log_probs_in_update_refuse_several_epochs():
    with pytest.raises(ConfigError, match="in_update with epochs 2"):
        _trainer(["rl_config.recompute_old_log_prob=in_update", "rl_config.epochs=2"])


def test_overlong_filter_reaches_the_update_without_editing_the_rollout_batch():
    t, actor = _trainer(["rl_config.overlong_filter=true"])
    gen_rows = FakeGenerator.generate

    def cut(self, prompts_per_rank, sampling, tools_kwargs_per_rank=None):  # 2nd: max_tokens
        out = gen_rows(self, prompts_per_rank, sampling)
        return [
            [
                RolloutRow(r.prompt_index, r.token_ids, r.log_probs, "length" if i % 2 else "stop")
                for i, r in enumerate(rows)
            ]
            for rows in out
        ]

    actor.generate = cut.__get__(actor)  # type: ignore[method-assign]
    grpo_step(t, step=0)
    batch, _ = actor.updates[0]
    cut_rows = [i for i, f in enumerate(batch.meta["finish_reason"]) if f == "length"]
    kept_rows = [i for i, f in enumerate(batch.meta["finish_reason"]) if f == "stop"]
    assert batch.response_mask[cut_rows].sum() == 0
    assert (batch.response_mask[kept_rows].sum(-1) > 0).all()


def test_the_prompt_stores_extra_columns_reach_the_verifiers():
    """A store made with dataset_additional_keys carries those columns per prompt (e.g. a
    countdown target); each response's SampleMeta.extra holds its prompt's."""
    from mindrl.data.dataset import PromptRecord

    t, _ = _trainer(["rl_config.mini_batch_size=8"])
    records = [
        PromptRecord((10 + i, 11), f"p{i}", str(i), {"index": i, "row": i, "target": 100 + i})
        for i in range(32)
    ]
    t.prompts.dataset.records = records  # type: ignore[attr-defined]
    seen = []

    class MetaScorer(LengthScorer):
        def score(self, texts, labels, metas):
            seen.extend(metas)
            return super().score(texts, labels, metas)

    t.scorer = MetaScorer()  # type: ignore[misc]
    grpo_step(t, step=0)
    assert [m.extra for m in seen[::4]] == [{"target": 100 + i} for i in range(8)]


def test_reward_model_and_rules_together_are_weighted_and_summed():
    """rule_reward on beside a reward model: the verifier sum + reward_model_weight x the
    model's score, per sample; both sets of metrics kept."""
    t, _ = _trainer(["rl_config.mini_batch_size=8", "rl_config.reward_model_weight=0.5"])

    class FakeRewardModel:
        def scores(self, batch):  # 10, 20, 30, ... per sample
            return torch.arange(1, batch.size + 1, dtype=torch.float32) * 10

    t.roles.reward = FakeRewardModel()  # type: ignore[misc]
    _, scored = grpo_step(t, step=0)
    lengths = torch.tensor([1.0, 2.0, 3.0, 4.0]).repeat(8)
    expected = lengths + 0.5 * torch.arange(1, 33, dtype=torch.float32) * 10
    assert torch.allclose(scored.scores, expected)
    assert [c["score"] for c in scored.completions] == expected.tolist()
    assert "reward_model/mean" in scored.metrics and "len_rewards/mean" in scored.metrics
    assert torch.equal(scored.per_function["digit_share"], lengths)


# ------------------------------------------------------------ the one-step-off pipeline
@dataclass
class FakeRolloutGroup(FakeGenerator):
    """A separate rollout group; it shares the actor's call log, so the test sees the order
    of both roles' calls. `generate_async` records the call; `collect` returns its rows."""

    log: list[str] = field(default_factory=list)
    loaded: int = 0

    def generate_async(self, prompts_per_rank, sampling, tools_kwargs_per_rank=None):
        self.log.append(f"dispatch seed={sampling.seed}")
        return FakeGenerator.generate(self, prompts_per_rank, sampling)

    def collect(self, refs):
        self.log.append("collect")
        return refs

    def load_weights(self, bucket_refs):
        self.log.append("load_weights")
        self.loaded += 1
        return 8


class PipelineActor(FakeActor):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def update(self, batch, step):
        self.log.append(f"update {step}")
        return super().update(batch, step)

    def pack_weights(self):
        return ["bucket"]


class StatefulSampler(FakeSampler):
    def state_dict(self) -> dict[str, int]:
        return {"epoch": 0, "position": self.calls * self.batch}


def _pipelined(overrides: list[str] = ()) -> tuple[Trainer, PipelineActor, FakeRolloutGroup]:
    from mindrl.trainer.pipeline import StalenessPipeline  # noqa: F401  (import check)

    t, _ = _trainer(
        [
            "rl_config.mini_batch_size=8",
            "rl_config.rollout_resource.num_npus=1",
            "rl_config.rollout_staleness=1",
            "megatron_training.train_iters=3",
            *overrides,
        ]
    )
    log: list[str] = []
    actor, rollout = PipelineActor(log), FakeRolloutGroup(log=log)
    t.roles = FakeRoles(actor, FakeRef(), rollout=rollout)  # type: ignore[misc]
    t.prompts.sampler = StatefulSampler(t.run.actor.batch.global_batch_size)  # type: ignore[misc]
    return t, actor, rollout


def test_the_pipeline_generates_the_next_batch_while_the_actor_trains():
    from mindrl.trainer.grpo import run_state_now
    from mindrl.trainer.pipeline import StalenessPipeline

    t, actor, rollout = _pipelined()
    assert t.run.rl.algorithm.use_tis  # on by default in this mode
    pipeline = StalenessPipeline(t)
    staleness, states = [], []
    for step in range(3):
        metrics, _ = grpo_step(t, step, pipeline=pipeline)
        staleness.append(metrics["rollout/staleness"])
        states.append(run_state_now(t, step + 1, pipeline).sampler["position"])
        assert ("timing/overlap" in metrics) == (step < 2)  # nothing in flight after the last
    seeds = [line for line in rollout.log if line.startswith("dispatch")]
    base = seeds[0].split("=")[1]
    assert rollout.log == [
        seeds[0],
        "collect",  # step 0's batch: generated synchronously
        seeds[1],
        "update 0",
        "collect",
        "load_weights",  # step 1's beside update 0
        seeds[2],
        "update 1",
        "collect",
        "load_weights",
        "update 2",
        "load_weights",  # the last step starts no generation
    ]
    assert int(seeds[1].split("=")[1]) == int(base) + 1  # each batch has its own step's seed
    assert staleness == [0.0, 1.0, 1.0]
    versions = [b.meta["policy_version"][0] for b, _ in actor.updates]
    assert versions == [0, 0, 1]  # batch k+1 came from the weights before update k
    gbs = t.run.actor.batch.global_batch_size
    # a checkpoint after step k records the sampler before the batch in flight was drawn
    assert states == [gbs, 2 * gbs, 3 * gbs]
    prompts = [b.meta["prompt_text"][0] for b, _ in actor.updates]
    assert prompts == ["p0", f"p{gbs}", f"p{2 * gbs}"]


def test_the_pipeline_needs_its_own_rollout_devices_and_keeps_an_explicit_use_tis():
    from mindrl.config.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout_staleness: 1 generates beside training"):
        load_run_config("grpo_tiny_cpu", ["rl_config.rollout_staleness=1"])
    with pytest.raises(ConfigError, match="rollout_staleness: 2 generates beside training"):
        load_run_config("grpo_tiny_cpu", ["rl_config.rollout_staleness=2"])
    t, _, _ = _pipelined(["rl_config.use_tis=false"])
    assert not t.run.rl.algorithm.use_tis
