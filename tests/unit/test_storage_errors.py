"""`mindrl.storage`: how a failed output write is recognised and named."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from mindrl.storage import StorageError, check_room, format_bytes, is_out_of_space, write_failed


def test_out_of_space_is_recognised_through_rewordings_and_causes() -> None:
    assert is_out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    # torch's stream writer, and a worker's traceback text that carries it
    assert is_out_of_space(RuntimeError("[enforce fail] basic_ios::clear: iostream error"))
    assert is_out_of_space(RuntimeError("unexpected pos 248768 vs 248656"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert is_out_of_space(outer)
    assert not is_out_of_space(PermissionError(errno.EACCES, "Permission denied"))


def test_write_failed_names_the_vanished_folder_first(tmp_path: Path) -> None:
    gone = tmp_path / "out" / "ckpt"
    error = write_failed(gone, "checkpoint iter_0000003", OSError(errno.ENOSPC, "full"))
    assert str(error) == (
        f"cannot write checkpoint iter_0000003: the folder {tmp_path / 'out'} vanished "
        "during the run"
    )


def test_write_failed_otherwise_names_the_space_or_the_reason(tmp_path: Path) -> None:
    full = write_failed(tmp_path, "metrics.jsonl", OSError(errno.ENOSPC, "full"), 2048)
    assert str(full).startswith(f"no space left for metrics.jsonl in {tmp_path}: ")
    assert "the disk filled up while writing it" in str(full)
    assert str(full).endswith("; expected about 2.0 KiB)")
    other = write_failed(tmp_path, "metrics.jsonl", OSError(errno.EIO, "Input/output error"))
    assert str(other) == f"cannot write metrics.jsonl in {tmp_path}: [Errno 5] Input/output error"


def test_check_room_refuses_what_cannot_fit(tmp_path: Path) -> None:
    check_room(tmp_path / "not_yet", "checkpoint iter_0000001", 1)  # asks the parent
    with pytest.raises(StorageError) as caught:
        check_room(tmp_path, "checkpoint iter_0000001", 1 << 62)
    assert str(caught.value).startswith(
        f"no space left for checkpoint iter_0000001 in {tmp_path}: "
    )
    assert str(caught.value).endswith("free; it needs about 4194304.0 TiB")


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(4347404) == "4.1 MiB"
    assert format_bytes(None) == "unknown"
