"""Read raw records from jsonl / json / parquet files, folders of them, or HF dataset folders.

Every reader yields ``(row, record)`` in input order, ``row`` being the 0-based record
number (for jsonl: the 0-based line number, blank lines skipped). A line that is not valid
JSON is yielded as an ``InvalidRow`` instead of raising, so the caller can apply the
bad-row policy with the row number in hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class InvalidRow:
    """A row that could not even be decoded (e.g. a broken jsonl line)."""

    reason: str
    detail: str


def _require_pyarrow(what: str) -> Any:
    try:
        import pyarrow
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"reading {what} needs pyarrow, which is not installed (pip install pyarrow)"
        ) from exc
    return pyarrow


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                yield row, json.loads(line)
            except json.JSONDecodeError as exc:
                yield row, InvalidRow("invalid_json", f"line {row + 1}: {exc.msg}")


def read_json(path: Path) -> Iterator[tuple[int, Any]]:
    """A JSON list of records, a ``{"data": [...]}``-style wrapper, or JSON lines in a .json."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # many ".json" exports are really JSON lines
            yield from read_jsonl(path)
            return
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise ValueError(f"{path}: a JSON object must hold exactly one list of records")
        data = lists[0]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records")
    yield from enumerate(data)


def read_parquet(path: Path, batch_size: int = 1024) -> Iterator[tuple[int, Any]]:
    _require_pyarrow("parquet files")
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        for record in batch.to_pylist():
            yield row, record
            row += 1


def read_arrow(path: Path) -> Iterator[tuple[int, Any]]:
    """An Arrow IPC file as written by HF ``save_to_disk`` (stream format) or file format."""
    _require_pyarrow("arrow files")
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = iter(reader)
    row = 0
    for batch in batches:
        for record in batch.to_pylist():
            yield row, record
            row += 1


_READERS = {"jsonl": read_jsonl, "json": read_json, "parquet": read_parquet, "arrow": read_arrow}


def _is_hf_dataset_dir(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _read_hf_dataset_dir(path: Path, split: str) -> Iterator[tuple[int, Any]]:
    """``datasets.load_from_disk`` when available, else the arrow files the folder lists."""
    try:
        import datasets
    except ImportError:
        datasets = None
    if datasets is not None:
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path}: no split {split!r}; splits: {', '.join(loaded)}")
            loaded = loaded[split]
        yield from enumerate(loaded)
        return
    if (path / "dataset_dict.json").is_file():
        with open(path / "dataset_dict.json", encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise ValueError(f"{path}: no split {split!r}; splits: {', '.join(splits)}")
        path = path / split
    with open(path / "state.json", encoding="utf-8") as f:
        files = [path / entry["filename"] for entry in json.load(f)["_data_files"]]
    yield from _chain_files(files, read_arrow)


def _chain_files(files: list[Path], reader: Any) -> Iterator[tuple[int, Any]]:
    offset = 0
    for file in files:
        count = 0
        for row, record in reader(file):
            yield offset + row, record
            count = row + 1
        offset += count


def _read_plain_dir(path: Path) -> Iterator[tuple[int, Any]]:
    """A folder of data files: the most common supported format, files in name order."""
    by_format: dict[str, list[Path]] = {}
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        fmt = FILE_FORMATS.get(file.suffix.lower())
        if fmt:
            by_format.setdefault(fmt, []).append(file)
    if not by_format:
        raise ValueError(f"{path}: no .jsonl/.json/.parquet/.arrow files in this folder")
    fmt = max(by_format, key=lambda k: len(by_format[k]))
    yield from _chain_files(by_format[fmt], _READERS[fmt])


def describe_input(path: str | Path) -> str:
    """A short word for logs: jsonl / json / parquet / arrow / hf_dataset / folder."""
    path = Path(path)
    if path.is_dir():
        return "hf_dataset" if _is_hf_dataset_dir(path) else "folder"
    return FILE_FORMATS.get(path.suffix.lower(), "unknown")


def read_records(path: str | Path, split: str = "train") -> Iterator[tuple[int, Any]]:
    """Yield ``(row, record)`` from any supported input."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    if path.is_dir():
        if _is_hf_dataset_dir(path):
            yield from _read_hf_dataset_dir(path, split)
        else:
            yield from _read_plain_dir(path)
        return
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unsupported input format; use {', '.join(FILE_FORMATS)}")
    yield from _READERS[fmt](path)
