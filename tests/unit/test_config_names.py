"""Config choices name exactly what the algorithm and reward modules implement."""

from mindrl import algorithms
from mindrl.config import rl
from mindrl.rewards.registry import verifier_names


def test_advantage_estimators_match():
    implemented = set(algorithms.ADV_ESTIMATORS) | set(algorithms.ADV_ALIASES)
    assert set(rl.ADV_ESTIMATORS) == implemented


def test_kl_types_and_aggregation_modes_match():
    assert set(rl.KL_TYPES) == set(algorithms.KL_TYPES)
    assert set(rl.LOSS_AGG_MODES) == set(algorithms.LOSS_AGG_MODES)


def test_seed_verifier_names_are_registered():
    names = set(verifier_names())
    assert {
        "acc",
        "base_acc",
        "format",
        "strict_format",
        "cosine",
        "repetition",
        "soft_overlong",
    } <= names
