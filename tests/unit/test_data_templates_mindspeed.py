"""MindSpeed-RL's prompt template names render the same prompt text as MindSpeed-RL.

The expected strings are written out here from the models' chat formats, independently of
configs/model/templates.json, for one question and with / without a system prompt. Bos tokens
come from real tokenizers (the offline tiny tokenizer with the family's specials added).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindrl.data.templates import (
    TemplateError,
    check_tokenizer,
    get_template,
    load_templates,
    render_prompt,
)

MINDSPEED_NAMES = (
    "default", "empty", "trl", "qwen", "qwen_retool", "qwen_search_tool", "qwen_r1",
    "qwen_math_r1", "qwen3", "llama3", "mistral", "mixtral", "gemma", "llama2", "alpaca",
    "deepseek2", "deepseek2-lite", "minicpm3", "baichuan2", "deepseek3", "deepseek3_r1",
)  # fmt: skip

Q = "What is {x} + 1?\nUse \\frac{1}{2}."
S = "Be brief."
R1 = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think><answer> answer here </answer>. Put your final answer within "
    "\\boxed{}."
)
TOOLS_HEAD = (
    "You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CODE_TOOL = (
    '{"type": "function", "function": {"name": "code_interpreter", "description": "A tool for '
    'executing code.", "parameters": {"type": "object", "properties": {"code": {"type": '
    '"string", "description": "The code to execute."}}, "required": ["code"]}}}'
)
SEARCH_TOOL = (
    '{"type": "function", "function": {"name": "search", "description": "Searches the web for '
    'relevant information based on the given query.", "parameters": {"type": "object", '
    '"properties": {"query_list": {"type": "array", "item": {"type": "string"}, "description": '
    '"A list of fully-formed semantic queries. The tool will return search results for each '
    'query."}}, "required": ["query_list"]}}}'
)
BOXED = "The answer format must be: \\boxed{'The final answer goes here.'}\n"


def im(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


ASSISTANT = "<|im_start|>assistant\n"
HELPFUL = im("system", "You are a helpful assistant.")
L3 = "<|begin_of_text|>"
DS = "<｜begin▁of▁sentence｜>"


def l3(role: str, text: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"


L3_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"

# name -> (bos token of the family or None, prompt without system, prompt with system S)
EXPECTED: dict[str, tuple[str | None, str, str]] = {
    "default": (None, f"Human: {Q}\nAssistant:", f"{S}\nHuman: {Q}\nAssistant:"),
    "empty": (None, Q, S + Q),
    "trl": ("<s>", "<s>" + Q, "<s>" + S + Q),
    "qwen": (
        None,
        HELPFUL + im("user", Q) + ASSISTANT,
        im("system", S) + im("user", Q) + ASSISTANT,
    ),
    "qwen_r1": (
        None,
        HELPFUL + im("user", R1 + "\n" + Q) + ASSISTANT,
        im("system", S) + im("user", R1 + "\n" + Q) + ASSISTANT,
    ),
    "qwen_math_r1": (
        None,
        im("system", "Please reason step by step, and put your final answer within \\boxed{}.")
        + im("user", Q)
        + ASSISTANT,
        im("system", S) + im("user", Q) + ASSISTANT,
    ),
    "qwen3": (
        None,
        im("user", Q) + ASSISTANT + "<think>\n\n</think>\n\n",
        im("system", S) + im("user", Q) + ASSISTANT + "<think>\n\n</think>\n\n",
    ),
    "qwen_retool": (
        None,
        im("system", TOOLS_HEAD + CODE_TOOL + TOOLS_TAIL) + im("user", Q) + BOXED + ASSISTANT,
        im("system", S) + im("user", Q) + BOXED + ASSISTANT,
    ),
    "qwen_search_tool": (
        None,
        im("system", TOOLS_HEAD + SEARCH_TOOL + TOOLS_TAIL) + im("user", Q) + BOXED + ASSISTANT,
        im("system", S) + im("user", Q) + BOXED + ASSISTANT,
    ),
    "llama3": (
        L3,
        L3 + l3("user", Q) + L3_ASSISTANT,
        L3 + l3("system", S) + l3("user", Q) + L3_ASSISTANT,
    ),
    "mistral": ("<s>", f"<s>[INST] {Q} [/INST]", f"<s>{S}[INST] {Q} [/INST]"),
    "mixtral": ("<s>", f"<s>[INST] {Q} [/INST]", f"<s>{S}[INST] {Q} [/INST]"),
    "gemma": (
        "<bos>",
        f"<bos><start_of_turn>user\n{Q}<end_of_turn>\n<start_of_turn>model\n",
        f"<bos>{S}<start_of_turn>user\n{Q}<end_of_turn>\n<start_of_turn>model\n",
    ),
    "llama2": ("<s>", f"<s>[INST] {Q} [/INST]", f"<s>[INST] <<SYS>>\n{S}\n<</SYS>>\n\n{Q} [/INST]"),
    "alpaca": (
        None,
        "Below is an instruction that describes a task. Write a response that appropriately "
        f"completes the request.\n\n### Instruction:\n{Q}\n\n### Response:\n",
        f"{S}### Instruction:\n{Q}\n\n### Response:\n",
    ),
    "deepseek2": (DS, f"{DS}User: {Q}\n\nAssistant:", f"{DS}{S}\n\nUser: {Q}\n\nAssistant:"),
    "deepseek2-lite": (DS, f"{DS}User: {Q}\n\nAssistant:", f"{DS}{S}\n\nUser: {Q}\n\nAssistant:"),
    "minicpm3": (DS, f"{DS}User: {Q}\n\nAssistant:", f"{DS}{S}\n\nUser: {Q}\n\nAssistant:"),
    "baichuan2": (None, f"<reserved_106>{Q}<reserved_107>", f"{S}<reserved_106>{Q}<reserved_107>"),
    "deepseek3": (DS, f"{DS}<｜User｜>{Q}<｜Assistant｜>", f"{DS}{S}<｜User｜>{Q}<｜Assistant｜>"),
    "deepseek3_r1": (
        DS,
        f"{DS}{R1} <｜User｜>{Q}<｜Assistant｜>",
        f"{DS}{S}{R1} <｜User｜>{Q}<｜Assistant｜>",
    ),
}

# The family markers a real tokenizer of each model has as special tokens.
FAMILY_SPECIALS = (
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<｜User｜>", "<｜Assistant｜>",
    "<start_of_turn>", "<end_of_turn>", "<reserved_106>", "<reserved_107>",
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def load_tokenizer(path: Path, bos: str | None = None, specials: tuple[str, ...] = ()):
    """The tiny tokenizer, optionally given a family's bos token and special markers."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    added: dict = {}
    if bos:
        added["bos_token"] = bos
    if specials:
        added["additional_special_tokens"] = list(specials)
    if added:
        tokenizer.add_special_tokens(added)
    return tokenizer


def test_every_mindspeed_name_is_shipped():
    assert set(MINDSPEED_NAMES) <= set(load_templates())
    assert set(EXPECTED) == set(MINDSPEED_NAMES)


@pytest.mark.parametrize("name", MINDSPEED_NAMES)
def test_prompt_text_is_mindspeeds(name, tiny_tokenizer_dir):
    bos, without_system, with_system = EXPECTED[name]
    tokenizer = load_tokenizer(tiny_tokenizer_dir, bos, FAMILY_SPECIALS)
    template = get_template(name)
    check_tokenizer(template, tokenizer)  # a matching tokenizer passes
    assert render_prompt(template, Q, None, tokenizer) == without_system
    assert render_prompt(template, Q, S, tokenizer) == with_system


def test_markers_stay_single_tokens(tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir, L3, FAMILY_SPECIALS)
    text = render_prompt(get_template("llama3"), "hi", S, tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    header = tokenizer.convert_tokens_to_ids("<|start_header_id|>")
    assert ids[0] == tokenizer.bos_token_id and ids.count(header) == 3


def test_qwen3_thinking_switch():
    template = get_template("qwen3")
    assert render_prompt(template, Q, enable_thinking=True) == im("user", Q) + ASSISTANT


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(TemplateError) as info:
        get_template("deepseek_r1")
    message = str(info.value)
    assert "did you mean 'deepseek3_r1'" in message
    assert all(name in message for name in MINDSPEED_NAMES) and "\n" not in message
    with pytest.raises(KeyError):  # lookups that expect a KeyError still get one
        get_template("qwen4")


@pytest.mark.parametrize(
    ("name", "bos", "missing"),
    [
        ("llama3", L3, "'<|start_header_id|>'"),
        ("deepseek3", DS, "'<｜User｜>'"),
        ("gemma", "<bos>", "'<start_of_turn>'"),
        ("baichuan2", None, "'<reserved_106>'"),
        ("deepseek3_r1", None, "bos_token"),
        ("llama2", None, "bos_token"),
    ],
)
def test_tokenizer_without_the_templates_tokens(name, bos, missing, tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir, bos)  # Qwen specials only
    with pytest.raises(TemplateError) as info:
        check_tokenizer(get_template(name), tokenizer)
    message = str(info.value)
    assert f"prompt_type {name!r}" in message and missing in message and "\n" not in message


def test_qwen_templates_fit_the_tiny_qwen_tokenizer(tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    for name in ("qwen", "qwen_r1", "qwen3", "qwen_math_r1", "empty", "default", "alpaca"):
        check_tokenizer(get_template(name), tokenizer)


def test_mindspeed_shaped_file_semantics(tmp_path, tiny_tokenizer_dir):
    """MindSpeed-RL's own file shape: llama2* names put the system in the user turn,
    ReasoningTemplate adds the think block, a missing format_system writes the text as is."""
    entries = [
        {
            "name": "llama2_custom",
            "format_user": {"slots": [["bos_token"], "[INST] {{content}} [/INST]"]},
            "format_system": {"slots": ["<<SYS>>\n{{content}}\n<</SYS>>\n\n"]},
            "format_separator": {"slots": ["\n"]},
        },
        {
            "name": "think",
            "format_user": {"slots": ["U:{{content}}\n"]},
            "format_assistant": {"slots": ["{{content}}"]},
            "template_class": "ReasoningTemplate",
            "replace_eos": True,
        },
        {
            "name": "plain_system",
            "format_user": {"slots": ["U:{{content}}"]},
            "default_system": "D|",
        },
    ]
    path = tmp_path / "templates.json"
    path.write_text(json.dumps(entries))
    tokenizer = load_tokenizer(tiny_tokenizer_dir, "<s>")
    assert render_prompt(get_template("llama2_custom", path), "q", "s", tokenizer) == (
        "<s>[INST] <<SYS>>\ns\n<</SYS>>\n\nq [/INST]"
    )
    assert render_prompt(get_template("think", path), "q") == "U:q\n<think>\n\n</think>\n\n"
    assert render_prompt(get_template("plain_system", path), "q") == "D|U:q"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[]", "unknown prompt_type 'qwen'"),
        ("{not json", "is not valid JSON"),
        ('[{"name": "x", "format_user": {"slots": ["{{content}}"]}, "template_class": "T2"}]',
         "unknown template_class 'T2'"),
    ],
)  # fmt: skip
def test_bad_template_files_are_one_line_errors(tmp_path, text, pattern):
    path = tmp_path / "templates.json"
    path.write_text(text)
    with pytest.raises(TemplateError, match=pattern) as info:
        get_template("qwen", path)
    assert "\n" not in str(info.value)


def test_missing_templates_file(tmp_path):
    with pytest.raises(TemplateError, match="no templates file at"):
        get_template("qwen", tmp_path / "nope.json")


# ------------------------------------------------------------------ through the command line
def _write_rows(path: Path) -> Path:
    rows = [{"problem": "What is 2 + 3?", "answer": "5"}, {"problem": "1 + 1?", "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(tmp_path: Path, tokenizer_dir: Path, *overrides: str) -> int:
    from cli.preprocess_data import main

    data = _write_rows(tmp_path / "rows.jsonl")
    config = tmp_path / "ds.yaml"
    config.write_text(
        f"input: {data}\ntokenizer_name_or_path: {tokenizer_dir}\n"
        f"output_prefix: {tmp_path / 'store'}\nhandler_name: R1AlpacaStyleInstructionHandler\n"
        'map_keys: {"prompt": "problem", "query": "", "response": "answer", "system": ""}\n'
    )
    return main(["--config-name", str(config), *overrides])


def test_cli_refuses_a_template_the_tokenizer_cannot_encode(tmp_path, tiny_tokenizer_dir, capsys):
    assert _cli(tmp_path, tiny_tokenizer_dir, "prompt_type=llama3") == 2
    err = capsys.readouterr().err
    assert "prompt_type 'llama3' needs the tokenizer's bos_token" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "store").exists()


def test_cli_unknown_template_name(tmp_path, tiny_tokenizer_dir, capsys):
    assert _cli(tmp_path, tiny_tokenizer_dir, "prompt_type=qwen_r") == 2
    err = capsys.readouterr().err
    assert "unknown prompt_type 'qwen_r'" in err and "qwen_r1" in err and "Traceback" not in err


@pytest.mark.parametrize("thinking", [False, True])
def test_cli_qwen3_store_holds_mindspeeds_prompt(tmp_path, tiny_tokenizer_dir, thinking):
    from mindrl.data.dataset import PromptDataset

    flag = f"enable_thinking={str(thinking).lower()}"
    assert _cli(tmp_path, tiny_tokenizer_dir, "prompt_type=qwen3", flag) == 0
    first = PromptDataset(tmp_path / "store")[0]
    think = "" if thinking else "<think>\n\n</think>\n\n"
    assert first.prompt_text == im("user", "What is 2 + 3?") + ASSISTANT + think
