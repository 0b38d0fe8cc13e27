"""Raw data -> tokenized prompt store (or, with a pairwise handler, a store of preference pairs),
with a report of every row that did not make it.

One pass over the input: the handler validates and extracts each row, the template renders
the prompt, the tokenizer encodes it, overlong prompts are filtered (or fail the run), and
valid rows stream into a temporary store that is renamed into place only when the run
succeeds. Under ``on_bad_row: error`` / ``on_overlong: error`` the whole input is still
scanned so the error lists every problem at once, and nothing is written.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindrl.config.errors import ConfigError
from mindrl.config.writable import unwritable_reason
from mindrl.data.config import PreprocessConfig
from mindrl.data.handlers import BadRow, PairExample, PromptExample, build_handler
from mindrl.data.readers import DataFileError, InvalidRow, describe_input
from mindrl.data.store import StoreWriter, is_store
from mindrl.data.templates import (
    PromptTemplate,
    TemplateError,
    check_tokenizer,
    get_template,
    render_prompt,
)

logger = logging.getLogger(__name__)

_CHUNK = 256  # rows per tokenization task (and per worker round trip)


@dataclass(frozen=True)
class RowIssue:
    """One row that was dropped or rejected: its 0-based source row, a reason, a detail."""

    row: int
    reason: str
    detail: str


@dataclass(frozen=True)
class PreprocessReport:
    """Counts of one run; ``bad_rows``/``overlong_rows`` list the first ``report_first_n``."""

    rows_read: int
    rows_kept: int
    skipped: dict[str, int]  # bad-row reason -> count
    overlong: int
    bad_rows: tuple[RowIssue, ...] = ()
    overlong_rows: tuple[RowIssue, ...] = ()
    max_prompt_tokens: int = 0
    mean_prompt_tokens: float = 0.0
    seq_length: int | None = None
    output: str | None = None
    elapsed_s: float = 0.0

    @property
    def rows_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rows_skipped"] = self.rows_skipped
        return out

    def summary(self) -> str:
        """Human-readable lines for the console."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        limit = self.seq_length if self.seq_length is not None else "none"
        lines = [
            f"rows read: {self.rows_read}",
            f"rows kept: {self.rows_kept}",
            f"rows skipped (bad): {self.rows_skipped} ({reasons})",
            f"overlong (> {limit} tokens): {self.overlong}",
            f"prompt tokens: max {self.max_prompt_tokens}, mean {self.mean_prompt_tokens:.1f}",
        ]
        if self.bad_rows:
            lines.append("first bad rows (0-based): " + _issues_text(self.bad_rows))
        if self.overlong_rows:
            lines.append("first overlong rows (0-based): " + _issues_text(self.overlong_rows))
        if self.output:
            lines.append(f"store: {self.output}")
        return "\n".join(lines)


def _issues_text(issues: Iterable[RowIssue]) -> str:
    return "; ".join(f"row {i.row} [{i.reason}] {i.detail}" for i in issues)


class PreprocessError(RuntimeError):
    """The run was refused by policy (bad or overlong rows) or produced nothing usable."""

    def __init__(self, message: str, report: PreprocessReport) -> None:
        super().__init__(message)
        self.report = report


def load_tokenizer(config: PreprocessConfig) -> Any:
    """The HF tokenizer; a local-looking path that does not exist fails with a plain message
    instead of transformers' hub lookup error."""
    from transformers import AutoTokenizer

    name = str(config.tokenizer_name_or_path)
    looks_local = name.startswith((".", "/", "~")) or Path(name).exists()
    if looks_local and not Path(name).expanduser().is_dir():
        raise FileNotFoundError(f"tokenizer_name_or_path {name!r}: no such folder")
    return AutoTokenizer.from_pretrained(
        config.tokenizer_name_or_path, use_fast=not config.tokenizer_not_use_fast
    )


@dataclass(frozen=True)
class EncodedPair:
    """A pair's token ids: the prompt once, each answer on its own (ending in EOS, as
    MindSpeed-RL's pairwise handler ends them). A side's sequence is prompt + answer; the loss
    reads the answer's tokens only."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]

    @property
    def length(self) -> int:
        """Tokens of the longer side's sequence (what `seq_length` bounds)."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


def encode_pair(
    tokenizer: Any, template: PromptTemplate, example: PairExample, enable_thinking: bool = False
) -> tuple[str, EncodedPair]:
    """(prompt text, the pair's ids): the prompt rendered as for GRPO, each answer encoded
    after it without special tokens, then EOS."""
    text = render_prompt(template, example.question, example.system, tokenizer, enable_thinking)
    eos = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]

    def ids(piece: str) -> list[int]:
        return [int(i) for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]

    return text, EncodedPair(ids(text), ids(example.chosen) + eos, ids(example.rejected) + eos)


Encoded = list[int] | EncodedPair


def encode_example(
    tokenizer: Any,
    template: PromptTemplate,
    example: PromptExample | PairExample,
    enable_thinking: bool = False,
) -> tuple[str, Encoded]:
    """A prompt's ids, or a pair's."""
    if isinstance(example, PairExample):
        return encode_pair(tokenizer, template, example, enable_thinking)
    return encode_prompt(tokenizer, template, example, enable_thinking)


def encode_prompt(
    tokenizer: Any, template: PromptTemplate, example: PromptExample, enable_thinking: bool = False
) -> tuple[str, list[int]]:
    """(prompt text, token ids). Special tokens come from the template text only."""
    text = render_prompt(template, example.question, example.system, tokenizer, enable_thinking)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, [int(i) for i in ids]


# ---------------------------------------------------------------- tokenization (1..n procs)

_WORKER: dict[str, Any] = {}


def _worker_init(config: PreprocessConfig) -> None:
    _WORKER["tokenizer"] = load_tokenizer(config)
    _WORKER["template"] = get_template(config.prompt_type, config.prompt_type_path)
    _WORKER["enable_thinking"] = config.enable_thinking


def _worker_encode(examples: list[Any]) -> list[tuple[str, Encoded]]:
    tokenizer, template = _WORKER["tokenizer"], _WORKER["template"]
    return [encode_example(tokenizer, template, ex, _WORKER["enable_thinking"]) for ex in examples]


def _encode_chunks(
    chunks: Iterator[list[tuple[int, Any]]],
    config: PreprocessConfig,
    tokenizer: Any,
    template: PromptTemplate,
) -> Iterator[tuple[int, Any, str, Encoded]]:
    """Encode chunk by chunk, in order; with ``workers > 1`` a bounded process pool."""
    if config.workers == 1:
        for chunk in chunks:
            for row, example in chunk:
                yield (
                    row,
                    example,
                    *encode_example(tokenizer, template, example, config.enable_thinking),
                )
        return
    import multiprocessing

    # spawn: the parent already runs tokenizer threads, which fork would copy half-alive
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(config.workers, ctx, _worker_init, (config,)) as pool:
        pending: list[tuple[list[tuple[int, Any]], Future]] = []
        for chunk in chunks:
            pending.append((chunk, pool.submit(_worker_encode, [ex for _, ex in chunk])))
            if len(pending) >= 2 * config.workers:
                yield from _drain(pending.pop(0))
        for item in pending:
            yield from _drain(item)


def _drain(item: tuple[list[tuple[int, Any]], Future]) -> Iterator[Any]:
    chunk, future = item
    for (row, example), (text, ids) in zip(chunk, future.result()):
        yield row, example, text, ids


# ------------------------------------------------------------------------------- the run


@dataclass
class _Tally:
    """Mutable counters of a run in progress."""

    first_n: int
    rows_read: int = 0
    kept: int = 0
    overlong: int = 0
    skipped: Counter = field(default_factory=Counter)
    bad_rows: list[RowIssue] = field(default_factory=list)
    overlong_rows: list[RowIssue] = field(default_factory=list)
    token_total: int = 0
    token_max: int = 0

    def bad(self, row: int, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        if len(self.bad_rows) < self.first_n:
            self.bad_rows.append(RowIssue(row, reason, detail))

    def too_long(self, row: int, length: int, limit: int) -> None:
        self.overlong += 1
        if len(self.overlong_rows) < self.first_n:
            self.overlong_rows.append(RowIssue(row, "overlong", f"{length} tokens > {limit}"))

    def report(self, config: PreprocessConfig, output: str | None, t0: float) -> PreprocessReport:
        return PreprocessReport(
            rows_read=self.rows_read,
            rows_kept=self.kept,
            skipped=dict(sorted(self.skipped.items())),
            overlong=self.overlong,
            bad_rows=tuple(self.bad_rows),
            overlong_rows=tuple(self.overlong_rows),
            max_prompt_tokens=self.token_max,
            mean_prompt_tokens=self.token_total / self.kept if self.kept else 0.0,
            seq_length=config.seq_length,
            output=output,
            elapsed_s=round(time.perf_counter() - t0, 3),
        )


def _converted_chunks(
    rows: Iterable[tuple[int, Any]],
    handler: Any,
    tally: _Tally,
    log: Callable[[str], None],
    log_interval: int,
    chunk_size: int,
) -> Iterator[list[tuple[int, Any]]]:
    """Validate rows (counting bad ones) and group the good ones into chunks."""
    chunk: list[tuple[int, Any]] = []
    t0 = time.perf_counter()
    for row, record in rows:
        tally.rows_read += 1
        if isinstance(record, InvalidRow):
            tally.bad(row, record.reason, record.detail)
        else:
            try:
                chunk.append((row, handler.convert(record)))
            except BadRow as bad:
                tally.bad(row, bad.reason, bad.detail)
        if tally.rows_read % log_interval == 0:
            rate = tally.rows_read / max(time.perf_counter() - t0, 1e-9)
            log(
                f"processed {tally.rows_read} rows: {tally.kept} kept, "
                f"{sum(tally.skipped.values())} bad, {tally.overlong} overlong ({rate:.0f} rows/s)"
            )
        if len(chunk) >= chunk_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def run_preprocess(
    config: PreprocessConfig, log: Callable[[str], None] | None = None
) -> PreprocessReport:
    """Build the store at ``config.output_prefix``; returns the report, raises
    ``PreprocessError`` when a policy refuses the input (nothing is written then)."""
    log = log or logger.info
    t0 = time.perf_counter()
    check_output_prefix(config.output_prefix)
    tokenizer = load_tokenizer(config)
    try:  # a template the tokenizer cannot encode fails here, before any row is read
        template = get_template(config.prompt_type, config.prompt_type_path)
        check_tokenizer(template, tokenizer)
    except TemplateError as exc:
        raise ConfigError(f"{exc} (tokenizer: {config.tokenizer_name_or_path})") from None
    handler = build_handler(config)
    source = describe_input(config.input) if config.input else config.handler_name
    log(
        f"preprocessing {config.input or config.reasoning_gym.dataset} ({source}) with "
        f"{config.handler_name}, template {template.name!r} -> {config.output_prefix}"
    )
    tally = _Tally(first_n=config.report_first_n)
    with StoreWriter(config.output_prefix) as writer:
        chunk_size = 1 if config.workers == 1 else _CHUNK  # 1: progress counts stay exact
        chunks = _converted_chunks(
            handler.rows(), handler, tally, log, config.log_interval, chunk_size
        )
        for row, example, text, encoded in _encode_chunks(chunks, config, tokenizer, template):
            length = encoded.length if isinstance(encoded, EncodedPair) else len(encoded)
            if config.seq_length is not None and length > config.seq_length:
                tally.too_long(row, length, config.seq_length)
                continue
            writer.add(_store_record(row, example, text, encoded))
            tally.kept += 1
            tally.token_total += length
            tally.token_max = max(tally.token_max, length)
        _enforce_policies(config, tally, t0)
        report = tally.report(config, str(config.output_prefix), t0)
        writer.commit(_store_meta(config, template, tokenizer, report))
    for line in report.summary().splitlines():
        log(line)
    return report


def _store_record(row: int, example: Any, text: str, encoded: Encoded) -> dict[str, Any]:
    """One store line: a prompt with its label, or a pair (see `mindrl.data.store`)."""
    if isinstance(encoded, EncodedPair):
        return {
            "prompt_ids": encoded.prompt_ids,
            "chosen_ids": encoded.chosen_ids,
            "rejected_ids": encoded.rejected_ids,
            "prompt_text": text,
            "row": row,
        }
    return {
        "prompt_ids": encoded,
        "prompt_text": text,
        "label": example.label,
        "row": row,
        "extra": example.extra,
    }


def check_output_prefix(output_prefix: str | Path) -> None:
    """``DataFileError`` naming ``output_prefix`` when the store certainly cannot be written
    there (the store is built beside it and renamed into place, so its folder must be
    writable too) or when it is a folder of something else, which is never overwritten."""
    path = Path(output_prefix)
    reason = unwritable_reason(path) or unwritable_reason(path.absolute().parent)
    if reason:
        raise DataFileError(f"output_prefix: {reason}")
    if path.is_dir() and not is_store(path) and any(path.iterdir()):
        raise DataFileError(
            f"output_prefix: {path} exists and is not a prompt store; refusing to overwrite it"
        )


def _enforce_policies(config: PreprocessConfig, tally: _Tally, t0: float) -> None:
    problems = []
    if config.on_bad_row == "error" and tally.skipped:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(tally.skipped.items()))
        problems.append(
            f"{sum(tally.skipped.values())} bad rows ({reasons}); first: "
            f"{_issues_text(tally.bad_rows)} [on_bad_row=error; on_bad_row=skip drops them]"
        )
    if config.on_overlong == "error" and tally.overlong:
        problems.append(
            f"{tally.overlong} prompts longer than seq_length={config.seq_length}; first: "
            f"{_issues_text(tally.overlong_rows)} "
            "[on_overlong=error; on_overlong=filter drops them]"
        )
    if not problems and tally.kept == 0:
        problems.append(f"no valid prompt among {tally.rows_read} rows")
    if problems:
        report = tally.report(config, None, t0)
        raise PreprocessError("nothing written: " + " | ".join(problems), report)


def _store_meta(
    config: PreprocessConfig, template: PromptTemplate, tokenizer: Any, report: PreprocessReport
) -> dict[str, Any]:
    return {
        "created_unix": int(time.time()),
        "input": config.input,
        "handler_name": config.handler_name,
        "kind": "pairwise" if build_handler(config).pairwise else "prompts",
        "tokenizer_name_or_path": str(config.tokenizer_name_or_path),
        "tokenizer": {
            "class": type(tokenizer).__name__,
            "vocab_size": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "prompt_type": template.name,
        "template": template.to_dict(),
        "seq_length": config.seq_length,
        "max_prompt_tokens": report.max_prompt_tokens,
        "report": {k: v for k, v in report.to_dict().items() if k != "output"},
        "config": config.to_dict(),
    }
