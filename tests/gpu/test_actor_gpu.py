"""The actor on one CUDA device in bf16 (tests/gpu/_gpu_actor.py): megatron's optimizer
updates the policy, the reference and old-policy passes run, the weight sync reaches the HF
engine, the offload frees device memory for rollout and the onload restores the same model,
and the converter's HF export loads in transformers. CPU twins: tests/integration's
test_actor_worker.py, test_offload_choreography.py, test_convert_roundtrip.py."""

from __future__ import annotations

import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "_gpu_actor.py"
TIMEOUT_S = 900.0


def test_actor_bf16_update_sync_offload_and_export(fresh_process, tiny_model_dir, tmp_path):
    out = fresh_process(SCRIPT, {"export_dir": str(tmp_path / "hf")}, timeout_s=TIMEOUT_S)
    assert out["param_dtypes"] == ["torch.bfloat16"], out
    assert all(math.isfinite(v) for v in out["metrics"].values()), out["metrics"]
    assert out["moved_by_update"] > 0, out  # the optimizer stepped
    assert out["old_ref_gap"] < 1e-2, out  # before the update the reference is the policy
    assert out["same_after_onload"] < 1e-2, out  # offload + onload gives the same model back
    assert out["rollout_gib"] < out["train_gib"], out  # the training state left the device
    assert out["generated"] and all(n > 0 for n in out["generated"]), out
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out["exported"])
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert set(model.state_dict()) == set(reference.state_dict())
