"""Prompt templates render exactly as the contract (MindSpeed-RL's qwen_r1 text) says."""

from __future__ import annotations

import json

import pytest

from mindrl.data.templates import get_template, load_templates, render_prompt

# MindSpeed-RL's qwen_r1 instruction (note the ". " after </answer>), written out here
# independently of templates.json.
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think><answer> answer here </answer>. Put your final answer within "
    "\\boxed{}."
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return AutoTokenizer.from_pretrained(str(build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))))


def test_shipped_templates_exist():
    names = set(load_templates())
    assert {"qwen_r1", "chat", "empty"} <= names


def test_qwen_r1_matches_the_seed_text():
    question = "What is 1 + {x}? Use \\frac{1}{2}."
    text = render_prompt(get_template("qwen_r1"), question)
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n" + R1_INSTRUCTION + "\n" + question + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    # braces in the question and the literal \boxed{} survive (no str.format anywhere)
    assert "\\boxed{}" in text and "{x}" in text


def test_qwen_r1_system_override_and_drop():
    template = get_template("qwen_r1")
    custom = render_prompt(template, "Q", system="Be brief.")
    assert custom.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    dropped = render_prompt(template, "Q", system="")
    assert dropped.startswith("<|im_start|>user\n" + R1_INSTRUCTION)


def test_empty_template_is_the_raw_question():
    assert render_prompt(get_template("empty"), "  2 + 2 = ?\n") == "  2 + 2 = ?\n"


def test_chat_template_uses_the_tokenizer(tokenizer):
    text = render_prompt(get_template("chat"), "What is 2+3?", tokenizer=tokenizer)
    # the tiny tokenizer's chat template is ChatML without a default system prompt
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    with_system = render_prompt(get_template("chat"), "Hi", system="S", tokenizer=tokenizer)
    assert with_system == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_needs_a_tokenizer():
    with pytest.raises(ValueError, match="chat template"):
        render_prompt(get_template("chat"), "Q")


def test_unknown_template_names_the_nearest():
    with pytest.raises(KeyError, match="did you mean 'qwen_r1'"):
        get_template("qwen_r2")


def test_custom_templates_file_in_mindspeed_shape(tmp_path, tokenizer):
    path = tmp_path / "templates.json"
    entries = [
        {
            "name": "mine",
            "format_prefix": {"slots": [["eos_token"]]},
            "format_system": {"slots": ["[S]{{content}}[/S]"]},
            "format_user": {"slots": ["[U]{{content}}[/U]"]},
            "format_separator": {"slots": ["\n"]},  # MindSpeed field, ignored for prompts
            "default_system": "sys",
        }
    ]
    path.write_text(json.dumps(entries))
    text = render_prompt(get_template("mine", path), "q", tokenizer=tokenizer)
    assert text == tokenizer.eos_token + "[S]sys[/S][U]q[/U]"


def test_template_typo_field_is_an_error(tmp_path):
    path = tmp_path / "templates.json"
    path.write_text(json.dumps([{"name": "bad", "format_usr": {"slots": ["{{content}}"]}}]))
    with pytest.raises(ValueError, match="did you mean 'format_user'"):
        load_templates(path)
