"""The tokenized prompt store: a folder that appears complete or not at all.

Layout of ``<output_prefix>/``::

    prompts.jsonl   one JSON object per prompt, in input order:
                    {"prompt_ids": [int, ...], "prompt_text": str, "label": str,
                     "row": int (0-based source row), "extra": {dataset_additional_keys...}}
                    or, in a pairwise store (meta "kind": "pairwise", from
                    AlpacaStylePairwiseHandler), one preference pair per line:
                    {"prompt_ids": [...], "chosen_ids": [...], "rejected_ids": [...],
                     "prompt_text": str, "row": int}; each side is prompt_ids + its answer's
                    ids (ending in EOS), and only the answer's tokens are scored
    meta.json       {"format": "mindrl-prompt-store", "version": 1, "num_prompts": int,
                     "sha256": hex digest of prompts.jsonl, "tokenizer_name_or_path",
                     "prompt_type", "template", "seq_length", "max_prompt_tokens",
                     "handler_name", "input", "report": {...counts...}, "config": {...}}

JSON lines keep the store readable with ``head`` and diffable, need no extra dependency,
and load 57K prompts in about a second. The folder is written under a temporary name next
to the target and renamed into place; an existing store is replaced only after the new
one is complete, and a folder that is not a store is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STORE_FORMAT = "mindrl-prompt-store"
STORE_VERSION = 1
PROMPTS_FILE = "prompts.jsonl"
META_FILE = "meta.json"


class StoreError(RuntimeError):
    """A store folder that is missing, incomplete or corrupted."""


def is_store(path: str | Path) -> bool:
    meta = Path(path) / META_FILE
    if not meta.is_file():
        return False
    try:
        with open(meta, encoding="utf-8") as f:
            return json.load(f).get("format") == STORE_FORMAT
    except (OSError, json.JSONDecodeError):
        return False


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class StoreWriter:
    """Streams prompt records into a temporary folder; ``commit`` renames it into place.

    Use as a context manager: an exception before ``commit`` removes the temporary folder.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not (
            self.path.is_dir() and (is_store(self.path) or not any(self.path.iterdir()))
        ):
            raise StoreError(
                f"{self.path} exists and is not a prompt store; refusing to overwrite it"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.parent / f".{self.path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tmp.mkdir()
        self._file = open(self._tmp / PROMPTS_FILE, "wb")
        self._digest = hashlib.sha256()
        self.count = 0
        self._committed = False

    def add(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
            "utf-8"
        )
        self._digest.update(line)
        self._file.write(line)
        self.count += 1

    def commit(self, meta: dict[str, Any]) -> Path:
        """Finish the files, fsync them, and move the folder to its final name."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        full_meta = {
            "format": STORE_FORMAT,
            "version": STORE_VERSION,
            "num_prompts": self.count,
            "sha256": self._digest.hexdigest(),
            **meta,
        }
        meta_path = self._tmp / META_FILE
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(full_meta, f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        old = None
        if self.path.exists():
            old = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, old)
        os.rename(self._tmp, self.path)
        self._committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        if not self._committed:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def read_meta(path: str | Path) -> dict[str, Any]:
    """The store's meta.json, checked for format and version."""
    path = Path(path)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise StoreError(
            f"{path} is not a prompt store (no {META_FILE}); run cli/preprocess_data.py"
        )
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("format") != STORE_FORMAT:
        raise StoreError(f"{meta_path}: format {meta.get('format')!r}, expected {STORE_FORMAT!r}")
    if meta.get("version") != STORE_VERSION:
        raise StoreError(
            f"{meta_path}: version {meta.get('version')}, this mindrl reads {STORE_VERSION}"
        )
    return meta


def iter_prompts(path: str | Path, verify: bool = True) -> Iterator[dict[str, Any]]:
    """The store's records one at a time (memory stays flat); ``verify`` checks the sha256
    and the count once the file is read, raising ``StoreError`` on a mismatch."""
    path = Path(path)
    meta = read_meta(path)
    prompts_path = path / PROMPTS_FILE
    digest = hashlib.sha256()
    count = 0
    with open(prompts_path, "rb") as f:
        for line in f:
            digest.update(line)
            if line.strip():
                count += 1
                yield json.loads(line)
    if verify and digest.hexdigest() != meta["sha256"]:
        raise StoreError(f"{prompts_path}: checksum mismatch (file changed after preprocessing)")
    if count != meta["num_prompts"]:
        raise StoreError(f"{prompts_path}: {count} prompts, meta says {meta['num_prompts']}")


def write_subset(source: str | Path, keep: list[int], target: str | Path) -> Path:
    """A new store at `target` holding the records `keep` (positions in `source`, in that
    order), with the source's meta and the subset noted (e.g. a held-out split)."""
    wanted = set(keep)
    picked: dict[int, dict[str, Any]] = {}
    for i, record in enumerate(iter_prompts(source)):
        if i in wanted:
            picked[i] = record
    meta = {k: v for k, v in read_meta(source).items() if k not in ("num_prompts", "sha256")}
    meta["subset_of"] = str(source)
    with StoreWriter(target) as writer:
        for i in keep:
            writer.add(picked[i])
        return writer.commit(meta)
