"""Prompt templates: data in ``configs/model/templates.json``, rendered here.

The JSON keeps MindSpeed-RL's shape (a list of ``{"name", "format_user": {"slots": [...]},
"format_system": {...}, "format_prefix": {...}, "default_system", "stop_words"}``) so users
can bring their own templates. A slot is either a string with ``{{content}}`` as the
placeholder (braces such as ``\\boxed{}`` stay literal) or a list of special-token names
(``["bos_token"]``) that are looked up on the tokenizer. A template with
``"use_tokenizer_chat_template": true`` defers to the tokenizer's own chat template.

Rendering follows MindSpeed-RL's single-turn encoding so the same template name gives the same
prompt text: prefix, then the system turn (``format_system``; plain text when a template has
none), then the user turn. ``"system_in_user": true`` (implied for names starting with
``llama2``, as MindSpeed-RL does) puts the formatted system text inside the user turn instead;
``"template_class": "ReasoningTemplate"`` (qwen3) ends the prompt with an empty think block
unless thinking is enabled. mindrl's ``"special_tokens"`` lists markers the tokenizer must know
as single tokens; ``<|...|>`` and ``<｜...｜>`` markers in the slots are checked as well, so a
template used with the wrong model's tokenizer fails up front instead of producing prompts
whose markers were split into ordinary tokens.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TEMPLATES_PATH = (
    Path(__file__).resolve().parents[2] / "configs" / "model" / "templates.json"
)

_CONTENT = "{{content}}"
_KNOWN_FIELDS = {
    "name",
    "description",
    "format_user",
    "format_system",
    "format_prefix",
    "default_system",
    "stop_words",
    "use_tokenizer_chat_template",
    "template_class",
    "system_in_user",
    "special_tokens",
}
# MindSpeed-RL/LlamaFactory template fields that only matter for multi-turn or training
# targets; accepted so foreign templates load, unused for single-turn prompts.
_IGNORED_FIELDS = {
    "format_assistant",
    "format_observation",
    "format_separator",
    "format_function",
    "format_tools",
    "replace_eos",
    "efficient_eos",
    "force_system",
}
_TEMPLATE_CLASSES = ("Template", "Llama2Template", "ReasoningTemplate")
# MindSpeed-RL's ReasoningTemplate: with thinking off the prompt ends with an empty think block.
THOUGHT_WORDS = ("<think>", "</think>")
# Markers that are special tokens in every tokenizer that uses them (ChatML, Llama 3,
# DeepSeek's full-width bars); ``<think>``-style tags are not, so they are not matched.
_MARKER = re.compile(r"<\|[^|<>\s]+\|>|<｜[^｜<>]+｜>")


class TemplateError(ValueError):
    """A template that cannot work: unknown name, bad entry, or a tokenizer that lacks a
    token it needs. One line, naming the template and the token."""


class UnknownTemplateError(TemplateError, KeyError):
    """No template of that name (a KeyError too, for lookups that expect one)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


Slot = str | tuple[str, ...]


@dataclass(frozen=True)
class PromptTemplate:
    """One named way to turn (system, question) into the prompt text."""

    name: str
    user_slots: tuple[Slot, ...] = (_CONTENT,)
    system_slots: tuple[Slot, ...] = ()
    prefix_slots: tuple[Slot, ...] = ()
    default_system: str = ""
    stop_words: tuple[str, ...] = ()
    use_tokenizer_chat_template: bool = False
    description: str = ""
    system_in_user: bool = False  # Llama 2: the system text opens the first user turn
    reasoning: bool = False  # qwen3: empty think block after the prompt unless thinking is on
    special_tokens: tuple[str, ...] = ()  # must be single tokens of the tokenizer

    def required_tokens(self) -> tuple[str, ...]:
        """Markers the tokenizer must encode as one token: the declared special tokens and
        every ``<|...|>`` / ``<｜...｜>`` marker in the slots and stop words."""
        found: list[str] = list(self.special_tokens)
        for slot in (*self.prefix_slots, *self.system_slots, *self.user_slots, *self.stop_words):
            if isinstance(slot, str):
                found += _MARKER.findall(slot)
        return tuple(dict.fromkeys(found))

    def required_token_names(self) -> tuple[str, ...]:
        """Tokenizer attributes (``bos_token``, ...) the slots take the token from."""
        names = [
            name
            for slot in (*self.prefix_slots, *self.system_slots, *self.user_slots)
            if not isinstance(slot, str)
            for name in slot
        ]
        return tuple(dict.fromkeys(names))

    def to_dict(self) -> dict[str, Any]:
        """JSON form, saved in the prompt store's meta so a store says how it was built."""
        out: dict[str, Any] = {"name": self.name}
        if self.use_tokenizer_chat_template:
            out["use_tokenizer_chat_template"] = True
        else:
            out["format_user"] = {"slots": [_slot_to_json(s) for s in self.user_slots]}
            if self.system_slots:
                out["format_system"] = {"slots": [_slot_to_json(s) for s in self.system_slots]}
            if self.prefix_slots:
                out["format_prefix"] = {"slots": [_slot_to_json(s) for s in self.prefix_slots]}
        if self.default_system:
            out["default_system"] = self.default_system
        if self.stop_words:
            out["stop_words"] = list(self.stop_words)
        if self.system_in_user:
            out["system_in_user"] = True
        if self.reasoning:
            out["template_class"] = "ReasoningTemplate"
        if self.special_tokens:
            out["special_tokens"] = list(self.special_tokens)
        return out


def _slot_to_json(slot: Slot) -> str | list[str]:
    return slot if isinstance(slot, str) else list(slot)


def _parse_slots(entry: dict[str, Any], field: str, template_name: str) -> tuple[Slot, ...]:
    block = entry.get(field)
    if block is None:
        return ()
    if not isinstance(block, dict) or not isinstance(block.get("slots"), list):
        raise TemplateError(f"template {template_name!r}: {field} must be {{'slots': [...]}}")
    slots: list[Slot] = []
    for slot in block["slots"]:
        if isinstance(slot, str):
            slots.append(slot)
        elif isinstance(slot, list) and all(isinstance(s, str) for s in slot):
            slots.append(tuple(slot))
        else:
            raise TemplateError(
                f"template {template_name!r}: {field} slot must be a string or a list of "
                f"special-token names, got {slot!r}"
            )
    return tuple(slots)


def _string_list(entry: dict[str, Any], field: str, template_name: str) -> tuple[str, ...]:
    value = entry.get(field) or ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TemplateError(f"template {template_name!r}: {field} must be a list of strings")
    return tuple(value)


def parse_template(entry: dict[str, Any]) -> PromptTemplate:
    """Build a template from one JSON entry; unknown fields are errors (typos matter here)."""
    if not isinstance(entry, dict):
        raise TemplateError(f"template entry must be a JSON object, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise TemplateError(f"template entry without a name: {entry!r}")
    unknown = set(entry) - _KNOWN_FIELDS - _IGNORED_FIELDS
    if unknown:
        key = sorted(unknown)[0]
        hint = difflib.get_close_matches(key, sorted(_KNOWN_FIELDS | _IGNORED_FIELDS), n=1)
        raise TemplateError(
            f"template {name!r}: unknown field {key!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
        )
    template_class = entry.get("template_class") or "Template"
    if template_class not in _TEMPLATE_CLASSES:
        raise TemplateError(
            f"template {name!r}: unknown template_class {template_class!r}; "
            f"known: {', '.join(_TEMPLATE_CLASSES)}"
        )
    use_chat = bool(entry.get("use_tokenizer_chat_template", False))
    user_slots = _parse_slots(entry, "format_user", name)
    if not use_chat and not user_slots:
        raise TemplateError(f"template {name!r}: needs format_user or use_tokenizer_chat_template")
    default_system = entry.get("default_system") or ""
    if isinstance(default_system, list):  # MindSpeed-RL joins a list of sentences
        default_system = "".join(str(s) for s in default_system)
    system_in_user = entry.get("system_in_user")
    if system_in_user is None:  # MindSpeed-RL picks its Llama2Template by name
        system_in_user = name.startswith("llama2") or template_class == "Llama2Template"
    return PromptTemplate(
        name=name,
        user_slots=user_slots or (_CONTENT,),
        system_slots=_parse_slots(entry, "format_system", name),
        prefix_slots=_parse_slots(entry, "format_prefix", name),
        default_system=str(default_system),
        stop_words=_string_list(entry, "stop_words", name),
        use_tokenizer_chat_template=use_chat,
        description=str(entry.get("description") or ""),
        system_in_user=bool(system_in_user),
        reasoning=template_class == "ReasoningTemplate",
        special_tokens=_string_list(entry, "special_tokens", name),
    )


def load_templates(path: str | Path | None = None) -> dict[str, PromptTemplate]:
    """All templates of a templates.json file, by name."""
    path = Path(path) if path else DEFAULT_TEMPLATES_PATH
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except FileNotFoundError:
        raise TemplateError(f"prompt_type_path: no templates file at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"prompt_type_path: cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise TemplateError(f"prompt_type_path: {path} is not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise TemplateError(f"{path}: expected a JSON list of templates")
    templates: dict[str, PromptTemplate] = {}
    for entry in entries:
        try:
            template = parse_template(entry)
        except TemplateError as exc:
            raise TemplateError(f"{path}: {exc}") from None
        if template.name in templates:
            raise TemplateError(f"{path}: template {template.name!r} defined twice")
        templates[template.name] = template
    return templates


def get_template(name: str, path: str | Path | None = None) -> PromptTemplate:
    """The template called ``name``; an unknown name lists the known ones, nearest first."""
    templates = load_templates(path)
    if name not in templates:
        hint = difflib.get_close_matches(name, list(templates), n=1, cutoff=0.5)
        raise UnknownTemplateError(
            f"unknown prompt_type {name!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; available: {', '.join(sorted(templates))}"
        )
    return templates[name]


def check_tokenizer(template: PromptTemplate, tokenizer: Any) -> None:
    """``TemplateError`` naming the first token ``template`` needs that ``tokenizer`` lacks.

    Checked once before any row is rendered: a marker missing from the vocabulary would be
    split into ordinary tokens, giving prompts the model was never trained on.
    """
    if template.use_tokenizer_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"prompt_type {template.name!r} uses the tokenizer's chat template, but the "
                "tokenizer has none; pick a template from templates.json instead"
            )
        return
    for attr in template.required_token_names():
        token = getattr(tokenizer, attr, None)
        if not isinstance(token, str) or not token:
            raise TemplateError(
                f"prompt_type {template.name!r} needs the tokenizer's {attr}, which this "
                "tokenizer does not define; use a template made for this model"
            )
    for token in template.required_tokens():
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise TemplateError(
                f"prompt_type {template.name!r} needs the special token {token!r}, which this "
                f"tokenizer lacks (it would be split into {len(ids)} ordinary tokens); use a "
                "template made for this model"
            )


def _render_slots(slots: Sequence[Slot], content: str, tokenizer: Any, name: str) -> str:
    parts: list[str] = []
    for slot in slots:
        if isinstance(slot, str):
            parts.append(slot.replace(_CONTENT, content))
            continue
        for token_name in slot:
            token = getattr(tokenizer, token_name, None) if tokenizer is not None else None
            if not isinstance(token, str) or not token:
                raise TemplateError(
                    f"prompt_type {name!r} needs the tokenizer's {token_name}, which "
                    + ("no tokenizer was given" if tokenizer is None else "this tokenizer lacks")
                )
            parts.append(token)
    return "".join(parts)


def render_prompt(
    template: PromptTemplate,
    question: str,
    system: str | None = None,
    tokenizer: Any = None,
    enable_thinking: bool = False,
) -> str:
    """The prompt text for one question, as MindSpeed-RL encodes a single turn.

    ``system=None`` uses the template's default system; ``system=""`` drops the system turn.
    Chat-template mode needs the tokenizer and ends with the generation prompt. A reasoning
    template (qwen3) ends with an empty think block unless ``enable_thinking``.
    """
    system_text = template.default_system if system is None else system
    if template.use_tokenizer_chat_template:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"template {template.name!r} uses the tokenizer's chat template, "
                "but the tokenizer has none"
            )
        messages = []
        if system_text:
            messages.append({"role": "system", "content": system_text})
        messages.append({"role": "user", "content": question})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, not str")
        return text
    name = template.name
    system_part = ""
    if system_text:  # without format_system, MindSpeed-RL writes the system text as is
        system_part = _render_slots(
            template.system_slots or (_CONTENT,), system_text, tokenizer, name
        )
    text = _render_slots(template.prefix_slots, "", tokenizer, name)
    if template.system_in_user:
        text += _render_slots(template.user_slots, system_part + question, tokenizer, name)
    else:
        text += system_part + _render_slots(template.user_slots, question, tokenizer, name)
    if template.reasoning and not enable_thinking:
        text += f"{THOUGHT_WORDS[0]}\n\n{THOUGHT_WORDS[1]}\n\n"
    return text
