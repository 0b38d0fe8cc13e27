"""On-policy distillation's teacher role in the real loop: two `grpo_step`s of opd_tiny_cpu
with a real student (ActorWorker, megatron-core over gloo) and a real teacher (TeacherWorker,
the tiny Qwen3 from its own HF checkpoint: another family sharing the tokenizer). The teacher
scores exactly the tokens the student sampled (its log-probs equal transformers' Qwen3 on
them), and each response token's advantage is -(log p_student - log p_teacher)."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_opd_step.py")
TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def teacher_dir() -> str:
    from mindrl.assets.models import tiny_qwen3_dir

    return str(tiny_qwen3_dir())


def test_two_distillation_steps_advantage_is_minus_reverse_kl(fresh_process, teacher_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    args = {"teacher_dir": teacher_dir, "tensors_file": str(tmp_path / "opd.pt")}
    out = fresh_process(SCRIPT, args, timeout_s=TIMEOUT_S)
    steps = torch.load(out["tensors_file"])
    assert len(steps) == 2 and len(out["metrics"]) == 2
    hf = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    for step, metrics in zip(steps, out["metrics"]):
        mask = step["mask"].bool()
        assert mask.sum() > 0
        reverse_kl = step["student"] - step["teacher"]
        assert torch.allclose(step["advantages"][mask], -reverse_kl[mask], atol=1e-6)
        assert torch.count_nonzero(step["advantages"][~mask]) == 0
        assert reverse_kl[mask].abs().max() > 1e-3  # two different models, a real signal
        expected = float(reverse_kl[mask].mean())
        assert metrics["opd/reverse_kl"] == pytest.approx(expected, abs=1e-5)
        assert metrics["opd/teacher_log_prob"] == pytest.approx(
            float(step["teacher"][mask].mean()), abs=1e-5
        )
        assert metrics["grad_norm"] > 0  # the student took its update
        # the teacher's log-probs are its own model's, of the student's sampled tokens
        with torch.no_grad():
            ids, am = step["input_ids"], step["attention_mask"]
            pos = (am.long().cumsum(-1) - 1).clamp(min=0)
            logits = hf(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, :-1]
            hf_lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        assert torch.allclose(step["teacher"][mask], hf_lp[mask], atol=1e-4)
