"""Read raw records from jsonl / json / parquet files, folders of them, or HF dataset folders.

Every reader yields ``(row, record)`` in input order, ``row`` being the 0-based record
number (for jsonl: the 0-based line number, blank lines skipped). A row that cannot be
decoded (a line that is not JSON, bytes that are not UTF-8, a string with a lone surrogate)
is yielded as an ``InvalidRow`` naming the file, the row and the byte offset instead of
raising, so the caller can apply the bad-row policy with the row number in hand. Problems
with a whole file (unsupported format, not JSON at all) raise ``DataFileError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}

_BOM = b"\xef\xbb\xbf"
_SURROGATE = re.compile("[\ud800-\udfff]")
_RAW_BYTE = re.compile("[\udc80-\udcff]")  # an undecodable byte under errors="surrogateescape"
_WS = re.compile(r"[ \t\n\r]*")


class DataFileError(ValueError):
    """A data file or folder that cannot be used as a whole; the message names it."""


@dataclass(frozen=True)
class InvalidRow:
    """A row that could not even be decoded (a broken jsonl line, bytes that are not UTF-8)."""

    reason: str
    detail: str


def _lone_surrogate(value: Any) -> str | None:
    """The first string (key or value) in a decoded record holding a lone surrogate, which
    no UTF-8 writer can encode (JSON escapes such as ``"\\udc80"`` produce them)."""
    if isinstance(value, str):
        return None if value.isascii() or not _SURROGATE.search(value) else value
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key) or _lone_surrogate(item)
            if found is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            found = _lone_surrogate(item)
            if found is not None:
                return found
    return None


def _surrogate_detail(where: str, text: str) -> str:
    char = _SURROGATE.search(text)
    code = f"\\u{ord(char.group()):04x}" if char else "?"
    return f"{where}: a string holds the lone surrogate {code}, which is not valid Unicode"


def _require_pyarrow(what: str) -> Any:
    try:
        import pyarrow
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"reading {what} needs pyarrow, which is not installed (pip install pyarrow)"
        ) from exc
    return pyarrow


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """One record per line; each line is decoded on its own, so one bad line is one bad row."""
    offset = 0  # byte offset of the current line in the file
    with open(path, "rb") as f:
        for row, raw in enumerate(f):
            start, offset = offset, offset + len(raw)
            if row == 0 and raw.startswith(_BOM):
                raw, start = raw[len(_BOM) :], start + len(_BOM)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield (
                    row,
                    InvalidRow(
                        "invalid_utf8",
                        f"{path} line {row + 1}: byte 0x{raw[exc.start]:02x} at file offset "
                        f"{start + exc.start} is not valid UTF-8",
                    ),
                )
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield row, InvalidRow("invalid_json", f"{path} line {row + 1}: {exc.msg}")
                continue
            escaped = b"\\ud" in raw or b"\\uD" in raw  # only escapes give lone surrogates
            found = _lone_surrogate(record) if escaped else None
            if found is not None:
                where = f"{path} line {row + 1} (file offset {start})"
                yield row, InvalidRow("invalid_unicode", _surrogate_detail(where, found))
                continue
            yield row, record


def read_json(path: Path) -> Iterator[tuple[int, Any]]:
    """A JSON list of records, a ``{"data": [...]}``-style wrapper, or JSON lines in a .json.

    The file is decoded as a whole with undecodable bytes kept as surrogates, so a record
    holding one becomes an ``InvalidRow`` (with the byte's file offset) and the rest load.
    """
    raw = Path(path).read_bytes()
    bom = len(_BOM) if raw.startswith(_BOM) else 0
    text = raw[bom:].decode("utf-8", errors="surrogateescape")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # many ".json" exports are really JSON lines
            yield from read_jsonl(path)
            return
        raise DataFileError(f"{path}: not valid JSON ({exc})") from exc
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataFileError(f"{path}: a JSON object must hold exactly one list of records")
        data = lists[0]
    if not isinstance(data, list):
        raise DataFileError(f"{path}: expected a JSON list of records")
    if not _SURROGATE.search(text) and "\\ud" not in text and "\\uD" not in text:
        yield from enumerate(data)
        return
    spans = _record_spans(text) if _RAW_BYTE.search(text) else None
    if spans is not None and len(spans) != len(data):
        spans = None
    offsets = _ByteOffsets(text, bom)
    for row, record in enumerate(data):
        found = _lone_surrogate(record)
        if found is None:
            yield row, record
            continue
        bad = _RAW_BYTE.search(text, *spans[row]) if spans else None
        if bad is not None:
            byte = ord(bad.group()) - 0xDC00
            detail = (
                f"{path} record {row}: byte 0x{byte:02x} at file offset "
                f"{offsets.at(bad.start())} is not valid UTF-8"
            )
            yield row, InvalidRow("invalid_utf8", detail)
        else:
            yield (
                row,
                InvalidRow("invalid_unicode", _surrogate_detail(f"{path} record {row}", found)),
            )


class _ByteOffsets:
    """Character index -> byte offset in the file, for increasing indexes (one pass)."""

    def __init__(self, text: str, start: int) -> None:
        self.text, self.char, self.byte = text, 0, start

    def at(self, index: int) -> int:
        piece = self.text[self.char : index]
        self.byte += len(piece.encode("utf-8", errors="surrogateescape"))
        self.char = index
        return self.byte


def _record_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the records of a JSON list, or of the one list in a wrapper object
    (the text is known to parse)."""
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        blank = _WS.match(text, i)
        assert blank is not None  # `[ \t\n\r]*` matches anywhere, if only the empty string
        return blank.end()

    i = skip(0)
    if text[i] == "{":
        i = skip(i + 1)
        while text[i] != "}":
            _key, i = decoder.raw_decode(text, i)
            i = skip(skip(i) + 1)  # past the ':'
            if text[i] == "[":
                break
            _value, i = decoder.raw_decode(text, i)
            i = skip(i)
            if text[i] == ",":
                i = skip(i + 1)
        else:
            return []
    spans = []
    i = skip(i + 1)  # past the '['
    while text[i] != "]":
        _record, end = decoder.raw_decode(text, i)
        spans.append((i, end))
        i = skip(end)
        if text[i] == ",":
            i = skip(i + 1)
    return spans


def _batch_rows(batch: Any, path: Path, first_row: int) -> Iterator[tuple[int, Any]]:
    """The records of an Arrow record batch; a string cell holding bytes that are not UTF-8
    (Arrow does not check on read) makes its row an ``InvalidRow`` naming the column."""
    try:
        records = batch.to_pylist()
    except UnicodeDecodeError:
        records = None
    if records is not None:
        for i, record in enumerate(records):
            yield first_row + i, record
        return
    for i in range(batch.num_rows):
        row = first_row + i
        try:
            yield row, batch.slice(i, 1).to_pylist()[0]
            continue
        except UnicodeDecodeError:
            pass
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                column[i].as_py()
            except UnicodeDecodeError as exc:
                detail = (
                    f"{path} row {row}: column {name!r} holds byte 0x{exc.object[exc.start]:02x} "
                    f"at offset {exc.start} of its value, which is not valid UTF-8"
                )
                yield row, InvalidRow("invalid_utf8", detail)
                break
        else:  # pragma: no cover - the row failed, so one of its columns does
            yield row, InvalidRow("invalid_utf8", f"{path} row {row}: not valid UTF-8")


def read_parquet(path: Path, batch_size: int = 1024) -> Iterator[tuple[int, Any]]:
    _require_pyarrow("parquet files")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_size)
        row = 0
        for batch in batches:
            yield from _batch_rows(batch, path, row)
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(f"{path}: not a readable parquet file ({exc})") from exc


def read_arrow(path: Path) -> Iterator[tuple[int, Any]]:
    """An Arrow IPC file as written by HF ``save_to_disk`` (stream format) or file format."""
    _require_pyarrow("arrow files")
    import pyarrow as pa

    try:
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        row = 0
        for batch in batches:
            yield from _batch_rows(batch, path, row)
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(f"{path}: not a readable Arrow file ({exc})") from exc


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
                raise DataFileError(f"{path}: no split {split!r}; splits: {', '.join(loaded)}")
            loaded = loaded[split]
        yield from enumerate(loaded)
        return
    if (path / "dataset_dict.json").is_file():
        with open(path / "dataset_dict.json", encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise DataFileError(f"{path}: no split {split!r}; splits: {', '.join(splits)}")
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
        raise DataFileError(f"{path}: no .jsonl/.json/.parquet/.arrow files in this folder")
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
        raise DataFileError(f"{path}: unsupported input format; use {', '.join(FILE_FORMATS)}")
    yield from _READERS[fmt](path)
