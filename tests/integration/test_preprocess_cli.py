"""cli/preprocess_data.py end to end: every input format, bad rows, overlong prompts,
reasoning-gym generation, and the store the trainer reads back."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindrl.data.dataset import PromptDataset
from mindrl.data.store import PROMPTS_FILE, file_sha256

REPO = Path(__file__).resolve().parents[2]
SUFFIX = 'Let\'s think step by step and output the final answer after "####".'
GSM8K = "gsm8k_qwen25_0.5b"

# GSM8K-style rows; answers end in "#### N" as in the real data set.
QUESTIONS = [
    ("Natalia sold clips to 48 friends and half as many in May. How many in all?", "72"),
    ("Weng earns $12 an hour. She did 50 minutes of babysitting. How much did she earn?", "10"),
    ("Betty needs $100 and has half. Her parents give $15, grandparents twice that. Left?", "5"),
    ("James writes a 3-page letter to 2 friends twice a week. Pages a year?", "624"),
    ("Mark has a garden with 10 yellow flowers and 80% more purple ones. Total?", "1,234"),
]


def _gsm8k_rows() -> list[dict]:
    return [{"question": q, "answer": f"Reasoning here.\n#### {a}"} for q, a in QUESTIONS]


def _verl_rows() -> list[dict]:
    """The records verl's gsm8k preprocessing writes (see the verl tutorial)."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q + " " + SUFFIX}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a.replace(",", "")},
            "extra_info": {"split": "train", "index": i, "answer": "x", "question": q},
        }
        for i, (q, a) in enumerate(QUESTIONS)
    ]


def _expected_text(question: str) -> str:
    # the tiny tokenizer's chat template is ChatML without a default system prompt
    return f"<|im_start|>user\n{question} {SUFFIX}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="module")
def cli():
    """cli/preprocess_data.py as a module (`cli` is a namespace package at the repo root)."""
    from cli import preprocess_data

    return preprocess_data


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_json(path: Path, rows: list) -> Path:
    path.write_text(json.dumps(rows))
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed: parquet unsupported")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _write_hf_folder(path: Path, rows: list[dict]) -> Path:
    """``datasets``' save_to_disk when installed; else the same layout written with pyarrow."""
    try:
        import datasets
    except ImportError:
        datasets = None
    if datasets is not None:
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
        return path
    pa = pytest.importorskip("pyarrow", reason="neither datasets nor pyarrow is installed")
    split = path / "train"
    split.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(split / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (split / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"})
    )
    (path / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    return path


def _run(cli, tok: Path, config: str, input_path: Path | None, out: Path, *overrides: str) -> int:
    args = [
        "--config-name",
        config,
        "--output-prefix",
        str(out),
        "--tokenizer-name-or-path",
        str(tok),
    ]
    if input_path is not None:
        args += ["--input", str(input_path)]
    return cli.main(args + list(overrides))


def test_subprocess_cli_builds_the_store(tmp_path, tokenizer_dir, tokenizer):
    data = _write_jsonl(tmp_path / "train.jsonl", _gsm8k_rows())
    out = tmp_path / "store"
    cmd = [
        sys.executable, "cli/preprocess_data.py", "--config-name", GSM8K,
        "--input", str(data), "--output-prefix", str(out),
        "--tokenizer-name-or-path", str(tokenizer_dir), "log_interval=2",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout + proc.stderr
    assert "rows read: 5" in log and "rows kept: 5" in log
    assert log.count("processed ") == len(QUESTIONS) // 2  # a progress line every 2 rows
    ds = PromptDataset(out)
    assert [r.label for r in ds] == ["72", "10", "5", "624", "1234"]
    for record, (question, _) in zip(ds, QUESTIONS):
        text = _expected_text(question)
        assert record.prompt_text == text
        assert list(record.prompt_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert [r.metadata["row"] for r in ds] == [0, 1, 2, 3, 4]
    meta = ds.meta
    assert meta["prompt_type"] == "chat" and meta["seq_length"] == 512
    assert meta["report"]["rows_kept"] == 5


@pytest.mark.parametrize("fmt", ["json", "parquet", "hf_dataset", "verl_parquet", "verl_jsonl"])
def test_every_input_format_gives_the_same_store(cli, tmp_path, tokenizer_dir, fmt):
    reference = tmp_path / "ref"
    data = _write_jsonl(tmp_path / "train.jsonl", _gsm8k_rows())
    assert _run(cli, tokenizer_dir, GSM8K, data, reference) == 0
    writers = {
        "json": lambda p: _write_json(p / "train.json", _gsm8k_rows()),
        "parquet": lambda p: _write_parquet(p / "train.parquet", _gsm8k_rows()),
        "hf_dataset": lambda p: _write_hf_folder(p / "hf", _gsm8k_rows()),
        "verl_parquet": lambda p: _write_parquet(p / "verl.parquet", _verl_rows()),
        "verl_jsonl": lambda p: _write_jsonl(p / "verl.jsonl", _verl_rows()),
    }
    source = writers[fmt](tmp_path)
    out = tmp_path / fmt
    assert _run(cli, tokenizer_dir, GSM8K, source, out) == 0
    assert len(PromptDataset(out)) == len(QUESTIONS)
    # same prompts, labels, row numbers, in the same order: byte-identical prompts.jsonl
    assert file_sha256(out / PROMPTS_FILE) == file_sha256(reference / PROMPTS_FILE)


def _mixed_rows() -> tuple[list, dict[int, str]]:
    """Good rows with malformed ones in between; returns (lines, {row: expected reason})."""
    good = _gsm8k_rows()
    lines = [
        json.dumps(good[0]),  # row 0
        json.dumps({"answer": "#### 3"}),  # row 1: no question
        json.dumps(good[1]),  # row 2
        '{"question": "broken json',  # row 3
        json.dumps({"question": "How many?", "answer": "about seven"}),  # row 4: no "#### N"
        json.dumps({"question": 12, "answer": "#### 12"}),  # row 5: wrong type
        json.dumps({"question": "   ", "answer": "#### 1"}),  # row 6: empty prompt
        json.dumps(["not", "an", "object"]),  # row 7
        json.dumps(good[2]),  # row 8
    ]
    bad = {1: "missing_key", 3: "invalid_json", 4: "no_answer", 5: "wrong_type",
           6: "empty_prompt", 7: "not_a_record"}  # fmt: skip
    return lines, bad


def test_bad_rows_skipped_with_row_numbers(cli, tmp_path, tokenizer_dir, caplog):
    lines, bad = _mixed_rows()
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "store"
    caplog.set_level(logging.INFO, logger="mindrl.data.preprocess")
    assert _run(cli, tokenizer_dir, GSM8K, data, out, "log_interval=4", "report_first_n=4") == 0
    ds = PromptDataset(out)
    report = ds.meta["report"]
    assert report["rows_read"] == len(lines)
    assert report["rows_kept"] == len(lines) - len(bad) == len(ds)
    expected_counts: dict[str, int] = {}
    for reason in bad.values():
        expected_counts[reason] = expected_counts.get(reason, 0) + 1
    assert report["skipped"] == expected_counts
    # the first report_first_n bad rows are listed, in input order, with their reasons
    listed = [(i["row"], i["reason"]) for i in report["bad_rows"]]
    assert listed == sorted(bad.items())[:4]
    assert [r.metadata["row"] for r in ds] == [0, 2, 8]
    assert [r.label for r in ds] == ["72", "10", "5"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("processed ") for m in messages) == len(lines) // 4
    summary = "\n".join(messages)
    assert "rows skipped (bad): 6" in summary and "row 1 [missing_key]" in summary


def test_bad_rows_error_policy_writes_nothing(cli, tmp_path, tokenizer_dir, capsys):
    lines, bad = _mixed_rows()
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "store"
    assert _run(cli, tokenizer_dir, GSM8K, data, out, "on_bad_row=error") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [data]  # no temp folder either
    err = capsys.readouterr().err
    assert f"{len(bad)} bad rows" in err and "on_bad_row=error" in err
    for row, reason in bad.items():
        assert f"row {row} [{reason}]" in err


def test_overlong_filter_and_error(cli, tmp_path, tokenizer_dir, tokenizer, capsys):
    data = _write_jsonl(tmp_path / "train.jsonl", _gsm8k_rows())
    lengths = [
        len(tokenizer(_expected_text(q), add_special_tokens=False)["input_ids"])
        for q, _ in QUESTIONS
    ]
    limit = sorted(lengths)[2]  # keeps the three shortest (ties kept too: <= limit)
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    drop = [i for i, n in enumerate(lengths) if n > limit]
    assert keep and drop

    out = tmp_path / "filtered"
    assert _run(cli, tokenizer_dir, GSM8K, data, out, f"seq_length={limit}") == 0
    ds = PromptDataset(out)
    assert [r.metadata["row"] for r in ds] == keep
    assert max(len(r.prompt_ids) for r in ds) <= limit
    report = ds.meta["report"]
    assert report["overlong"] == len(drop) and report["skipped"] == {}
    assert [i["row"] for i in report["overlong_rows"]] == drop
    assert [i["detail"] for i in report["overlong_rows"]] == [
        f"{lengths[i]} tokens > {limit}" for i in drop
    ]

    capsys.readouterr()
    out_err = tmp_path / "refused"
    code = _run(
        cli, tokenizer_dir, GSM8K, data, out_err, f"seq_length={limit}", "on_overlong=error"
    )
    assert code == 1 and not out_err.exists()
    assert f"{len(drop)} prompts longer than seq_length={limit}" in capsys.readouterr().err


def test_reasoning_gym_handler(cli, tmp_path, tokenizer_dir):
    out = tmp_path / "rg"
    code = _run(
        cli, tokenizer_dir, "arithmetic_smollm2", None, out,
        "reasoning_gym.size=24", "reasoning_gym.seed=3", "seq_length=200",
    )  # fmt: skip
    assert code == 0
    ds = PromptDataset(out)
    assert len(ds) == 24
    for record in ds:
        expression = record.metadata["metadata"]["expression"]
        value = eval(expression, {"__builtins__": {}})  # integer arithmetic, exact divisions
        assert float(value).is_integer()
        assert record.label == str(int(value))
        assert expression in record.prompt_text
        assert record.prompt_text.endswith(
            "Put your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
        )
    # same seed -> same problems; another seed -> different ones
    again = tmp_path / "rg2"
    _run(cli, tokenizer_dir, "arithmetic_smollm2", None, again, "reasoning_gym.size=24",
         "reasoning_gym.seed=3", "seq_length=200")  # fmt: skip
    assert file_sha256(again / PROMPTS_FILE) == file_sha256(out / PROMPTS_FILE)


def test_workers_give_the_same_store(cli, tmp_path, tokenizer_dir):
    rows = _gsm8k_rows() * 120  # 600 rows: three chunks of 256 across two worker processes
    data = _write_jsonl(tmp_path / "train.jsonl", rows)
    one, two = tmp_path / "one", tmp_path / "two"
    assert _run(cli, tokenizer_dir, GSM8K, data, one, "workers=1") == 0
    assert _run(cli, tokenizer_dir, GSM8K, data, two, "workers=2") == 0
    assert len(PromptDataset(two)) == len(rows)
    assert file_sha256(one / PROMPTS_FILE) == file_sha256(two / PROMPTS_FILE)


def test_config_errors_exit_2(cli, tmp_path, tokenizer_dir, capsys):
    data = _write_jsonl(tmp_path / "train.jsonl", _gsm8k_rows())
    assert _run(cli, tokenizer_dir, GSM8K, data, tmp_path / "o", "seq_lenght=3") == 2
    assert "did you mean 'seq_length'" in capsys.readouterr().err
    missing = tmp_path / "no_such_tokenizer"
    assert _run(cli, missing, GSM8K, data, tmp_path / "o") == 2
    assert "no such folder" in capsys.readouterr().err
    code = _run(cli, tokenizer_dir, "arithmetic_smollm2", None, tmp_path / "o",
                "reasoning_gym.dataset=basic_arithmetc")  # fmt: skip
    assert code == 2
    assert "did you mean 'basic_arithmetic'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_example_script_forwards_overrides(tmp_path):
    script = REPO / "examples" / "data" / "preprocess_data.sh"
    proc = subprocess.run(
        ["bash", str(script), GSM8K, "on_bad_row=maybe"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "on_bad_row must be one of" in proc.stderr
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and GSM8K in usage.stderr
