"""Prompt store: atomic writes, integrity checks, and PromptDataset access."""

from __future__ import annotations

import json

import pytest

from mindrl.data.dataset import PromptDataset, PromptRecord
from mindrl.data.store import META_FILE, PROMPTS_FILE, StoreError, StoreWriter, file_sha256


def _record(i: int) -> dict:
    return {
        "prompt_ids": [i, i + 1],
        "prompt_text": f"p{i}",
        "label": str(i * 2),
        "row": i + 10,
        "extra": {"level": i},
    }


def _write_store(path, n: int = 3):
    with StoreWriter(path) as writer:
        for i in range(n):
            writer.add(_record(i))
        writer.commit({"seq_length": 8, "max_prompt_tokens": 2})
    return path


def test_roundtrip_and_records(tmp_path):
    store = _write_store(tmp_path / "store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no temp leftovers
    meta = json.loads((store / META_FILE).read_text())
    assert meta["num_prompts"] == 3
    assert meta["sha256"] == file_sha256(store / PROMPTS_FILE)
    ds = PromptDataset(store)
    assert len(ds) == 3
    assert ds[1] == PromptRecord(
        prompt_ids=(1, 2), prompt_text="p1", label="2", metadata={"level": 1, "index": 1, "row": 11}
    )
    assert ds[-1].label == "4"
    assert [r.prompt_text for r in ds] == ["p0", "p1", "p2"]
    assert [r.label for r in ds.batch([2, 0])] == ["4", "0"]
    assert ds.seq_length == 8 and ds.max_prompt_tokens == 2
    with pytest.raises(IndexError):
        ds[3]
    with pytest.raises(AttributeError):
        ds[0].label = "x"  # type: ignore[misc]


def test_exception_before_commit_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with StoreWriter(tmp_path / "store") as writer:
            writer.add(_record(0))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_replacing_a_store_keeps_the_old_one_until_commit(tmp_path):
    store = _write_store(tmp_path / "store", n=3)
    with pytest.raises(RuntimeError):
        with StoreWriter(store) as writer:
            writer.add(_record(9))
            assert len(PromptDataset(store)) == 3  # old store still intact mid-write
            raise RuntimeError("boom")
    assert len(PromptDataset(store)) == 3
    _write_store(store, n=5)
    assert len(PromptDataset(store)) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_refuses_to_overwrite_a_folder_that_is_not_a_store(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(StoreError, match="refusing to overwrite"):
        StoreWriter(target)
    assert (target / "notes.txt").read_text() == "keep me"


def test_tampered_or_truncated_store_fails_at_load(tmp_path):
    store = _write_store(tmp_path / "store")
    prompts = store / PROMPTS_FILE
    lines = prompts.read_text().splitlines(keepends=True)
    prompts.write_text("".join(lines[:2]))
    with pytest.raises(StoreError, match="checksum"):
        PromptDataset(store)
    with pytest.raises(StoreError, match="2 prompts, meta says 3"):
        PromptDataset(store, verify=False)


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="not a prompt store"):
        PromptDataset(tmp_path)
