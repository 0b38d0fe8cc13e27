"""The baseline side of tools/bench/e2e.py: TRL's GRPOTrainer on a mindrl config's workload.

    python tools/bench/trl_grpo.py --steps 5 --out trl.json [--config-name grpo_smollm2_cpu]
                                   [--bf16 | --bf16-mixed] [override ...]

Everything that defines the workload is read from the mindrl config, so both stacks run the
same model folder, prompt store (its templated prompt text, which tokenizes to the same ids),
verifier (mindrl's registered rule reward), group size, prompts per step, max new tokens,
sampling, learning rate and Adam settings, clip ratio, KL coefficient and micro-batch size:
8 prompts x 8 samples = one TRL generation batch of 64, trained in gradient-accumulation
micro-batches of `actor_config.micro_batch_size`, one optimizer step per RL step (TRL then
uses the update's own log-probs as the old ones, as mindrl does). Needs `pip install
-e .[bench]` (trl). Writes per-step wall time, tokens (prompt + completion), reward, a phase
split and the process's peak RSS as JSON.

Precision: fp32 by default; `--bf16` loads the weights in bf16 and trains them directly (bf16
Adam state, no fp32 copy: "pure" bf16); `--bf16-mixed` keeps fp32 weights and Adam state and
runs the forward/backward under bf16 autocast (HF/accelerate mixed precision), the closer
match to megatron's bf16 (bf16 compute, fp32 master weights).

Activation recomputation follows the config too: TRL's GRPOConfig turns gradient
checkpointing on by default (every decoder layer recomputed in the backward), mindrl's actor
recomputes only with `recompute_granularity: full`. The baseline checkpoints exactly when the
mindrl run does, so both run the same arithmetic and, without recompute, TRL runs at its
fastest setting rather than its leanest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


class PhaseClock:
    """Wall seconds per phase of the current step, filled by wrappers around the trainer's
    methods (TRL has no per-phase timers of its own)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.tokens = 0

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def wrap(self, obj: Any, name: str, phase_of: Any) -> None:
        original = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = original(*args, **kwargs)
            phase = phase_of(*args, **kwargs)
            if phase:
                self.add(phase, time.perf_counter() - start)
            return out

        setattr(obj, name, timed)


def recomputes_layers(run: Any) -> bool:
    """Whether the mindrl actor recomputes whole layers in the backward, as HF gradient
    checkpointing does (selective recompute of the attention core has no HF counterpart)."""
    return run.actor.memory.recompute_granularity == "full"


def build_trainer(run: Any, steps: int, precision: str, out_dir: Path, clock: PhaseClock) -> Any:
    """TRL's GRPOTrainer for `run`'s workload; precision is fp32, bf16 (pure) or bf16_mixed."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mindrl.data.dataset import PromptDataset
    from mindrl.rewards.scorer import RewardScorer

    actor, alg = run.actor, run.rl.algorithm
    sampling = run.generate.sampling_config
    model_dir = str(actor.ckpt.load)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = PromptDataset(actor.data.data_path)
    rows = [
        {"prompt": records[i].prompt_text, "label": records[i].label} for i in range(len(records))
    ]
    first = records[0]
    if tokenizer(first.prompt_text)["input_ids"] != list(first.prompt_ids):
        raise SystemExit("the templated prompt text does not tokenize to the store's prompt ids")
    scorer = RewardScorer.from_config(run.rl.reward, run.rl.reward_params)

    def rule_reward(completions: list[str], label: list[str], **_: Any) -> list[float]:
        return list(scorer.score(completions, label).scores)

    rule_reward.__name__ = "_".join(run.rl.reward.verifier_function)
    group = alg.n_samples_per_prompt
    micro = actor.batch.micro_batch_size
    samples = actor.batch.global_batch_size * group
    args = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,
        num_generations=group,
        max_completion_length=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=max(sampling.top_k, 0),
        learning_rate=actor.optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=actor.optim.weight_decay,
        adam_beta1=actor.optim.adam_beta1,
        adam_beta2=actor.optim.adam_beta2,
        adam_epsilon=actor.optim.adam_eps,
        max_grad_norm=actor.optim.clip_grad,
        epsilon=alg.clip_ratio,
        beta=alg.kl.coef if alg.kl.where == "loss" else 0.0,
        num_iterations=alg.epochs,
        loss_type="dapo",  # token mean over the whole batch, as loss_agg_mode token-mean
        scale_rewards="group",  # (r - group mean) / group std, as adv_estimator group_norm
        bf16=precision != "fp32",
        gradient_checkpointing=recomputes_layers(run),
        use_cpu=True,
        seed=actor.data.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self.started = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()
            clock.current, clock.tokens = {}, 0

        def on_step_end(self, *_: Any, **__: Any) -> None:
            wall = time.perf_counter() - self.started
            phases = dict(clock.current)
            scored = phases.pop("generate_and_score", 0.0)
            phases["update"] = wall - scored
            phases["score_other"] = scored - sum(
                phases.get(k, 0.0) for k in ("rollout", "reward", "ref")
            )
            self.steps.append({"step_time": wall, "tokens": clock.tokens, "phases": phases})

    step_clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[rule_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[step_clock],
    )
    clock.wrap(trainer, "_generate_single_turn", lambda *a, **k: "rollout")
    clock.wrap(trainer, "_calculate_rewards", lambda *a, **k: "reward")
    ref = trainer.ref_model
    clock.wrap(
        trainer,
        "_get_per_token_logps_and_entropies",
        lambda model, *a, **k: "ref" if ref is not None and model is ref else None,
    )
    original = trainer._generate_and_score_completions

    def generate_and_score(inputs: Any) -> Any:
        start = time.perf_counter()
        out = original(inputs)
        clock.add("generate_and_score", time.perf_counter() - start)
        clock.tokens += int(out["prompt_mask"].sum()) + int(out["completion_mask"].sum())
        return out

    trainer._generate_and_score_completions = generate_and_score
    return trainer, step_clock, scorer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config-name", default="grpo_smollm2_cpu")
    precision_flags = parser.add_mutually_exclusive_group()
    precision_flags.add_argument("--bf16", action="store_true", help="bf16 weights and Adam state")
    precision_flags.add_argument(
        "--bf16-mixed", action="store_true", help="fp32 weights, bf16 autocast compute"
    )
    parser.add_argument("overrides", nargs="*", help="mindrl config overrides (key=value)")
    args = parser.parse_args(argv)

    import torch

    from mindrl.config import load_run_config

    run, _ = load_run_config(args.config_name, args.overrides)
    torch.set_num_threads(run.runtime.worker_threads or os.cpu_count() or 1)
    clock = PhaseClock()
    out_dir = args.out.parent / (args.out.stem + "_trainer")
    precision = "bf16" if args.bf16 else "bf16_mixed" if args.bf16_mixed else "fp32"
    trainer, step_clock, scorer = build_trainer(run, args.steps, precision, out_dir, clock)
    start = time.perf_counter()
    with scorer:
        trainer.train()
    wall = time.perf_counter() - start
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    for step, reward in zip(step_clock.steps, rewards):
        step["reward"] = reward
    result = {
        "stack": "trl",
        "precision": precision,
        "param_dtype": str(next(trainer.model.parameters()).dtype),
        "autocast": trainer.accelerator.mixed_precision,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
        "train_wall_s": wall,
        "steps": step_clock.steps,
        "process_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"trl: {len(step_clock.steps)} steps, {wall:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
