"""Bad inputs give one line naming the file / row / key and what is wrong, never a traceback.

- preprocessing: bytes that are not UTF-8 (jsonl, json, parquet) and lone surrogates are bad
  rows with their file, row and byte offset, under ``on_bad_row`` skip and error;
- output folders that cannot be written (under a file, without permission) are refused by
  config validation (``train_grpo.py`` dry run and real start) and by the preprocessing CLI;
- truncated or corrupt checkpoints (dist_checkpointing folders through
  ``load_mcore_checkpoint``, HF safetensors through ``hf_io`` / ``load_hf_into_mcore``)
  raise ``CheckpointReadError`` / ``CorruptCheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mindrl.checkpoint.errors import (
    CheckpointReadError,
    ConversionError,
    CorruptCheckpointError,
)
from mindrl.config.writable import unwritable_reason
from mindrl.data.dataset import PromptDataset
from mindrl.data.readers import InvalidRow, read_records

REPO = Path(__file__).resolve().parents[2]
GSM8K = "gsm8k_qwen25_0.5b"
ROWS = [
    {"question": "Ann has 3 apples and buys 4 more. How many now?", "answer": "3 + 4\n#### 7"},
    {"question": "Bo reads 5 pages a day for 6 days. Pages read?", "answer": "5 * 6\n#### 30"},
    {"question": "Cy had 9 pens and lost 2. How many are left?", "answer": "9 - 2\n#### 7"},
]


def _jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def _with_bad_byte(rows: list[dict], index: int) -> tuple[bytes, int]:
    """jsonl bytes where row `index`'s question holds 0xff (a Latin-1 export gone wrong);
    returns the bytes and the file offset of the bad byte."""
    marked = [dict(r) for r in rows]
    marked[index]["question"] = "caf@: " + marked[index]["question"]
    data = _jsonl_bytes(marked)
    offset = data.index(b"caf@") + 3
    return data[:offset] + b"\xff" + data[offset + 1 :], offset


# ------------------------------------------------------------------------ the readers


def test_jsonl_reader_reports_file_line_and_offset(tmp_path):
    data, offset = _with_bad_byte(ROWS, 0)
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + data)  # a BOM is not an error
    rows = list(read_records(path))
    assert [r for r, _ in rows] == [0, 1, 2]
    bad = rows[0][1]
    assert isinstance(bad, InvalidRow) and bad.reason == "invalid_utf8"
    assert bad.detail == (
        f"{path} line 1: byte 0xff at file offset {offset + 3} is not valid UTF-8"
    )
    assert rows[1][1] == ROWS[1] and rows[2][1] == ROWS[2]


def test_jsonl_reader_rejects_lone_surrogate_escapes(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [json.dumps(ROWS[0]), '{"question": "x \\udc80 y", "answer": "#### 1"}']
    lines.append('{"question": "emoji \\ud83d\\ude00 is fine", "answer": "#### 2"}')
    path.write_text("\n".join(lines) + "\n")
    rows = dict(read_records(path))
    assert rows[0] == ROWS[0]
    assert isinstance(rows[1], InvalidRow) and rows[1].reason == "invalid_unicode"
    assert "line 2" in rows[1].detail and "\\udc80" in rows[1].detail
    assert rows[2]["question"] == "emoji \U0001f600 is fine"


def test_json_reader_keeps_good_records_around_a_bad_byte(tmp_path):
    records = [dict(r) for r in ROWS]
    records[1]["question"] = "MARK " + records[1]["question"]
    text = json.dumps({"version": 2, "data": records}, ensure_ascii=False).encode()
    offset = text.index(b"MARK")
    path = tmp_path / "train.json"
    path.write_bytes(text.replace(b"MARK", b"\xe9t\xe9"))  # Latin-1 "été"
    rows = list(read_records(path))
    assert rows[0] == (0, ROWS[0]) and rows[2] == (2, ROWS[2])
    assert rows[1][1] == InvalidRow(
        "invalid_utf8", f"{path} record 1: byte 0xe9 at file offset {offset} is not valid UTF-8"
    )


def test_parquet_reader_names_the_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    questions = [r["question"].encode() for r in ROWS]
    questions[2] = b"Cy had 9 pens \xc3 and lost 2."  # a cut multi-byte sequence
    table = pa.table(
        {
            "question": pa.array(questions, type=pa.binary()).view(pa.string()),
            "answer": [r["answer"] for r in ROWS],
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    rows = list(read_records(path))
    assert [r for r, _ in rows] == [0, 1, 2]
    assert rows[0][1] == ROWS[0] and rows[1][1] == ROWS[1]
    bad = rows[2][1]
    assert isinstance(bad, InvalidRow) and bad.reason == "invalid_utf8"
    assert bad.detail.startswith(f"{path} row 2: column 'question' holds byte 0xc3 at offset 14")


# -------------------------------------------------------------- the preprocessing CLI


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from mindrl.assets.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def preprocess_cli():
    from cli import preprocess_data

    return preprocess_data


def _preprocess_args(tok: Path, data: Path, out: Path, *overrides: str) -> list[str]:
    return [
        "--config-name", GSM8K, "--input", str(data), "--output-prefix", str(out),
        "--tokenizer-name-or-path", str(tok), *overrides,
    ]  # fmt: skip


def _run_preprocess(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(REPO / "cli" / "preprocess_data.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_bad_byte_row_is_skipped_with_its_row_number(preprocess_cli, tmp_path, tokenizer_dir):
    data, offset = _with_bad_byte(ROWS, 0)
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    out = tmp_path / "store"
    assert preprocess_cli.main(_preprocess_args(tokenizer_dir, path, out)) == 0
    ds = PromptDataset(out)
    assert [r.metadata["row"] for r in ds] == [1, 2]
    report = ds.meta["report"]
    assert report["rows_read"] == 3 and report["skipped"] == {"invalid_utf8": 1}
    assert report["bad_rows"] == [
        {
            "row": 0,
            "reason": "invalid_utf8",
            "detail": f"{path} line 1: byte 0xff at file offset {offset} is not valid UTF-8",
        }
    ]


@pytest.mark.multiproc
def test_bad_byte_under_on_bad_row_error(tmp_path, tokenizer_dir):
    data, offset = _with_bad_byte(ROWS, 1)
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    out = tmp_path / "store"
    proc = _run_preprocess(*_preprocess_args(tokenizer_dir, path, out, "on_bad_row=error"))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "row 1 [invalid_utf8]" in errors[0]
    assert f"{path} line 2: byte 0xff at file offset {offset}" in errors[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_lone_surrogate_row_does_not_break_the_store(preprocess_cli, tmp_path, tokenizer_dir):
    path = tmp_path / "train.jsonl"
    bad = '{"question": "Dee has \\ud800 coins", "answer": "#### 4"}'
    path.write_text("\n".join([json.dumps(ROWS[0]), bad, json.dumps(ROWS[2])]) + "\n")
    out = tmp_path / "store"
    assert preprocess_cli.main(_preprocess_args(tokenizer_dir, path, out)) == 0
    ds = PromptDataset(out)
    assert [r.metadata["row"] for r in ds] == [0, 2]
    assert ds.meta["report"]["skipped"] == {"invalid_unicode": 1}


@pytest.mark.multiproc
def test_preprocess_output_prefix_that_cannot_be_written(tmp_path, tokenizer_dir):
    path = tmp_path / "train.jsonl"
    path.write_bytes(_jsonl_bytes(ROWS))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = _run_preprocess(*_preprocess_args(tokenizer_dir, path, blocker / "store"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: invalid config: output_prefix: cannot create {blocker / 'store'}: {blocker} is a file, "
        "not a folder"
    ]
    # a folder that is not a prompt store is never overwritten
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    proc = _run_preprocess(*_preprocess_args(tokenizer_dir, path, other))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "is not a prompt store; refusing to overwrite it" in proc.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


# ---------------------------------------------------------------- output folders


def test_unwritable_reason(tmp_path):
    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    assert unwritable_reason(tmp_path) is None
    blocker = tmp_path / "f"
    blocker.write_text("x")
    assert unwritable_reason(blocker) == f"{blocker} exists and is not a folder"
    assert unwritable_reason(blocker / "a" / "b") == (
        f"cannot create {blocker / 'a' / 'b'}: {blocker} is a file, not a folder"
    )
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    assert "broken symlink" in unwritable_reason(dangling / "out")


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this process cannot write: a chmod 500 folder, or for root (who ignores
    permissions) /proc/sys, which the kernel keeps read-only in containers."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        yield locked
        locked.chmod(0o700)
        return
    proc_sys = Path("/proc/sys")
    if proc_sys.is_dir() and not os.access(proc_sys, os.W_OK):
        yield proc_sys
        return
    pytest.skip("running as root with no read-only folder to test against")


def test_unwritable_reason_without_permission(read_only_dir):
    assert (
        unwritable_reason(read_only_dir) == f"{read_only_dir} is not writable (permission denied)"
    )
    assert unwritable_reason(read_only_dir / "out" / "x") == (
        f"cannot create {read_only_dir / 'out' / 'x'}: {read_only_dir} is not writable "
        "(permission denied)"
    )


@pytest.mark.multiproc
def test_train_output_dir_without_write_permission(read_only_dir):
    out = read_only_dir / "mindrl_run"
    line = _one_problem_line(_train("--dry-run", f"runtime.output_dir={out}"), "output_dir")
    assert line.endswith(f"{read_only_dir} is not writable (permission denied)")


def _train(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_cpu"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def _one_problem_line(proc: subprocess.CompletedProcess, key: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if key in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.multiproc
def test_train_output_dir_under_a_file(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / "run"
    line = _one_problem_line(_train("--dry-run", f"runtime.output_dir={out}"), "output_dir")
    assert line.endswith(
        f"runtime.output_dir: cannot create {out}: {blocker} is a file, not a folder"
    )
    assert not list(tmp_path.glob("**/resolved_config.yaml"))


@pytest.mark.multiproc
def test_train_real_start_with_checkpoint_dir_under_a_file(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    save = blocker / "ckpt"
    proc = _train(f"runtime.output_dir={tmp_path / 'out'}", f"actor_config.save={save}")
    line = _one_problem_line(proc, ".save")
    assert line.endswith(
        f"actor_config.save: cannot create {save}: {blocker} is a file, not a folder"
    )
    assert not (tmp_path / "out").exists()  # refused before anything started


@pytest.mark.multiproc
def test_train_output_dir_that_is_a_file(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    line = _one_problem_line(_train("--dry-run", f"runtime.output_dir={blocker}"), "output_dir")
    assert line.endswith(f"runtime.output_dir: {blocker} exists and is not a folder")


# ------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def mcore_source(tiny_model_dir, tmp_path_factory) -> Path:
    from mindrl.checkpoint.offline import convert_hf_to_mcore

    root = tmp_path_factory.mktemp("mcore") / "mg"
    convert_hf_to_mcore(tiny_model_dir, root)
    return root


@pytest.fixture
def tiny_mcore_model():
    from mindrl.checkpoint.mcore_io import read_checkpoint_info
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.parallel import destroy_parallel, init_parallel

    def build(checkpoint: Path):
        arch = read_checkpoint_info(checkpoint).arch
        return build_gpt_model(arch).eval(), arch

    init_parallel(1, 1, accelerator="cpu", seed=0)
    yield build
    destroy_parallel()


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _first_shard(it: Path) -> Path:
    return sorted(it.glob("*.distcp"))[0]


# (damage, the file it names, error type, words of `what`)
MCORE_DAMAGE = {
    "truncated_shard": (
        lambda it: _truncate(_first_shard(it), 4096),
        lambda it: _first_shard(it),
        CorruptCheckpointError,
        "truncated: 4096 bytes, but .metadata needs",
    ),
    "shard_cut_by_one_byte": (
        lambda it: _truncate(_first_shard(it), _first_shard(it).stat().st_size - 1),
        lambda it: _first_shard(it),
        CorruptCheckpointError,
        "truncated:",
    ),
    "missing_shard": (
        lambda it: _first_shard(it).unlink(),
        lambda it: it / "__0_0.distcp",
        CheckpointReadError,
        "missing (listed in .metadata)",
    ),
    "corrupt_metadata_json": (
        lambda it: (it / "metadata.json").write_text('{"sharded_backend": "torch_di'),
        lambda it: it / "metadata.json",
        CorruptCheckpointError,
        "not valid JSON",
    ),
    "truncated_dot_metadata": (
        lambda it: _truncate(it / ".metadata", 200),
        lambda it: it / ".metadata",
        CorruptCheckpointError,
        "pickle data was truncated",
    ),
    "garbage_dot_metadata": (
        lambda it: (it / ".metadata").write_bytes(b"\x80\x04garbage" * 40),
        lambda it: it / ".metadata",
        CorruptCheckpointError,
        "",
    ),
    "missing_common_pt": (
        lambda it: (it / "common.pt").unlink(),
        lambda it: it / "common.pt",
        CheckpointReadError,
        "missing",
    ),
    "truncated_common_pt": (
        lambda it: _truncate(it / "common.pt", 300),
        lambda it: it / "common.pt",
        CorruptCheckpointError,
        "unreadable (PytorchStreamReader failed reading zip archive",
    ),
    "corrupt_mindrl_record": (
        lambda it: (it / "mindrl_checkpoint.json").write_bytes(b'{"arch": \xff'),
        lambda it: it / "mindrl_checkpoint.json",
        CorruptCheckpointError,
        "not UTF-8 text",
    ),
    "corrupt_tracker": (
        lambda it: (it.parent / "latest_checkpointed_iteration.txt").write_text("rel\x00ase"),
        lambda it: it.parent / "latest_checkpointed_iteration.txt",
        CorruptCheckpointError,
        "not an iteration number or 'release'",
    ),
}


@pytest.mark.parametrize("case", list(MCORE_DAMAGE))
def test_load_mcore_checkpoint_names_the_bad_file(case, mcore_source, tiny_mcore_model, tmp_path):
    from mindrl.checkpoint.mcore_io import load_mcore_checkpoint

    model, arch = tiny_mcore_model(mcore_source)
    damage, named, error_type, words = MCORE_DAMAGE[case]
    root = Path(shutil.copytree(mcore_source, tmp_path / "mg"))
    it = root / "release"
    bad_file = named(it)
    damage(it)
    with pytest.raises(error_type) as info:
        load_mcore_checkpoint([model], root, arch=arch)
    err = info.value
    assert err.path == str(bad_file), str(err)
    assert words in err.what, err.what
    assert str(err) == f"{bad_file}: {err.what}" and "\n" not in str(err)
    assert isinstance(err, ConversionError)  # the converter CLI prints it as one line
    # what a Ray worker hands back to the driver: the same type, path and message
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.path == err.path and str(again) == str(err)


class _RunsCode:
    """What a crafted .metadata would pickle: loading it calls a function of its choice."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_crafted_metadata_is_refused_before_it_runs(mcore_source, tiny_mcore_model, tmp_path):
    from mindrl.checkpoint.mcore_io import load_mcore_checkpoint

    model, arch = tiny_mcore_model(mcore_source)
    root = Path(shutil.copytree(mcore_source, tmp_path / "mg"))
    marker = tmp_path / "code_ran"
    (root / "release" / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.raises(CorruptCheckpointError) as info:
        load_mcore_checkpoint([model], root, arch=arch)
    assert info.value.path == str(root / "release" / ".metadata")
    assert info.value.what.startswith("refused:") and not marker.exists()


def test_load_mcore_checkpoint_intact_copy_still_loads(mcore_source, tiny_mcore_model, tmp_path):
    from mindrl.checkpoint.mcore_io import load_mcore_checkpoint

    model, arch = tiny_mcore_model(mcore_source)
    info = load_mcore_checkpoint([model], shutil.copytree(mcore_source, tmp_path / "mg"))
    assert info.arch == arch


@pytest.fixture
def hf_copy(tiny_model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "hf"))


@pytest.mark.parametrize(
    ("keep", "words"),
    [
        (0, "truncated: 0 bytes, not even the 8-byte header length"),
        (5, "truncated: 5 bytes, not even the 8-byte header length"),
        (64, "header does not fit in 64 bytes"),
        (-1, "bytes, but its header needs"),
        (-100_000, "bytes, but its header needs"),
    ],
)
def test_truncated_safetensors(hf_copy, keep, words):
    from mindrl.checkpoint.hf_io import HFCheckpointReader

    weights = hf_copy / "model.safetensors"
    size = weights.stat().st_size
    _truncate(weights, keep if keep >= 0 else size + keep)
    with pytest.raises(CorruptCheckpointError) as info:
        HFCheckpointReader(hf_copy).names()
    assert info.value.path == str(weights) and words in info.value.what, str(info.value)


def test_corrupt_safetensors_header(hf_copy):
    from mindrl.checkpoint.hf_io import HFCheckpointReader

    weights = hf_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:9] = b"["  # the header's JSON object opens as a list
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors: corrupt header"):
        HFCheckpointReader(hf_copy)


def test_sharded_index_with_a_missing_shard(hf_copy):
    from safetensors.torch import load_file, save_file

    from mindrl.checkpoint.hf_io import INDEX_FILE, HFCheckpointReader

    tensors = load_file(hf_copy / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half]}
    parts["model-00002-of-00002.safetensors"] = names[half:]
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, hf_copy / file, metadata={"format": "pt"})
    (hf_copy / "model.safetensors").unlink()
    weight_map = {k: f for f, keys in parts.items() for k in keys}
    (hf_copy / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert len(HFCheckpointReader(hf_copy).names()) == len(names)  # sound as written
    (hf_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointReadError) as info:
        HFCheckpointReader(hf_copy)
    assert info.value.path == str(hf_copy / "model-00002-of-00002.safetensors")
    assert info.value.what.startswith(f"missing ({INDEX_FILE} maps tensor ")


def test_load_hf_into_mcore_truncated(hf_copy, tiny_mcore_model, mcore_source):
    """The trainer's HF load path (`actor_config.load` = an HF folder) gives the same error."""
    from mindrl.checkpoint.online import load_hf_into_mcore

    model, _arch = tiny_mcore_model(mcore_source)
    weights = hf_copy / "model.safetensors"
    _truncate(weights, weights.stat().st_size - 4096)
    with pytest.raises(CorruptCheckpointError) as info:
        load_hf_into_mcore([model], hf_copy)
    assert info.value.path == str(weights) and "truncated" in info.value.what
