"""Dataset handlers: one raw record -> (question, system, label, extra), or a ``BadRow``; the
pairwise handler -> (question, system, chosen, rejected).

Names follow MindSpeed-RL (``R1AlpacaStyleInstructionHandler`` with ``map_keys``) plus
``AlpacaStylePairwiseHandler`` (DPO's preference pairs), ``GSM8KHandler`` (GSM8K's ``question``/``answer "... #### N"`` rows and verl's processed
``prompt``/``reward_model.ground_truth`` rows) and ``ReasoningGymHandler`` (problems
generated offline by reasoning-gym). A handler only validates and extracts; templating,
tokenization and length filtering happen in ``preprocess``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from mindrl.config.errors import ConfigError
from mindrl.data.answers import extract_gsm8k_answer, extract_label, label_to_text
from mindrl.data.config import PreprocessConfig, nearest
from mindrl.data.tool_kwargs import ROW_PATHS, TOOLS_KWARGS, ToolsKwargs, check_tools_kwargs

_MISSING = object()


class BadRow(Exception):
    """A record that cannot become a prompt; ``reason`` is a short category for counts."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class PromptExample:
    """What a handler extracts from one row, before templating."""

    question: str
    label: str
    system: str | None = None  # None = the template's default system prompt
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PairExample:
    """A preference pair before templating: one prompt, the preferred and the other answer."""

    question: str
    chosen: str
    rejected: str
    system: str | None = None


Example = TypeVar("Example", PromptExample, PairExample)


def get_path(record: Any, path: str) -> Any:
    """``record[path]``, or a dotted path into nested dicts/lists (``reward_model.ground_truth``,
    ``1.ground_truth.value``); ``_MISSING`` when absent."""
    if isinstance(record, Mapping) and path in record:
        return record[path]
    node = record
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(node) <= index < len(node):
                return _MISSING
            node = node[index]
        else:
            return _MISSING
    return node


def json_safe(value: Any) -> Any:
    """Plain JSON types for the store (numpy scalars, tuples, odd keys come from parquet/RG)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalar
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)  # numpy array
    if callable(tolist):
        return json_safe(tolist())
    return str(value)


def _keys_hint(record: Any) -> str:
    if isinstance(record, Mapping):
        return f" (record keys: {', '.join(map(str, list(record)[:12]))})"
    return ""


class Handler(Generic[Example]):
    """Base handler: reads rows from ``config.input`` and converts each one."""

    needs_input: ClassVar[bool] = True
    pairwise: ClassVar[bool] = False
    default_columns: ClassVar[dict[str, str]] = {}

    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config
        self.columns = {**self.default_columns, **config.map_keys}

    def rows(self) -> Iterator[tuple[int, Any]]:
        from mindrl.data.readers import read_records

        assert self.config.input is not None
        return read_records(self.config.input, split=self.config.split)

    def convert(self, record: Any) -> Example:
        raise NotImplementedError

    # helpers shared by the handlers
    def _field(self, record: Any, column: str, required: bool = True) -> Any:
        value = get_path(record, column)
        if value is _MISSING:
            if required:
                raise BadRow("missing_key", f"{column!r} not in record{_keys_hint(record)}")
            return None
        return value

    def _text(self, record: Any, column: str, what: str) -> str:
        value = self._field(record, column)
        if not isinstance(value, str):
            raise BadRow("wrong_type", f"{what} {column!r} is {type(value).__name__}, not str")
        return value

    def _with_suffix(self, question: str) -> str:
        suffix = self.config.question_suffix
        return f"{question} {suffix}" if suffix else question

    def _extra(self, record: Any) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for key in self.config.dataset_additional_keys:
            if key == "labels":  # MindSpeed-RL's name for the ground truth: always stored
                continue
            extra[key] = json_safe(self._field(record, key))
        tools_kwargs = _row_tools_kwargs(record)
        if tools_kwargs:
            extra[TOOLS_KWARGS] = tools_kwargs
        return extra


def _row_tools_kwargs(record: Any) -> ToolsKwargs:
    """The row's per-sample tool arguments (`mindrl.data.tool_kwargs`), checked; kept whatever
    ``dataset_additional_keys`` says, as verl keeps them."""
    for path in ROW_PATHS:
        value = get_path(record, path) if isinstance(record, Mapping) else _MISSING
        if value is not _MISSING:
            try:
                return check_tools_kwargs(json_safe(value))
            except ValueError as exc:
                raise BadRow("bad_tools_kwargs", str(exc)) from exc
    return {}


def _require_record(record: Any, allow_list: bool = False) -> Any:
    """Rows are JSON objects; list rows (e.g. Orz's ``[human turn, assistant turn]``) are
    accepted where ``map_keys`` can address them by index (``0.value``)."""
    if isinstance(record, Mapping) or (allow_list and isinstance(record, (list, tuple))):
        return record
    raise BadRow("not_a_record", f"row is {type(record).__name__}, not an object")


def _messages_to_question(messages: list[Any]) -> tuple[str, str | None]:
    """(last user content, system content) of a chat-format prompt (verl / Math17k)."""
    user, system = None, None
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise BadRow("wrong_type", "prompt messages must be {'role', 'content': str}")
        if message.get("role") == "user":
            user = message["content"]
        elif message.get("role") == "system":
            system = message["content"]
    if user is None:
        raise BadRow("empty_prompt", "prompt messages hold no user turn")
    return user, system


def _label_value(value: Any, column: str) -> str:
    """A label field as text: a string, a number, or a ``{"ground_truth": ...}`` mapping."""
    if isinstance(value, Mapping):
        if "ground_truth" not in value:
            raise BadRow("missing_key", f"{column!r} mapping has no 'ground_truth'")
        value = value["ground_truth"]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    text = label_to_text(value)
    if text is None:
        raise BadRow("wrong_type", f"answer {column!r} is {type(value).__name__}")
    return text


class R1AlpacaStyleInstructionHandler(Handler[PromptExample]):
    """Alpaca-style rows: ``map_keys`` names the prompt/query/response/system columns.

    The prompt column may hold text or a list of chat messages; the response column text, a
    number, or a ``{"ground_truth": ...}`` mapping (DAPO-Math-17k's ``reward_model``). The
    label comes out of the response by ``label_format`` (GSM8K ``####``, ``\\boxed{}``, ...).
    """

    default_columns: ClassVar[dict[str, str]] = {
        "prompt": "instruction",
        "query": "input",
        "response": "output",
    }

    def convert(self, record: Any) -> PromptExample:
        record = _require_record(record, allow_list=True)
        prompt_col = self.columns["prompt"]
        value = self._field(record, prompt_col)
        system = None
        if isinstance(value, list):
            question, system = _messages_to_question(value)
        elif isinstance(value, str):
            question = value
            query_col = self.columns.get("query")
            query = self._field(record, query_col, required=False) if query_col else None
            if isinstance(query, str) and query.strip():
                question = f"{question}\n{query}"
            question = self._with_suffix(question) if question.strip() else question
        else:
            raise BadRow("wrong_type", f"prompt {prompt_col!r} is {type(value).__name__}")
        if not question.strip():
            raise BadRow("empty_prompt", f"prompt {prompt_col!r} is empty")
        system_col = self.columns.get("system")
        if system_col:
            sys_value = self._field(record, system_col, required=False)
            if isinstance(sys_value, str) and sys_value.strip():
                system = sys_value
        response_col = self.columns["response"]
        answer = _label_value(self._field(record, response_col), response_col)
        label = extract_label(answer, self.config.label_format)
        if not label:
            raise BadRow(
                "no_answer",
                f"no {self.config.label_format} answer in {response_col!r}: {answer[:60]!r}",
            )
        return PromptExample(
            question,
            label,
            system if system is not None else self.config.system,
            self._extra(record),
        )


class Math17kAlpacaStyleInstructionHandler(R1AlpacaStyleInstructionHandler):
    """MindSpeed-RL's name for the same handler on DAPO-Math-17k (chat prompt + reward_model)."""


class GSM8KHandler(Handler[PromptExample]):
    """GSM8K rows (``question``, ``answer`` ending in ``#### N``) and verl's processed rows
    (``prompt`` = chat messages, ``reward_model.ground_truth``).

    A raw question gets ``question_suffix`` appended (verl appends its "Let's think step by
    step..." instruction the same way), so both formats give the same prompt text.
    """

    default_columns: ClassVar[dict[str, str]] = {"prompt": "question", "response": "answer"}

    def convert(self, record: Any) -> PromptExample:
        record = _require_record(record)
        if isinstance(record.get("prompt"), list) and "reward_model" in record:
            question, system = _messages_to_question(record["prompt"])
            if not question.strip():
                raise BadRow("empty_prompt", "prompt user turn is empty")
            raw = _label_value(record["reward_model"], "reward_model")
            label = extract_label(raw, "numeric")
            if label is None:
                raise BadRow("no_answer", f"ground_truth is not a number: {raw[:60]!r}")
        else:
            question = self._text(record, self.columns["prompt"], "question")
            if not question.strip():
                raise BadRow("empty_prompt", f"question {self.columns['prompt']!r} is empty")
            question = self._with_suffix(question)
            system = None
            answer = self._text(record, self.columns["response"], "answer")
            label = extract_gsm8k_answer(answer)
            if label is None:
                raise BadRow("no_answer", f"no '#### N' in answer: {answer[-60:]!r}")
        if system is None:
            system = self.config.system
        return PromptExample(question, label, system, self._extra(record))


class ReasoningGymHandler(Handler[PromptExample]):
    """Generates problems offline: ``reasoning_gym.create_dataset(dataset, size, seed)``.

    Each entry's ``question`` becomes the prompt and ``answer`` the label; list ``metadata``
    in ``dataset_additional_keys`` to keep reasoning-gym's metadata (its graders use it).
    """

    needs_input: ClassVar[bool] = False

    def rows(self) -> Iterator[tuple[int, Any]]:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS

        rg = self.config.reasoning_gym
        if rg.dataset not in DATASETS:
            hint = difflib.get_close_matches(rg.dataset, list(DATASETS), n=1)
            raise ConfigError(
                f"reasoning_gym.dataset {rg.dataset!r} is not a reasoning-gym dataset"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
            )
        try:
            dataset = reasoning_gym.create_dataset(
                rg.dataset, size=rg.size, seed=rg.seed, **rg.config
            )
        except TypeError as exc:  # an unknown key in reasoning_gym.config
            raise ConfigError(f"reasoning_gym.config: {exc}") from exc
        for row in range(len(dataset)):
            yield row, dataset[row]

    def convert(self, record: Any) -> PromptExample:
        record = _require_record(record)
        question = self._text(record, "question", "question")
        if not question.strip():
            raise BadRow("empty_prompt", "question is empty")
        answer = self._field(record, "answer")
        label = label_to_text(answer) if answer is not None else None
        if label is None or not label.strip():
            raise BadRow("no_answer", f"answer is {answer!r}")
        return PromptExample(
            self._with_suffix(question), label.strip(), self.config.system, self._extra(record)
        )


class AlpacaStylePairwiseHandler(Handler[PairExample]):
    """MindSpeed-RL's DPO pairs: ``map_keys`` names the prompt / query / system columns (as for
    the instruction handler) and the ``chosen`` / ``rejected`` answer columns (default
    ``chosen`` / ``rejected``). A pair with an empty side or two identical sides is a bad row:
    it has nothing to prefer."""

    pairwise: ClassVar[bool] = True
    default_columns: ClassVar[dict[str, str]] = {
        "prompt": "instruction",
        "query": "input",
        "chosen": "chosen",
        "rejected": "rejected",
    }

    def convert(self, record: Any) -> PairExample:
        record = _require_record(record)
        question = self._text(record, self.columns["prompt"], "prompt")
        query_col = self.columns.get("query")
        query = self._field(record, query_col, required=False) if query_col else None
        if isinstance(query, str) and query.strip():
            question = f"{question}\n{query}"
        if not question.strip():
            raise BadRow("empty_prompt", f"prompt {self.columns['prompt']!r} is empty")
        chosen = self._text(record, self.columns["chosen"], "chosen")
        rejected = self._text(record, self.columns["rejected"], "rejected")
        for side, text in (("chosen", chosen), ("rejected", rejected)):
            if not text.strip():
                raise BadRow("empty_response", f"{side} {self.columns[side]!r} is empty")
        if chosen.strip() == rejected.strip():
            raise BadRow("identical_pair", "chosen and rejected are the same text")
        system = self.config.system
        system_col = self.columns.get("system")
        if system_col:
            value = self._field(record, system_col, required=False)
            if isinstance(value, str) and value.strip():
                system = value
        return PairExample(self._with_suffix(question), chosen, rejected, system)


HANDLERS: dict[str, type[Handler[Any]]] = {
    "R1AlpacaStyleInstructionHandler": R1AlpacaStyleInstructionHandler,
    "Math17kAlpacaStyleInstructionHandler": Math17kAlpacaStyleInstructionHandler,
    "GSM8KHandler": GSM8KHandler,
    "ReasoningGymHandler": ReasoningGymHandler,
    "AlpacaStylePairwiseHandler": AlpacaStylePairwiseHandler,
}


def check_handler(config: PreprocessConfig) -> None:
    """Raise ConfigError unless ``handler_name`` names a handler that ``config`` can feed."""
    name = config.handler_name
    if name not in HANDLERS:
        raise ConfigError(
            f"unknown handler_name {name!r}{nearest(name, list(HANDLERS))}; "
            f"available: {', '.join(sorted(HANDLERS))}"
        )
    if HANDLERS[name].needs_input and not config.input:
        raise ConfigError(f"input is required for handler {name}")


def build_handler(config: PreprocessConfig) -> Handler[Any]:
    """The handler ``config`` names, checked first."""
    check_handler(config)
    return HANDLERS[config.handler_name](config)
