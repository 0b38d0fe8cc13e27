"""Run by test_greedy_parity.py through the `fresh_process` fixture: greedy continuations of
the same chat prompts from the megatron-core model (full forward per token), the HF rollout
engine and the vLLM engine.

Arguments: {"model_dir": HF_DIR, "max_new_tokens": int}. Result: {"megatron" | "hf" | "vllm":
one token list per prompt}."""

from typing import Any

import torch

from tests.fresh_process import json_main


def megatron_greedy(
    model_dir: str, prompts: list[list[int]], new: int, eos: int
) -> list[list[int]]:
    from mindrl.checkpoint.online import load_hf_into_mcore
    from mindrl.models.forward_pass import forward_only
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.models.parallel import init_parallel

    init_parallel(1, 1, accelerator="cpu")
    arch = arch_from_hf_config(model_dir)
    model = build_gpt_model(arch)
    load_hf_into_mcore([model], model_dir, arch=arch)
    model.eval()
    out = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(new):
            logits = forward_only(
                [model], torch.tensor([ids]), vocab_size=arch.vocab_size, output="logits"
            )
            token = int(logits[0, -1].argmax())
            ids.append(token)
            if token == eos:
                break
        out.append(ids[len(prompt) :])
    return out


def main(args: dict[str, Any]) -> dict[str, Any]:
    model_dir, new = args["model_dir"], int(args["max_new_tokens"])
    from transformers import AutoTokenizer

    from mindrl.rollout import RolloutSampling
    from mindrl.rollout.hf_engine import HFRolloutEngine
    from mindrl.rollout.vllm_engine import VLLMRolloutEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    questions = ["What is 7 + 5?", "Name a color.", "Write one word about the sea."]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        for q in questions
    ]
    greedy = RolloutSampling(n=1, temperature=0.0, max_tokens=new)
    result = {"megatron": megatron_greedy(model_dir, prompts, new, tok.eos_token_id)}
    with HFRolloutEngine(model_dir) as hf:
        result["hf"] = [list(r.token_ids) for r in hf.generate(prompts, greedy)]
    with VLLMRolloutEngine.from_config(model_dir, _generate_cfg(), seed=0) as vllm:
        result["vllm"] = [list(r.token_ids) for r in vllm.generate(prompts, greedy)]
    return result


def _generate_cfg():
    from mindrl.config.generate import GenerateConfig

    return GenerateConfig(dtype="float32", max_model_len=512, max_num_seqs=8)


if __name__ == "__main__":
    json_main(main)
