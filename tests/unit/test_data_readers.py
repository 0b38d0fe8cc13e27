"""Readers: row numbers, JSON variants, folders; parquet/arrow when pyarrow is installed."""

from __future__ import annotations

import json

import pytest

from mindrl.data.readers import InvalidRow, describe_input, read_records


def test_jsonl_rows_are_line_numbers_and_broken_lines_are_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n{"a": 3}\n')
    rows = list(read_records(path))
    assert [r for r, _ in rows] == [0, 2, 3]  # line 1 is blank: skipped, not renumbered
    assert rows[0][1] == {"a": 1}
    assert isinstance(rows[1][1], InvalidRow) and rows[1][1].reason == "invalid_json"
    assert rows[2][1] == {"a": 3}


def test_json_list_wrapper_and_json_lines(tmp_path):
    records = [{"q": "a"}, {"q": "b"}]
    (tmp_path / "list.json").write_text(json.dumps(records))
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": 1, "data": records}))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in records))
    for name in ("list.json", "wrapped.json", "lines.json"):
        assert list(read_records(tmp_path / name)) == [(0, records[0]), (1, records[1])]


def test_folder_of_files_numbers_rows_continuously(tmp_path):
    (tmp_path / "part-0.jsonl").write_text('{"i": 0}\n{"i": 1}\n')
    (tmp_path / "part-1.jsonl").write_text('{"i": 2}\n')
    (tmp_path / "README.md").write_text("not data")
    assert describe_input(tmp_path) == "folder"
    assert [(r, rec["i"]) for r, rec in read_records(tmp_path)] == [(0, 0), (1, 1), (2, 2)]


def test_missing_and_unsupported_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_records(tmp_path / "nope.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported input format"):
        list(read_records(tmp_path / "d.csv"))


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed: parquet unsupported")
    import pyarrow.parquet as pq

    records = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(2500)]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet", row_group_size=1000)
    rows = list(read_records(tmp_path / "d.parquet"))
    assert [r for r, _ in rows] == list(range(2500))
    assert rows[1234][1] == records[1234]


def test_hf_arrow_folder_without_datasets(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed: arrow unsupported")
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # force the fallback reader
    records = [{"question": "q0", "answer": "#### 0"}, {"question": "q1", "answer": "#### 1"}]
    split = tmp_path / "ds" / "train"
    split.mkdir(parents=True)
    table = pa.Table.from_pylist(records)
    with pa.OSFile(str(split / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (split / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (split / "dataset_info.json").write_text("{}")
    (tmp_path / "ds" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert describe_input(tmp_path / "ds") == "hf_dataset"
    assert list(read_records(tmp_path / "ds", split="train")) == list(enumerate(records))
    with pytest.raises(ValueError, match="no split 'test'"):
        list(read_records(tmp_path / "ds", split="test"))
