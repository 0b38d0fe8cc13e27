"""HF safetensors reading/writing and atomic folders."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindrl.checkpoint.atomic import atomic_directory, atomic_write_text
from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.hf_io import HFCheckpointReader, HFShardWriter, parse_size


def test_parse_size_follows_hf_units():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size(123) == 123


def test_writer_splits_shards_and_writes_index(tmp_path):
    tensors = {f"t{i}": torch.full((10, 10), float(i)) for i in range(5)}  # 400 bytes each
    plan = [(name, (10, 10)) for name in tensors]
    writer = HFShardWriter(tmp_path, plan, torch.float32, max_shard_bytes=900)  # 2 per shard
    for name, t in tensors.items():
        writer.add(name, t)
    files = writer.finish()
    shards = [f for f in files if f.endswith(".safetensors")]
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 400
    assert index["weight_map"]["t0"] == shards[0] and index["weight_map"]["t4"] == shards[2]
    loaded = {}
    for shard in shards:
        loaded.update(load_file(tmp_path / shard))
    assert sorted(loaded) == sorted(tensors)
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


def test_writer_writes_views_casts_and_matches_safetensors_bytes(tmp_path):
    fused = torch.arange(12.0).reshape(6, 2)
    gate, up = fused.chunk(2)  # views into one storage
    strided = torch.arange(6.0).reshape(2, 3).t()  # not contiguous
    plan = [("gate", (3, 2)), ("up", (3, 2)), ("t", (3, 2))]
    writer = HFShardWriter(tmp_path, plan, torch.bfloat16)
    writer.add("gate", gate)
    writer.add("up", up)
    writer.add("t", strided)
    assert writer.finish() == ["model.safetensors"]
    out = load_file(tmp_path / "model.safetensors")
    assert torch.equal(out["gate"], fused[:3].bfloat16()) and torch.equal(
        out["up"], fused[3:].bfloat16()
    )
    assert torch.equal(out["t"], strided.bfloat16())
    # same tensor bytes as safetensors' own writer
    expected = tmp_path / "ref.safetensors"
    save_file({k: v.contiguous() for k, v in out.items()}, expected)
    assert load_file(expected).keys() == out.keys()


def test_writer_refuses_out_of_plan_tensors(tmp_path):
    writer = HFShardWriter(tmp_path, [("a", (2,)), ("b", (2,))], torch.float32)
    with pytest.raises(ConversionError, match="output tensor b .* where a"):
        writer.add("b", torch.zeros(2))
    writer.add("a", torch.zeros(2))
    with pytest.raises(ConversionError, match="before tensor b"):
        writer.finish()


def test_reader_slices_rows_and_columns(tmp_path):
    t = torch.arange(24.0).reshape(4, 6)
    save_file({"w": t}, tmp_path / "model.safetensors")
    reader = HFCheckpointReader(tmp_path)
    assert reader.shape("w") == (4, 6)
    assert torch.equal(reader.read("w", 0, 1, 3), t[1:3])
    assert torch.equal(reader.read("w", 1, 2, 5), t[:, 2:5])
    with pytest.raises(ConversionError, match="tensor nope is missing"):
        reader.read("nope")


def test_reader_names_truncated_file(tmp_path):
    save_file({"w": torch.ones(100, 100)}, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError, match="model.safetensors"):
        HFCheckpointReader(tmp_path)


def test_reader_names_missing_shard_of_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(ConversionError, match="model-00001-of-00002.*a.weight"):
        HFCheckpointReader(tmp_path)


def test_atomic_directory_appears_only_when_complete(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as temp:
            (temp / "half.bin").write_bytes(b"x")
            raise RuntimeError("crash mid-write")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # the temp folder is gone too
    with atomic_directory(target) as temp:
        (temp / "done.txt").write_text("ok")
    assert (target / "done.txt").read_text() == "ok"
    with pytest.raises(ConversionError, match="already exists"):
        with atomic_directory(target):
            pass


def test_atomic_write_text_replaces(tmp_path):
    path = tmp_path / "latest_checkpointed_iteration.txt"
    atomic_write_text(path, "5\n")
    atomic_write_text(path, "10\n")
    assert path.read_text() == "10\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
