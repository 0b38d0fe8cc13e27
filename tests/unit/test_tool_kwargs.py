"""Per-sample tool arguments (verl's ``tools_kwargs``): read from a row, checked, kept in the
prompt store whatever ``dataset_additional_keys`` says, and split over the generating ranks
as the prompts are (the agent loop's use of them: tests/unit/test_agent_loop.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mindrl.data.config import PreprocessConfig
from mindrl.data.handlers import BadRow, R1AlpacaStyleInstructionHandler
from mindrl.data.tool_kwargs import check_tools_kwargs, create_kwargs, record_tools_kwargs
from mindrl.trainer.rollout_step import tools_kwargs_per_rank

GRADE = {"grade": {"create_kwargs": {"ground_truth": "42"}}}


def _handler() -> R1AlpacaStyleInstructionHandler:
    config = PreprocessConfig.from_dict(
        {
            "input": "x.jsonl",
            "tokenizer_name_or_path": "tok",
            "output_prefix": "out",
            "map_keys": {"prompt": "question", "response": "answer"},
            "label_format": "raw",
        }
    )
    return R1AlpacaStyleInstructionHandler(config)


def test_a_rows_tools_kwargs_are_kept_from_the_top_level_or_verls_extra_info() -> None:
    handler = _handler()
    top = handler.convert({"question": "q", "answer": "42", "tools_kwargs": GRADE})
    verl = handler.convert({"question": "q", "answer": "42", "extra_info": {"tools_kwargs": GRADE}})
    plain = handler.convert({"question": "q", "answer": "42"})
    assert top.extra == verl.extra == {"tools_kwargs": GRADE}
    assert plain.extra == {}


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("grade", "not a mapping of tool names"),
        ({"grade": [1]}, "tools_kwargs.grade is list"),
        ({"grade": {"create_kwargs": "x"}}, "create_kwargs is str"),
        ({"grade": {"execute_kwargs": {"a": 1}}}, "execute_kwargs not read"),
    ],
)
def test_a_bad_tools_kwargs_is_a_bad_row_that_names_the_problem(value: Any, names: str) -> None:
    with pytest.raises(BadRow, match=names) as err:
        _handler().convert({"question": "q", "answer": "1", "tools_kwargs": value})
    assert err.value.reason == "bad_tools_kwargs"


def test_parquet_nulls_are_no_arguments() -> None:
    # a parquet struct column gives every row every tool's fields, unset ones null
    value = {"grade": {"create_kwargs": {"ground_truth": "1"}, "execute_kwargs": None}, "x": None}
    assert check_tools_kwargs(value) == {"grade": {"create_kwargs": {"ground_truth": "1"}}}
    assert create_kwargs(value, "grade") == {"ground_truth": "1"}
    assert create_kwargs(value, "x") == {} and create_kwargs(None, "grade") == {}


def test_the_store_keeps_them_and_the_record_gives_them_back(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from mindrl.data.dataset import PromptDataset
    from mindrl.data.preprocess import run_preprocess

    rows = [
        {"question": f"What is {k}+1?", "answer": str(k + 1)}
        | (
            {"extra_info": {"tools_kwargs": {"grade": {"create_kwargs": {"truth": k + 1}}}}}
            if k
            else {}
        )
        for k in range(3)
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = PreprocessConfig(
        output_prefix=str(tmp_path / "store"),
        tokenizer_name_or_path=str(tiny_model_dir),
        input=str(source),
        handler_name="R1AlpacaStyleInstructionHandler",
        prompt_type="chat",
        map_keys={"prompt": "question", "response": "answer"},
        label_format="raw",
        log_interval=10_000,
    )
    run_preprocess(config, log=lambda _msg: None)
    records = list(PromptDataset(tmp_path / "store"))
    got = [create_kwargs(record_tools_kwargs(r.metadata), "grade") for r in records]
    assert got == [{}, {"truth": 2}, {"truth": 3}]


class _Record:
    def __init__(self, tools_kwargs: dict[str, Any] | None) -> None:
        self.metadata = {"index": 0, **({"tools_kwargs": tools_kwargs} if tools_kwargs else {})}


def test_they_are_split_over_the_ranks_as_the_prompts_are() -> None:
    records = [_Record({"grade": {"create_kwargs": {"k": k}}} if k % 2 else None) for k in range(4)]
    # two slices; ranks 0 and 1 share slice 0 (one inference-TP group), rank 2 takes slice 1
    per_rank = tools_kwargs_per_rank(records, [0, 0, 1])
    assert per_rank is not None
    assert [[create_kwargs(kw, "grade") for kw in rank] for rank in per_rank] == [
        [{}, {"k": 1}],
        [{}, {"k": 1}],
        [{}, {"k": 3}],
    ]
    assert tools_kwargs_per_rank([_Record(None)] * 4, [0, 1]) is None  # nothing to send
