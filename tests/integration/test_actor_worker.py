"""The actor worker on real megatron-core: training log-probs equal the rollout engine's, and a
non-finite loss or grad norm skips the update (counted) instead of corrupting the weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_actor_nonfinite.py")


@pytest.mark.multiproc
def test_non_finite_update_is_skipped_and_counted(tiny_model_dir):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mismatch"] < 1e-4  # megatron's log-probs of the sampled tokens == the engine's
    # grpo_tiny_cpu: 8 prompts x 8 samples in mini-batches of 32 -> two optimizer steps
    assert out["skipped_after_bad"] == 2 and out["bad_grad_norm_nan"]
    assert out["unchanged_after_bad"]
    assert out["skipped_after_good"] == 2  # the count persists; the finite batch is applied
    assert out["changed_after_good"] and out["good_grad_norm"] > 0
