"""Sequence packing on megatron-core over gloo (several processes, fp32): the reference and
old-policy log-probs, the update's losses and its gradients are those of the padded batch
(<= 1e-5) with packing (use_remove_padding), token-budget micro-batches (use_dynamic_bsz)
and both, at TP 1, TP 2 with sequence parallelism, PP 2, DP 2 (where the ranks' budgets
give them different micro-batch counts until they agree on the largest) and a Qwen3-MoE at
expert parallel 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).with_name("_packing_rank.py")
TIMEOUT_S = 300.0
TOL = 1e-5
POLICY_TOL = 1e-3
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "grad_norm")
PACKED = ["rl_config.use_remove_padding=true"]
BUDGET = [
    "rl_config.use_dynamic_bsz=true",
    "rl_config.ref_max_packing_token_size=120",
    "rl_config.actor_max_packing_token_size=100",
    "rl_config.update_max_packing_token_size=90",
    "rl_config.update_dynamic_max_batch_size=5",
]
TP2_SP = [
    "actor_config.tensor_model_parallel_size=2",
    "actor_config.sequence_parallel=true",
]
PP2 = ["actor_config.pipeline_model_parallel_size=2"]


def _run(
    fresh_process,
    hf_dir: str | None,
    world: int,
    overrides: list[str],
    tmp: Path,
    config: str = "grpo_tiny_cpu",
    grouped: bool = False,
    old_pass: bool = False,
    steps: int = 2,
    hf_weights: Path | None = None,
) -> dict:
    grads = tmp / f"grads-{len(list(tmp.iterdir()))}.pt"
    args = {
        "hf_dir": hf_dir,
        "config": config,
        "overrides": overrides,
        "steps": steps,
        "hf_weights": None if hf_weights is None else str(hf_weights),
        "grads": str(grads),
        "grouped": grouped,
        "old_pass": old_pass,
    }
    results = fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)
    for other in results[1:]:
        for key in ("ref", "actor", "policy"):
            assert other[key] == results[0][key]
    return {**results[0], "grads": torch.load(grads, weights_only=True)}


def _close(a: Any, b: Any, what: str, tol: float = TOL) -> None:
    gap = float((torch.tensor(a) - torch.tensor(b)).abs().max())
    assert gap <= tol, f"{what}: max difference {gap}"


def _same_run(a: dict, b: dict, *, grads: bool = True) -> None:
    for key in ("ref", "actor"):
        _close(a[key], b[key], key)
    # after two Adam steps: Adam moves a weight by ~lr whatever its gradient's size, so float
    # noise in a near-zero gradient can move it by up to 2 x lr (1e-3 here)
    _close(a["policy"], b["policy"], "policy after the updates", POLICY_TOL)
    for step, (x, y) in enumerate(zip(a["metrics"], b["metrics"], strict=True)):
        for key in LOSSES:
            assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (step, key, x[key], y[key])
    if grads:  # same layout: the same shards
        for step, named in a["grads"].items():
            assert named.keys() == b["grads"][step].keys()
            for name, g in named.items():
                _close(g, b["grads"][step][name], f"step {step} gradient of {name}")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packing")


@pytest.fixture(scope="module")
def fresh(work):
    from tests.fresh_process import FreshProcess

    return FreshProcess(work / "fresh")


@pytest.fixture(scope="module")
def grads_dir(work) -> Path:
    path = work / "grads"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def padded_tp1(fresh, tiny_model_dir, grads_dir) -> dict:
    return _run(fresh, str(tiny_model_dir), 1, [], grads_dir)


@pytest.mark.parametrize(
    "overrides", [PACKED, BUDGET, PACKED + BUDGET], ids=["packed", "budget", "packed+budget"]
)
def test_tp1_packed_and_budgeted_equal_padded(
    fresh, tiny_model_dir, grads_dir, padded_tp1, overrides
):
    run = _run(fresh, str(tiny_model_dir), 1, overrides, grads_dir)
    _same_run(run, padded_tp1)
    padding = [m["perf/padding_fraction_actor_update"] for m in run["metrics"]]
    if "rl_config.use_remove_padding=true" in overrides:
        assert padding == [0.0, 0.0]  # every token fed is a sample's
    assert (
        all(
            p < m["perf/padding_fraction_actor_update"] or p == 0.0
            for p, m in zip(padding, padded_tp1["metrics"])
        )
        or "rl_config.use_remove_padding=true" not in overrides
    )


@pytest.mark.parametrize("layout", [TP2_SP, PP2], ids=["tp2-sp", "pp2"])
def test_packed_equals_padded_at_tp2_sp_and_pp2(
    fresh, tiny_model_dir, grads_dir, padded_tp1, layout
):
    padded = _run(fresh, str(tiny_model_dir), 2, layout, grads_dir)
    packed = _run(fresh, str(tiny_model_dir), 2, layout + PACKED + BUDGET, grads_dir)
    _same_run(packed, padded)
    _same_run(packed, padded_tp1, grads=False)


DP_BUDGET = [
    "rl_config.use_dynamic_bsz=true",
    "rl_config.ref_max_packing_token_size=76",
    "rl_config.actor_max_packing_token_size=104",
    "rl_config.update_max_packing_token_size=104",
]


def test_data_parallel_ranks_agree_on_the_micro_batch_count(
    fresh, tiny_model_dir, grads_dir, padded_tp1
):
    """DP 2: each rank packs its own half by the budget, and the budgets give the halves
    different micro-batch counts (checked here) until they agree on the larger; the log-probs
    and losses are the DP 1 padded run's."""
    from mindrl.data.packing import balanced_partitions
    from tests.integration._scale_rank import synthetic_batch

    lengths = synthetic_batch(448).attention_mask.sum(-1).tolist()
    for budget in (76, 104):
        counts = {len(balanced_partitions(lengths[h * 8 : h * 8 + 8], budget)) for h in (0, 1)}
        assert len(counts) == 2, (budget, counts)
    run = _run(fresh, str(tiny_model_dir), 2, PACKED + DP_BUDGET, grads_dir)
    _same_run(run, padded_tp1, grads=False)


def test_expert_parallel_moe_packed_equals_padded(fresh, grads_dir):
    """Qwen3-MoE at EP 2 (grpo_tiny_moe_cpu): experts exchange tokens at every forward, so
    the two ranks must run as many packed micro-batches though their budgets differ. The
    load-balancing loss is off here: a padded run routes its padding tokens too and counts
    them in the balance (packing leaves them out, which is the point), so with it on the two
    train on different losses by design."""
    no_balance = ["actor_config.moe_aux_loss_coeff=0"]
    padded = _run(fresh, None, 2, no_balance, grads_dir, config="grpo_tiny_moe_cpu")
    packed = _run(
        fresh, None, 2, no_balance + PACKED + DP_BUDGET, grads_dir, config="grpo_tiny_moe_cpu"
    )
    _same_run(packed, padded)


SHARED = PACKED + ["rl_config.share_prompt_forward=true"]


@pytest.fixture(scope="module")
def grouped_padded_tp1(fresh, tiny_model_dir, grads_dir) -> dict:
    return _run(fresh, str(tiny_model_dir), 1, [], grads_dir, grouped=True)


@pytest.mark.parametrize("overrides", [SHARED, SHARED + BUDGET], ids=["shared", "shared+budget"])
def test_shared_prompts_equal_padded_at_tp1(
    fresh, tiny_model_dir, grads_dir, grouped_padded_tp1, overrides
):
    """GRPO's layout (4 rows per prompt): each prompt runs once per micro-batch, its rows'
    responses attending to it, and the log-probs, losses and gradients are the padded run's."""
    run = _run(fresh, str(tiny_model_dir), 1, overrides, grads_dir, grouped=True)
    _same_run(run, grouped_padded_tp1)
    for m in run["metrics"]:
        assert m["perf/padding_fraction_actor_update"] == 0.0
        # 4 rows of one 10-12 token prompt share a micro-batch: 3 of 4 prompt copies go
        assert 0.2 < m["perf/shared_prompt_fraction_actor_update"] < 0.5


@pytest.mark.parametrize("layout", [TP2_SP, PP2], ids=["tp2-sp", "pp2"])
def test_shared_prompts_equal_padded_at_tp2_sp_and_pp2(
    fresh, tiny_model_dir, grads_dir, grouped_padded_tp1, layout
):
    padded = _run(fresh, str(tiny_model_dir), 2, layout, grads_dir, grouped=True)
    shared = _run(fresh, str(tiny_model_dir), 2, layout + SHARED + BUDGET, grads_dir, grouped=True)
    _same_run(shared, padded)
    _same_run(shared, grouped_padded_tp1, grads=False)


def test_old_log_probs_made_in_the_update_equal_their_own_pass(fresh, tiny_model_dir, grads_dir):
    """`recompute_old_log_prob: in_update`: two shuffled mini-batches; the update computes
    the second's old log-probs before its first step and the first takes its own. Step 0's
    losses and gradients equal those of a batch that carries the old log-probs from their own
    pass (step 1 reuses the batch, whose old log-probs are then stale by design)."""
    # 8 samples per prompt in the config: 1 prompt = 8 of the 16 rows per mini-batch
    two = ["rl_config.mini_batch_size=1", "rl_config.shuffle_minibatch=true"]
    hf = str(tiny_model_dir)
    own = _run(
        fresh, hf, 1, [*two, "rl_config.recompute_old_log_prob=always"], grads_dir, old_pass=True
    )
    inside = _run(fresh, hf, 1, [*two, "rl_config.recompute_old_log_prob=in_update"], grads_dir)
    stale = _run(fresh, hf, 1, two, grads_dir)  # no old log-probs: each mini-batch its own

    def step0_gap(a: dict, b: dict) -> float:
        gaps = [abs(a["metrics"][0][k] - b["metrics"][0][k]) for k in LOSSES]
        for name, g in a["grads"][0].items():
            gaps.append(float((g - b["grads"][0][name]).abs().max()))
        return max(gaps)

    assert step0_gap(own, inside) <= TOL
    # without the second mini-batch's old log-probs its ratio is 1: a different update
    assert step0_gap(own, stale) > 100 * TOL
