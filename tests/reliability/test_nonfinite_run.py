"""A run whose updates turn non-finite (`cli/train_grpo.py --config-name grpo_tiny_cpu`, real
Ray, megatron and vLLM workers, learning rate 1e6 and no clipping): the first update blows
the weights up, every later one is skipped as non-finite, and after
`rl_config.max_consecutive_skipped_updates` in a row the run stops with one error line naming
the step; the newest checkpoint is the last one saved before the streak (loadable, finite)
and no HF export is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e._run import TRAIN_TIMEOUT_S, read_metrics, run_train

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

LIMIT = 2  # updates skipped in a row that stop the run
ERROR = re.compile(
    r"^error: step (\d+): (\d+) actor updates in a row skipped .*; last checkpoint (\S+)$"
)


def _finite_weights(iter_dir: Path, hf_dir: Path) -> bool:
    """Read the checkpoint the way the converter does (manifest, then every model tensor)."""
    import torch
    from safetensors.torch import load_file

    from mindrl.checkpoint.atomic import verify_manifest
    from mindrl.checkpoint.offline import convert_mcore_to_hf
    from mindrl.checkpoint.train_state import MODEL_DIR

    verify_manifest(iter_dir)
    convert_mcore_to_hf(iter_dir / MODEL_DIR, hf_dir)
    tensors = [t for f in sorted(hf_dir.glob("*.safetensors")) for t in load_file(f).values()]
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors)


def test_run_of_skipped_updates_stops_before_saving_or_exporting(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    result = run_train(
        out,
        "actor_config.train_iters=8",
        "megatron_training.save_interval=1",
        "actor_config.lr=1e6",
        "actor_config.clip_grad=0",
        "rl_config.mini_batch_size=8",  # one optimizer update per step
        f"rl_config.max_consecutive_skipped_updates={LIMIT}",
        timeout_s=TRAIN_TIMEOUT_S,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    found = ERROR.match(errors[0])
    assert found, errors[0]
    step, streak, last = int(found[1]), int(found[2]), found[3]
    assert streak == LIMIT
    assert "Traceback" not in result.stderr
    # the stopping step is logged (its console line shows the skips), then nothing more
    records = read_metrics(out)
    assert records[-1]["step"] == step
    assert records[-1]["actor/consecutive_skipped_updates"] == LIMIT
    assert records[-1]["grad_norm"] is None  # NaN, written as JSON null
    assert f"skipped_in_a_row={LIMIT}" in result.stdout
    # checkpoints: none from the streak, the newest is the last applied update's
    ckpt = out / "ckpt"
    first_skip = step - LIMIT + 1
    saved = sorted(int(p.name.removeprefix("iter_")) for p in ckpt.glob("iter_*"))
    assert saved and saved[-1] == first_skip - 1, saved
    assert last == f"iter_{saved[-1]:07d}"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(saved[-1])
    assert _finite_weights(ckpt / last, tmp_path / "newest_as_hf")
    assert not (ckpt / "hf_final").exists() and not (out / "hf_final").exists()
