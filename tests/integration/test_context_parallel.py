"""Context parallelism on megatron-core's local attention over gloo (several processes, fp32):
the reference and old-policy log-probs, the update's losses, grad norm and the policy after
the updates at CP 2 are those of CP 1 (<= 1e-5), padded and packed (use_remove_padding), ring
(megatron_cp_algo) and Ulysses (ulysses_cp_algo); hybrid_cp_algo at CP 4 those of CP 1;
TP 2 x CP 2 those of TP 2 (with sequence parallelism too) and PP 2 x CP 2 those of PP 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.test_packing import PACKED, POLICY_TOL, PP2, TP2_SP, _close, _run, _same_run

CP2 = ["actor_config.context_parallel_size=2"]
RING = ["actor_config.context_parallel_algo=megatron_cp_algo"]
ULYSSES = ["actor_config.context_parallel_algo=ulysses_cp_algo"]
TP2 = ["actor_config.tensor_model_parallel_size=2"]
HYBRID_CP4 = [
    "actor_config.context_parallel_size=4",
    "actor_config.context_parallel_algo=hybrid_cp_algo",
    "actor_config.ulysses_degree_in_cp=2",
]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("context_parallel")


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
def cp1(fresh, tiny_model_dir, grads_dir) -> dict:
    weights = grads_dir / "hf-cp1.pt"
    return _run(fresh, str(tiny_model_dir), 1, [], grads_dir, steps=3, hf_weights=weights)


@pytest.fixture(scope="module")
def cp1_packed(fresh, tiny_model_dir, grads_dir) -> dict:
    return _run(fresh, str(tiny_model_dir), 1, PACKED, grads_dir, steps=3)


def test_ring_cp2_equals_cp1_padded(fresh, tiny_model_dir, grads_dir, cp1):
    weights = grads_dir / "hf-cp2.pt"
    run = _run(fresh, str(tiny_model_dir), 2, CP2 + RING, grads_dir, steps=3, hf_weights=weights)
    _same_run(run, cp1)  # CP ranks hold whole weights: the same gradients as CP 1
    # the weight sync and the converter read whole HF tensors, as at CP 1
    cp2_hf = torch.load(weights, weights_only=True)
    cp1_hf = torch.load(grads_dir / "hf-cp1.pt", weights_only=True)
    assert cp2_hf.keys() == cp1_hf.keys()
    for name, tensor in cp1_hf.items():
        assert cp2_hf[name].shape == tensor.shape, name
        _close(cp2_hf[name], tensor, name, POLICY_TOL)


@pytest.mark.slow
def test_ring_cp2_equals_cp1_packed(fresh, tiny_model_dir, grads_dir, cp1_packed):
    run = _run(fresh, str(tiny_model_dir), 2, CP2 + RING + PACKED, grads_dir, steps=3)
    _same_run(run, cp1_packed)


@pytest.mark.slow
@pytest.mark.parametrize("packed", [[], PACKED], ids=["padded", "packed"])
def test_ulysses_cp2_equals_cp1(fresh, tiny_model_dir, grads_dir, cp1, cp1_packed, packed):
    run = _run(fresh, str(tiny_model_dir), 2, CP2 + ULYSSES + packed, grads_dir, steps=3)
    _same_run(run, cp1_packed if packed else cp1)


@pytest.mark.slow
@pytest.mark.parametrize("algo", [RING, ULYSSES], ids=["ring", "ulysses"])
def test_tp2_cp2_equals_tp2(fresh, tiny_model_dir, grads_dir, algo):
    tp2 = _run(fresh, str(tiny_model_dir), 2, TP2, grads_dir, steps=3)
    run = _run(fresh, str(tiny_model_dir), 4, TP2 + CP2 + algo, grads_dir, steps=3)
    _same_run(run, tp2)


@pytest.mark.slow
def test_hybrid_cp4_equals_cp1(fresh, tiny_model_dir, grads_dir, cp1):
    """hybrid_cp_algo: Ulysses 2 inside a ring of 2, on 4 processes."""
    run = _run(fresh, str(tiny_model_dir), 4, HYBRID_CP4, grads_dir, steps=3)
    _same_run(run, cp1)


@pytest.mark.slow
def test_tp2_sp_cp2_equals_tp2_sp(fresh, tiny_model_dir, grads_dir):
    """Sequence parallelism splits each CP rank's tokens over TP as it splits them without CP."""
    base = _run(fresh, str(tiny_model_dir), 2, TP2_SP, grads_dir, steps=3)
    run = _run(fresh, str(tiny_model_dir), 4, TP2_SP + CP2 + RING, grads_dir, steps=3)
    _same_run(run, base)


@pytest.mark.slow
def test_pp2_cp2_equals_pp2(fresh, tiny_model_dir, grads_dir):
    """Pipeline stages pass their CP share of the tokens on; the last gathers."""
    base = _run(fresh, str(tiny_model_dir), 2, PP2, grads_dir, steps=3)
    run = _run(fresh, str(tiny_model_dir), 4, PP2 + CP2 + RING, grads_dir, steps=3)
    _same_run(run, base)


ATTENTION_SCRIPT = Path(__file__).with_name("_cp_attention_rank.py")


LAYOUTS = [  # algo, CP, Ulysses degree (hybrid), how keys / values cross the ring
    ("megatron_cp_algo", 2, None, "pass"),
    ("megatron_cp_algo", 3, None, "pass"),
    ("megatron_cp_algo", 3, None, "gather"),
    ("ulysses_cp_algo", 2, None, "gather"),
    ("hybrid_cp_algo", 4, 2, "pass"),  # Ulysses 2 inside a ring of 2
]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(
    ("algo", "world", "ulysses", "ring_kv"),
    LAYOUTS,
    ids=[f"{a}-cp{w}-{kv}" for a, w, _, kv in LAYOUTS],
)
def test_attention_across_cp_ranks_equals_whole_sequence(
    fresh, algo, world, ulysses, ring_kv, packed
):
    """fp64: this rank's rows of the whole sequence's attention and of its gradients."""
    args = {"algo": algo, "packed": packed, "ulysses": ulysses, "ring_kv": ring_kv}
    results = fresh.ranks(ATTENTION_SCRIPT, args, world_size=world, timeout_s=600.0)
    for rank in results:
        assert rank["out"] < 1e-12 and rank["grads"] < 1e-12, rank
