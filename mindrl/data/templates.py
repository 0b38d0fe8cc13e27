"""Prompt templates: data in ``configs/model/templates.json``, rendered here.

The JSON keeps MindSpeed-RL's shape (a list of ``{"name", "format_user": {"slots": [...]},
"format_system": {...}, "format_prefix": {...}, "default_system", "stop_words"}``) so users
can bring their own templates. A slot is either a string with ``{{content}}`` as the
placeholder (braces such as ``\\boxed{}`` stay literal) or a list of special-token names
(``["bos_token"]``) that are looked up on the tokenizer. A template with
``"use_tokenizer_chat_template": true`` defers to the tokenizer's own chat template.
"""

from __future__ import annotations

import difflib
import json
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
    "template_class",
}

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
        return out


def _slot_to_json(slot: Slot) -> str | list[str]:
    return slot if isinstance(slot, str) else list(slot)


def _parse_slots(entry: dict[str, Any], field: str, template_name: str) -> tuple[Slot, ...]:
    block = entry.get(field)
    if block is None:
        return ()
    if not isinstance(block, dict) or not isinstance(block.get("slots"), list):
        raise ValueError(f"template {template_name!r}: {field} must be {{'slots': [...]}}")
    slots: list[Slot] = []
    for slot in block["slots"]:
        if isinstance(slot, str):
            slots.append(slot)
        elif isinstance(slot, list) and all(isinstance(s, str) for s in slot):
            slots.append(tuple(slot))
        else:
            raise ValueError(
                f"template {template_name!r}: {field} slot must be a string or a list of "
                f"special-token names, got {slot!r}"
            )
    return tuple(slots)


def parse_template(entry: dict[str, Any]) -> PromptTemplate:
    """Build a template from one JSON entry; unknown fields are errors (typos matter here)."""
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"template entry without a name: {entry!r}")
    unknown = set(entry) - _KNOWN_FIELDS - _IGNORED_FIELDS
    if unknown:
        key = sorted(unknown)[0]
        hint = difflib.get_close_matches(key, sorted(_KNOWN_FIELDS | _IGNORED_FIELDS), n=1)
        raise ValueError(
            f"template {name!r}: unknown field {key!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
        )
    use_chat = bool(entry.get("use_tokenizer_chat_template", False))
    user_slots = _parse_slots(entry, "format_user", name)
    if not use_chat and not user_slots:
        raise ValueError(f"template {name!r}: needs format_user or use_tokenizer_chat_template")
    return PromptTemplate(
        name=name,
        user_slots=user_slots or (_CONTENT,),
        system_slots=_parse_slots(entry, "format_system", name),
        prefix_slots=_parse_slots(entry, "format_prefix", name),
        default_system=str(entry.get("default_system") or ""),
        stop_words=tuple(entry.get("stop_words") or ()),
        use_tokenizer_chat_template=use_chat,
        description=str(entry.get("description") or ""),
    )


def load_templates(path: str | Path | None = None) -> dict[str, PromptTemplate]:
    """All templates of a templates.json file, by name."""
    path = Path(path) if path else DEFAULT_TEMPLATES_PATH
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list of templates")
    templates: dict[str, PromptTemplate] = {}
    for entry in entries:
        template = parse_template(entry)
        if template.name in templates:
            raise ValueError(f"{path}: template {template.name!r} defined twice")
        templates[template.name] = template
    return templates


def get_template(name: str, path: str | Path | None = None) -> PromptTemplate:
    """The template called ``name``; an unknown name lists the nearest ones."""
    templates = load_templates(path)
    if name not in templates:
        hint = difflib.get_close_matches(name, list(templates), n=1)
        raise KeyError(
            f"unknown prompt_type {name!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; available: {', '.join(sorted(templates))}"
        )
    return templates[name]


def _render_slots(slots: Sequence[Slot], content: str, tokenizer: Any) -> str:
    parts: list[str] = []
    for slot in slots:
        if isinstance(slot, str):
            parts.append(slot.replace(_CONTENT, content))
            continue
        for token_name in slot:
            token = getattr(tokenizer, token_name, None) if tokenizer is not None else None
            if not isinstance(token, str) or not token:
                raise ValueError(f"template needs the tokenizer's {token_name}, which it lacks")
            parts.append(token)
    return "".join(parts)


def render_prompt(
    template: PromptTemplate,
    question: str,
    system: str | None = None,
    tokenizer: Any = None,
) -> str:
    """The prompt text for one question: prefix, system turn (if any), user turn.

    ``system=None`` uses the template's default system; ``system=""`` drops the system turn.
    Chat-template mode needs the tokenizer and ends with the generation prompt.
    """
    system_text = template.default_system if system is None else system
    if template.use_tokenizer_chat_template:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
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
    text = _render_slots(template.prefix_slots, "", tokenizer)
    if system_text and template.system_slots:
        text += _render_slots(template.system_slots, system_text, tokenizer)
    return text + _render_slots(template.user_slots, question, tokenizer)
