"""Handlers: rows -> (question, label), or a BadRow with a reason."""

from __future__ import annotations

import pytest

from mindrl.data.config import PreprocessConfig
from mindrl.data.handlers import (
    _MISSING,
    BadRow,
    GSM8KHandler,
    R1AlpacaStyleInstructionHandler,
    get_path,
)

SUFFIX = 'Let\'s think step by step and output the final answer after "####".'


def _config(**kw) -> PreprocessConfig:
    base = {"input": "x.jsonl", "tokenizer_name_or_path": "tok", "output_prefix": "out"}
    return PreprocessConfig.from_dict({**base, **kw})


def test_get_path():
    record = {"a": {"b": [10, {"c": 3}]}, "x.y": 1}
    assert get_path(record, "a.b.1.c") == 3
    assert get_path(record, "x.y") == 1
    assert get_path([{"value": "q"}], "0.value") == "q"
    assert get_path(record, "a.z") is _MISSING
    assert get_path(record, "a.b.5") is _MISSING


def test_r1_alpaca_with_map_keys():
    handler = R1AlpacaStyleInstructionHandler(
        _config(
            map_keys={"prompt": "problem", "response": "answer"},
            dataset_additional_keys=["labels", "level"],
        )
    )
    ex = handler.convert({"problem": "1+1?", "answer": "2", "level": 3})
    assert (ex.question, ex.label, ex.system, ex.extra) == ("1+1?", "2", None, {"level": 3})


def test_r1_alpaca_defaults_query_system_and_boxed_label():
    handler = R1AlpacaStyleInstructionHandler(_config(map_keys={"system": "sys"}))
    ex = handler.convert(
        {"instruction": "Solve", "input": "x+1=3", "output": "so \\boxed{2}", "sys": "Be exact."}
    )
    assert ex.question == "Solve\nx+1=3"
    assert ex.label == "2"
    assert ex.system == "Be exact."


def test_orz_original_rows_via_index_paths():
    handler = R1AlpacaStyleInstructionHandler(
        _config(map_keys={"prompt": "0.value", "response": "1.ground_truth.value"})
    )
    row = [
        {"from": "human", "value": "What is 3*3?"},
        {"from": "assistant", "ground_truth": {"value": "9"}},
    ]
    ex = handler.convert(row)
    assert (ex.question, ex.label) == ("What is 3*3?", "9")


def test_math17k_chat_prompt_and_reward_model():
    handler = R1AlpacaStyleInstructionHandler(
        _config(map_keys={"prompt": "prompt", "response": "reward_model"})
    )
    row = {
        "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}],
        "reward_model": {"ground_truth": "34", "style": "rule"},
    }
    ex = handler.convert(row)
    assert (ex.question, ex.system, ex.label) == ("Q?", "S", "34")


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"answer": "2"}, "missing_key"),
        ({"problem": "q"}, "missing_key"),
        ({"problem": 5, "answer": "2"}, "wrong_type"),
        ({"problem": "q", "answer": {"x": 1}}, "missing_key"),
        ({"problem": "q", "answer": [1, 2]}, "wrong_type"),
        ({"problem": "   ", "answer": "2"}, "empty_prompt"),
        ({"problem": "q", "answer": ""}, "no_answer"),
        ({"problem": "q", "answer": "see #### none"}, "no_answer"),
        ("just a string", "not_a_record"),
    ],
)
def test_r1_bad_rows(row, reason):
    handler = R1AlpacaStyleInstructionHandler(
        _config(map_keys={"prompt": "problem", "response": "answer"})
    )
    with pytest.raises(BadRow) as info:
        handler.convert(row)
    assert info.value.reason == reason


def test_gsm8k_raw_and_verl_rows_agree():
    handler = GSM8KHandler(_config(handler_name="GSM8KHandler", question_suffix=SUFFIX))
    question = "Natalia sold clips to 48 of her friends in April. How many?"
    raw = handler.convert({"question": question, "answer": "48 + 24 = 72\n#### 1,072"})
    verl = handler.convert(
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question + " " + SUFFIX}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "1072"},
            "extra_info": {"split": "train", "index": 0},
        }
    )
    assert raw.question == verl.question == question + " " + SUFFIX
    assert raw.label == verl.label == "1072"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"question": "q", "answer": "72"}, "no_answer"),
        ({"question": "q"}, "missing_key"),
        ({"question": "", "answer": "#### 1"}, "empty_prompt"),
        ({"question": ["q"], "answer": "#### 1"}, "wrong_type"),
        (
            {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "x"}},
            "no_answer",
        ),
        (
            {
                "prompt": [{"role": "assistant", "content": "q"}],
                "reward_model": {"ground_truth": "1"},
            },
            "empty_prompt",
        ),
        ([1, 2], "not_a_record"),
    ],
)
def test_gsm8k_bad_rows(row, reason):
    handler = GSM8KHandler(_config(handler_name="GSM8KHandler"))
    with pytest.raises(BadRow) as info:
        handler.convert(row)
    assert info.value.reason == reason


def test_missing_additional_key_is_a_bad_row():
    handler = GSM8KHandler(_config(handler_name="GSM8KHandler", dataset_additional_keys=["source"]))
    with pytest.raises(BadRow, match="'source' not in record"):
        handler.convert({"question": "q", "answer": "#### 1"})
