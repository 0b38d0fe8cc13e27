"""Whether a distillation teacher reads the student's token ids as the same text.

On-policy distillation asks the teacher for the log-prob of each token id the student
sampled; with another vocabulary the same id is another piece of text and the signal is
noise. Two tokenizers match when their vocabularies (piece -> id) and special tokens (bos /
eos / pad / unk and the added special tokens, with their ids) are equal; a larger teacher of
another family sharing the tokenizer passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
SHOWN = 5  # differing entries named in the error


def has_tokenizer(folder: str | None) -> bool:
    """`folder` holds a Hugging Face tokenizer's files."""
    return folder is not None and any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def _special_tokens(tok: Any) -> dict[str, tuple[str | None, int | None]]:
    out: dict[str, tuple[str | None, int | None]] = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tok, name, None)
        out[name] = (
            (None, None) if token is None else (str(token), tok.convert_tokens_to_ids(token))
        )
    for token in sorted(map(str, tok.all_special_tokens)):
        out[f"special {token!r}"] = (token, tok.convert_tokens_to_ids(token))
    return out


def _differences(student: dict[Any, Any], teacher: dict[Any, Any]) -> list[str]:
    keys = sorted(set(student) | set(teacher), key=str)
    return [
        f"{key!r}: student {student.get(key)!r}, teacher {teacher.get(key)!r}"
        for key in keys
        if student.get(key) != teacher.get(key)
    ]


def tokenizer_mismatch(student: Any, teacher: Any) -> str | None:
    """Why two loaded tokenizers differ (their vocabularies or special tokens), or None."""
    vocab = _differences(student.get_vocab(), teacher.get_vocab())
    special = _differences(_special_tokens(student), _special_tokens(teacher))
    if not vocab and not special:
        return None
    parts = []
    if vocab:
        shown = "; ".join(vocab[:SHOWN])
        parts.append(f"{len(vocab)} vocabulary entries differ ({shown})")
    if special:
        parts.append(f"special tokens differ ({'; '.join(special[:SHOWN])})")
    return ", ".join(parts)


def teacher_tokenizer_problem(student_path: str, teacher_path: str) -> str | None:
    """The config error for a teacher whose tokenizer is not the student's, or None."""
    if Path(student_path).resolve() == Path(teacher_path).resolve():
        return None
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(student_path)
    teacher = AutoTokenizer.from_pretrained(teacher_path)
    why = tokenizer_mismatch(student, teacher)
    if why is None:
        return None
    return (
        f"teacher_config: the teacher's tokenizer ({teacher_path}) is not the student's "
        f"({student_path}): {why}. On-policy distillation scores the student's token ids "
        "with the teacher, so both must share one tokenizer"
    )


def tokenizer_folder(role: Any) -> str | None:
    """Where a role's tokenizer is read: its `load` folder when that holds one (a teacher's
    HF checkpoint carries its own), else its `tokenizer_name_or_path`."""
    load = role.ckpt.load
    return str(load) if has_tokenizer(load) else role.data.tokenizer_name_or_path


def distillation_tokenizer_problems(run: Any) -> list[str]:
    """The teacher's tokenizer against the student's (`RunConfig` with a teacher); folders
    not on this machine (a dry run elsewhere) are left to the real run."""
    if run.teacher is None:
        return []
    student, teacher = tokenizer_folder(run.actor), tokenizer_folder(run.teacher)
    if not has_tokenizer(student) or not has_tokenizer(teacher):
        return []
    assert student is not None and teacher is not None
    problem = teacher_tokenizer_problem(student, teacher)
    return [problem] if problem else []
