"""megatron-core's scale features, each against its baseline on CPU over gloo (several
processes, real megatron-core, 3 optimizer steps of the tiny model in fp32): the same losses
and gradient norms within 1e-5, and the effect each feature exists for, measured:
sequence parallel and recompute cut the activations autograd holds, the distributed
optimizer halves the optimizer state per rank at DP 2, and its checkpoint resumes at another
DP size with the next steps unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("_scale_rank.py")
TIMEOUT_S = 300.0
TOL = 1e-5
LAYERS = "model.tiny.num_layers=4"  # a virtual pipeline at PP 2 needs 2 chunks of 1 layer
TP2 = "actor_config.tensor_model_parallel_size=2"
PP2 = "actor_config.pipeline_model_parallel_size=2"
SP = "megatron_training.sequence_parallel=true"
DIST_OPT = "megatron_training.use_distributed_optimizer=true"
FULL_RECOMPUTE = [
    "megatron_training.recompute_granularity=full",
    "megatron_training.recompute_method=uniform",
    "megatron_training.recompute_num_layers=1",
]


@pytest.fixture(scope="module")
def four_layer_model() -> str:
    from mindrl.assets import models

    return str(models.tiny_model_dir(num_layers=4))


def _train(fresh_process, hf_dir: str, world: int, overrides: list[str], **extra: Any) -> dict:
    args = {"hf_dir": hf_dir, "overrides": [LAYERS, *overrides], "steps": 3, **extra}
    results = fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)
    first = results[0]
    for other in results[1:]:  # the step metrics are reduced over the role: same everywhere
        assert other["metrics"] == first["metrics"]
    first["per_rank"] = results
    return first


def _assert_same_training(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys()
        for key in x:
            if key.startswith("perf/"):  # what the layout feeds (SP pads to a multiple of TP)
                continue
            assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (step, key, x[key], y[key])
    # the weights moved: the steps are not all alike
    assert len({round(m["grad_norm"], 6) for m in a}) > 1


def test_sequence_parallel_matches_tp_and_splits_activations(fresh_process, four_layer_model):
    plain = _train(fresh_process, four_layer_model, 2, [TP2])
    sp = _train(fresh_process, four_layer_model, 2, [TP2, SP])
    _assert_same_training(sp["metrics"], plain["metrics"])
    assert max(sp["activation_peak_bytes"]) < max(plain["activation_peak_bytes"])


def test_distributed_optimizer_matches_and_halves_optimizer_state(fresh_process, four_layer_model):
    plain = _train(fresh_process, four_layer_model, 2, [])
    zero1 = _train(fresh_process, four_layer_model, 2, [DIST_OPT])
    _assert_same_training(zero1["metrics"], plain["metrics"])
    for p, z in zip(plain["per_rank"], zero1["per_rank"]):
        assert z["optimizer_state_bytes"] == pytest.approx(p["optimizer_state_bytes"] / 2, rel=0.02)
    overlapped = _train(
        fresh_process,
        four_layer_model,
        2,
        [
            DIST_OPT,
            "megatron_training.overlap_grad_reduce=true",
            "megatron_training.overlap_param_gather=true",
        ],
    )
    _assert_same_training(overlapped["metrics"], plain["metrics"])


def test_recompute_matches_and_cuts_activations(fresh_process, four_layer_model):
    plain = _train(fresh_process, four_layer_model, 1, [])
    full = _train(fresh_process, four_layer_model, 1, FULL_RECOMPUTE)
    selective = _train(
        fresh_process, four_layer_model, 1, ["megatron_training.recompute_granularity=selective"]
    )
    _assert_same_training(full["metrics"], plain["metrics"])
    _assert_same_training(selective["metrics"], plain["metrics"])
    kept = max(plain["activation_peak_bytes"])
    assert max(full["activation_peak_bytes"]) < 0.5 * kept
    assert max(selective["activation_peak_bytes"]) < kept


def test_virtual_pipeline_matches_pipeline(fresh_process, four_layer_model):
    pipeline = _train(fresh_process, four_layer_model, 2, [PP2])
    interleaved = _train(
        fresh_process,
        four_layer_model,
        2,
        [PP2, "actor_config.num_layers_per_virtual_pipeline_stage=1"],
    )
    _assert_same_training(interleaved["metrics"], pipeline["metrics"])


def test_distributed_optimizer_checkpoint_resumes_at_another_dp(
    fresh_process, four_layer_model, tmp_path
):
    """Saved at DP 2 after 2 steps; resumed at DP 2 and at DP 1, steps 3 and 4 equal the
    uninterrupted run's (step 4 depends on the restored Adam moments: without them it
    differs)."""
    ckpt = str(tmp_path / "iter_0000002")
    straight = _train(fresh_process, four_layer_model, 2, [DIST_OPT], steps=4)["metrics"]
    _train(fresh_process, four_layer_model, 2, [DIST_OPT], steps=2, save=ckpt)
    assert (Path(ckpt) / "dist_optimizer" / ".metadata").is_file()
    for world in (2, 1):
        resumed = _train(fresh_process, four_layer_model, world, [DIST_OPT], steps=2, resume=ckpt)
        _assert_same_training(resumed["metrics"], straight[2:])
    fresh_moments = _train(
        fresh_process,
        four_layer_model,
        1,
        [DIST_OPT, "actor_config.no_load_optim=true"],
        steps=2,
        resume=ckpt,
    )["metrics"]
    assert abs(fresh_moments[1]["grad_norm"] - straight[3]["grad_norm"]) > 1e-4


BF16_MOMENTS = [
    "megatron_training.use_precision_aware_optimizer=true",
    "megatron_training.exp_avg_dtype=bf16",
    "megatron_training.exp_avg_sq_dtype=bf16",
]


def test_bf16_adam_moments_shrink_the_optimizer_state_and_resume_exactly(
    fresh_process, four_layer_model, tmp_path
):
    """megatron's precision-aware optimizer keys on CPU (mindrl's host Adam). bf16 training
    (megatron's fp32 master weights): 12 -> 8 bytes of optimizer state per parameter, the first
    step as with fp32 moments and the next ones close; a distributed-optimizer checkpoint with
    bf16 moments saved at DP 2 resumes at DP 1 with the next steps equal."""
    bf16 = "megatron_training.bf16=true"
    wide = _train(fresh_process, four_layer_model, 1, [bf16])
    narrow = _train(fresh_process, four_layer_model, 1, [bf16, *BF16_MOMENTS])
    assert narrow["optimizer_state_bytes"] == pytest.approx(
        wide["optimizer_state_bytes"] * 2 / 3, rel=0.02
    )
    assert narrow["metrics"][0] == wide["metrics"][0]  # before any Adam step
    for x, y in zip(wide["metrics"], narrow["metrics"]):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=0.05)
    # the rounded moments moved the weights a little differently
    assert narrow["metrics"][-1]["grad_norm"] != wide["metrics"][-1]["grad_norm"]

    ckpt = str(tmp_path / "iter_0000002")
    narrow_dist = [DIST_OPT, *BF16_MOMENTS]
    straight = _train(fresh_process, four_layer_model, 2, narrow_dist, steps=4)["metrics"]
    _train(fresh_process, four_layer_model, 2, narrow_dist, steps=2, save=ckpt)
    resumed = _train(fresh_process, four_layer_model, 1, narrow_dist, steps=2, resume=ckpt)
    _assert_same_training(resumed["metrics"], straight[2:])
    fresh = _train(fresh_process, four_layer_model, 1, narrow_dist, steps=1)
    assert resumed["optimizer_state_bytes"] == fresh["optimizer_state_bytes"]  # bf16 again
