"""The calculator task's assets (mindrl/assets/tool_warmup.py): the demonstrations render with
the tiny chat template exactly as the agent loop builds a trajectory, only the assistant turns
are labelled, the verifier reads the last turn, and a briefly trained warm-up checkpoint loads
and generates. The real warm-up's length is the e2e test's business."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mindrl.assets import tool_warmup
from mindrl.assets.tokenizer import tiny_token_ids
from mindrl.config.paths import CONFIG_DIR
from mindrl.rewards.registry import get_verifier, load_verifier_file
from mindrl.tools.calculator import calculate
from mindrl.tools.parsers import get_parser

PROBLEM = tool_warmup.Product(512, 734)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_every_product_has_six_digits_and_the_call_is_read_by_hermes():
    assert all(len(p.answer) == 6 for p in tool_warmup.products(200, 3))
    parsed = get_parser("hermes").parse(PROBLEM.tool_call)
    assert [(c.name, dict(c.arguments)) for c in parsed.calls] == [
        ("calculator", {"expression": "512*734"})
    ]
    assert calculate(parsed.calls[0].arguments["expression"]) == PROBLEM.answer


def test_demonstration_renders_as_the_chat_template_and_labels_only_assistant_turns(tokenizer):
    messages = tool_warmup.demonstration(PROBLEM, True, random.Random(0))
    ids, labels = tool_warmup.render_demonstration(tokenizer, messages)
    template = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ids) == template.removesuffix("\n")  # ends at the stop token
    labelled = [i for i, lab in zip(ids, labels) if lab != -100]
    assert all(lab in (-100, i) for i, lab in zip(ids, labels))
    end = tiny_token_ids()["im_end"]
    call = tokenizer.encode(PROBLEM.tool_call, add_special_tokens=False)
    answer = tokenizer.encode(PROBLEM.answer, add_special_tokens=False)
    assert labelled == [*call, end, *answer, end]  # not the prompt, tool turn or headers
    # the second phase leaves the decision (the response's first token) untrained
    _, rest = tool_warmup.render_demonstration(tokenizer, messages, train_decision=False)
    assert [lab for lab in rest if lab != -100] == [*call[1:], end, *answer, end]


def test_demonstration_mix_and_guesses():
    demos = tool_warmup.demonstrations(tool_warmup.WARMUP_TOOL_SHARE)
    tool_demos = [d for d in demos if len(d) == 4]
    assert len(tool_demos) == round(len(demos) * tool_warmup.WARMUP_TOOL_SHARE)
    guess = next(d for d in demos if len(d) == 2)
    assert guess[1]["role"] == "assistant" and len(guess[1]["content"]) == 6
    assert tool_warmup.demonstrations(0.5) == tool_warmup.demonstrations(0.5)  # seeded


def test_verifier_scores_the_last_turn_only():
    load_verifier_file(CONFIG_DIR / "verifiers" / "final_answer.py")
    score = get_verifier("final_answer_exact")
    # what the scorer sees: special tokens skipped, the tool turn's markers gone
    tool_turn = f"{PROBLEM.tool_call}\ntool\n{PROBLEM.answer}\nassistant\n"
    assert score(tool_turn + PROBLEM.answer, PROBLEM.answer) == 1.0
    assert score(tool_turn + "123456", PROBLEM.answer) == 0.0
    assert score(tool_turn, PROBLEM.answer) == 0.0  # the tool's answer alone scores nothing
    assert score(PROBLEM.answer, PROBLEM.answer) == 1.0  # a right answer without the tool


def test_briefly_trained_warmup_loads_and_generates(tmp_path: Path, tiny_model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "warmup"
    out.mkdir()
    tool_warmup.train_tool_warmup(out, tool_steps=2, mixed_steps=2)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    changed = [
        name
        for (name, p), (_, q) in zip(model.named_parameters(), base.named_parameters())
        if not torch.equal(p, q)
    ]
    assert changed  # trained, from the tiny model's weights
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROBLEM.question}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    new = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert new.shape[1] > ids.shape[1]


def test_shipped_config_reads_the_calculator_yaml_with_the_tool_schema_the_demos_use():
    from mindrl.config import load_run_config
    from mindrl.config.multi_turn import multi_turn_problems, tool_config_file
    from mindrl.tools.registry import read_tool_config

    assets = [  # the random tiny model stands in for the warm-up (no asset build here)
        f"{key}=${{asset:tiny}}"
        for key in ("actor_config.load", "megatron_training.tokenizer_name_or_path")
    ]
    run, _ = load_run_config(
        "grpo_tool_tiny_cpu",
        [*assets, "megatron_training.data_path=unused"],
        check_paths=False,
    )
    mode = run.rl.rollout_mode
    assert mode.multi_turn_enable and multi_turn_problems(run, check_paths=False) == []
    (entry,) = read_tool_config(tool_config_file(mode.tool_config_path))
    assert entry.class_name == "mindrl.tools.calculator.Calculator"
    assert entry.schema.name == "calculator" and entry.schema.required == ("expression",)
