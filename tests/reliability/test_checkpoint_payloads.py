"""A checkpoint is data someone else may have written: a payload planted in any file a
trainer checkpoint holds never runs, and the load fails with one line naming the file.

The fast tests plant payloads in real files of each kind (a torch.save'd rank state, a
torch distributed-checkpoint folder, the driver's JSON); the e2e test plants one in a real
run's checkpoint and resumes it through the CLI, with and without `load_fallback`.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mindrl.checkpoint.atomic import verify_manifest, write_manifest
from mindrl.checkpoint.errors import CheckpointReadError
from mindrl.checkpoint.rng_state import RngState
from mindrl.checkpoint.safe_load import check_dcp_folder
from mindrl.checkpoint.train_state import (
    RankTrainState,
    load_rank_state,
    rank_state_path,
    save_rank_state,
    verify_rank_states,
)

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this creates `marker`: proof that the load executed code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def _real_rank_state(iter_dir: Path) -> Path:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    state = RankTrainState(
        opt.state_dict(), {"num_steps": 1, "max_lr": 1e-3}, 0, RngState.capture()
    )
    return save_rank_state(iter_dir, 0, state)


def _real_dcp_folder(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(6.0).view(2, 3)}, checkpoint_id=str(folder), no_dist=True)
    torch.save({"iteration": 3}, folder / "common.pt")
    return folder


def test_a_real_rank_state_round_trips(tmp_path):
    path = _real_rank_state(tmp_path)
    state = load_rank_state(tmp_path, 0)
    assert state.scheduler["num_steps"] == 1 and state.optimizer["state"]
    assert verify_rank_states(tmp_path) == 1
    assert path == rank_state_path(tmp_path, 0)


def test_payload_in_a_rank_state_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = _real_rank_state(tmp_path)
    torch.save({"format": 1, "optimizer": Payload(marker)}, path)
    for load in (lambda: load_rank_state(tmp_path, 0), lambda: verify_rank_states(tmp_path)):
        with pytest.raises(CheckpointReadError, match="refused") as err:
            load()
        assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_truncated_rank_state_names_the_file(tmp_path):
    path = _real_rank_state(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointReadError, match="unreadable") as err:
        load_rank_state(tmp_path, 0)
    assert err.value.path == str(path)


@pytest.mark.parametrize("victim", [".metadata", "common.pt"])
def test_payload_in_a_dist_checkpoint_folder_does_not_run(tmp_path, victim):
    folder = _real_dcp_folder(tmp_path / "model")
    check_dcp_folder(folder)  # the real folder passes
    marker = tmp_path / "pwned"
    if victim == ".metadata":
        (folder / victim).write_bytes(pickle.dumps(Payload(marker)))
    else:
        torch.save({"iteration": Payload(marker)}, folder / victim)
    with pytest.raises(CheckpointReadError, match="refused") as err:
        check_dcp_folder(folder)
    assert err.value.path == str(folder / victim)
    assert not marker.exists()


def test_manifest_catches_a_truncated_or_missing_file(tmp_path):
    _real_rank_state(tmp_path)
    (tmp_path / "run_state.json").write_text(json.dumps({"step": 1}))
    write_manifest(tmp_path)
    verify_manifest(tmp_path)
    victim = rank_state_path(tmp_path, 0)
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(CheckpointReadError, match="truncated") as err:
        verify_manifest(tmp_path)
    assert err.value.path == str(victim)
    victim.unlink()
    with pytest.raises(CheckpointReadError, match="missing"):
        verify_manifest(tmp_path)


# ---------------------------------------------------------------- through the CLI
def _train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(ROOT / "cli" / "train_grpo.py"),
        "--config-name",
        "grpo_tiny_cpu",
        "megatron_training.save_interval=1",
        "actor_config.keep_last_n_checkpoints=0",
        f"runtime.output_dir={out}",
        f"actor_config.save={out}/ckpt",
        *overrides,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.multiproc
def test_resume_refuses_a_planted_checkpoint_and_falls_back_when_asked(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    first = _train(out, "actor_config.train_iters=2")
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = out / "ckpt"
    latest = ckpt / "iter_0000002"
    marker = tmp_path / "pwned"
    victim = rank_state_path(latest, 0)
    torch.save({"format": 1, "optimizer": Payload(marker)}, victim)
    write_manifest(latest)  # a forged checkpoint: its manifest agrees with the payload

    resume = ("actor_config.train_iters=3", f"actor_config.load={ckpt}")
    refused = _train(out, *resume)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(victim) in errors[0] and "refused" in errors[0]
    assert "load_fallback=previous" in errors[0] and "iter_0000001" in errors[0]
    assert not marker.exists()

    fallback = _train(out, *resume, "actor_config.load_fallback=previous")
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "falling back to iter_0000001" in fallback.stderr + fallback.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [2, 3]  # resumed after step 1, steps 2 and 3 re-run
    assert not marker.exists()
