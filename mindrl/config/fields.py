"""Typed config fields and the generic flat-dict -> frozen-dataclass builder.

MindSpeed-RL's YAML sections are flat key/value maps (megatron argument names). mindrl keeps
those names but groups them by concern into small frozen dataclasses. `build_groups` takes a
flat map and distributes its keys to the groups by field name, so each key lives in exactly
one place; unknown keys, wrong types and out-of-range values become errors naming the full
key path, with the nearest valid name suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, TypeVar, Union

from mindrl.config.fates import Fate, apply_fate
from mindrl.config.secrets import SECRET_KEYS, hide_value

T = TypeVar("T")


def spec(
    default: Any = MISSING,
    *,
    help: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Collection[Any] | None = None,
    aliases: tuple[str, ...] = (),
    fate: Fate | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field with the range/choice rules the builder checks and its fate
    (`mindrl.config.fates`: honoured unless declared handed / no_effect / refused); a
    `secret` (its name in `secrets.SECRET_KEYS`) has no repr."""
    meta: dict[str, Any] = {
        "help": help,
        "ge": ge,
        "gt": gt,
        "le": le,
        "lt": lt,
        "choices": choices,
        "aliases": aliases,
    }
    if fate is not None:
        meta["fate"] = fate
    if default is MISSING:
        return field(metadata=meta, repr=not secret)
    return field(default=default, metadata=meta, repr=not secret)


@dataclass
class _Problems:
    items: list[str] = field(default_factory=list)

    def add(self, msg: str) -> None:
        self.items.append(msg)


def suggest(name: str, valid: typing.Iterable[str], cutoff: float = 0.6) -> str:
    """' (did you mean X?)' when a close valid name exists, else ''."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str, problems: _Problems) -> Any:
    """Check `value` against annotation `tp`; return the (possibly converted) value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _coerce(value, non_none[0], path, problems)
        for a in non_none:
            sub = _Problems()
            out = _coerce(value, a, path, sub)
            if not sub.items:
                return out
        problems.add(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            problems.add(f"{path}: expected a list, got {type(value).__name__} {value!r}")
            return value
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{path}[{i}]", problems) for i, v in enumerate(value))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            problems.add(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
            return value
        return build_dataclass(tp, value, path, problems)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.add(f"{path}: expected true/false, got {type(value).__name__} {value!r}")
        return value
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        problems.add(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out = float(value)
        elif isinstance(value, str):
            try:  # YAML 1.1 reads '5e-7' as a string
                out = float(value)
            except ValueError:
                problems.add(f"{path}: expected a number, got string {value!r}")
                return value
        else:
            problems.add(f"{path}: expected a number, got {type(value).__name__} {value!r}")
            return value
        if math.isnan(out):
            problems.add(f"{path}: expected a number, got NaN")
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        problems.add(f"{path}: expected a string, got {type(value).__name__} {value!r}")
        return value
    return value


def _check_range(value: Any, meta: Mapping[str, Any], path: str, problems: _Problems) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        problems.add(
            f"{path}: {value!r} is not one of {list(choices)}"
            + suggest(str(value), map(str, choices))
        )
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for key, ok, word in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        bound = meta.get(key)
        if bound is not None and not ok(value, bound):
            problems.add(f"{path}: {value!r} is out of range (must be {word} {bound})")


def field_names(cls: type) -> list[str]:
    """Field names plus their aliases: every key a user may write for `cls`."""
    names = []
    for f in dataclasses.fields(cls):
        if f.init:
            names.append(f.name)
            names.extend(f.metadata.get("aliases", ()))
    return names


def _alias_map(cls: type) -> dict[str, str]:
    out = {}
    for f in dataclasses.fields(cls):
        out[f.name] = f.name
        for a in f.metadata.get("aliases", ()):
            out[a] = f.name
    return out


def _build_fields(
    cls: type[Any],
    values: Mapping[str, Any],
    path_of: Callable[[str], str],
    problems: _Problems,
    injected: typing.Container[str] = (),
) -> dict[str, Any]:
    """Coerce and range-check each key, then apply its fate (keys in `injected` were set by
    mindrl itself, not the YAML, and have none). A value already reported is left out of
    the result, so the class's own checks (which may read the same range rules) do not
    report it a second time."""
    hints = typing.get_type_hints(cls)
    aliases = _alias_map(cls)
    kwargs: dict[str, Any] = {}
    reported: set[str] = set()
    for key, value in values.items():
        name = aliases[key]
        if name in kwargs:
            problems.add(f"{path_of(key)}: set twice (as '{name}' and as an alias of it)")
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        sub_path = path_of(key)
        before = len(problems.items)
        out = _coerce(value, hints[name], sub_path, problems)
        if len(problems.items) == before:
            _check_range(out, f.metadata, sub_path, problems)
        if name in SECRET_KEYS and value is not None:  # a wrong-typed key is not echoed
            problems.items[before:] = hide_value(problems.items[before:], value)
        if len(problems.items) > before:
            reported.add(name)
            continue
        if key not in injected:
            refused = apply_fate(f, cls, out, sub_path)
            if refused:
                problems.add(refused)
        kwargs[name] = out
    for f in dataclasses.fields(cls):
        if (
            f.init
            and f.name not in kwargs
            and f.name not in reported
            and f.default is MISSING
            and f.default_factory is MISSING
        ):
            problems.add(f"{path_of(f.name)}: required key is missing")
    return kwargs


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _spelled(key: Any, valid: typing.Container[str]) -> str:
    """MindSpeed-RL reads `min-lr` as `min_lr` (BaseConfig.update); so does mindrl."""
    key = str(key)
    if key in valid or "-" not in key:
        return key
    return key.replace("-", "_")


def build_dataclass(cls: type[T], values: Mapping[str, Any], path: str, problems: _Problems) -> T:
    """Build one dataclass from a map; unknown keys are reported against `path`."""
    valid = field_names(cls)
    known = {}
    for raw_key, value in values.items():
        key = _spelled(raw_key, valid)
        if key in known:
            problems.add(f"{_join(path, str(raw_key))}: set twice (as '{key}' and '{raw_key}')")
        if key in valid:
            known[key] = value
        else:
            problems.add(f"{_join(path, str(key))}: unknown key" + suggest(str(key), valid))
    kwargs = _build_fields(cls, known, lambda k: _join(path, k), problems)
    return _construct(cls, kwargs, path, problems)  # type: ignore[return-value]


def build_groups(
    groups: Mapping[str, type],
    values: Mapping[str, Any],
    path: str,
    problems: _Problems,
    origin: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Distribute one flat map over several group dataclasses by field name.

    `origin` maps a key to the section it came from (e.g. 'megatron_training'), so errors name
    the path the user actually wrote.
    """
    owner: dict[str, str] = {}
    for group, cls in groups.items():
        for name in field_names(cls):
            if name in owner:
                raise AssertionError(f"config key {name!r} is in both {owner[name]} and {group}")
            owner[name] = group
    per_group: dict[str, dict[str, Any]] = {g: {} for g in groups}
    where: dict[str, str] = {}  # key -> the section its value came from
    for raw_key, value in values.items():
        key = _spelled(raw_key, owner)
        section = (origin or {}).get(str(raw_key), path)
        key_path = _join(section, str(raw_key))
        if key not in owner:
            problems.add(f"{key_path}: unknown key" + suggest(str(key), owner))
            continue
        if key in per_group[owner[key]] and where.get(key) == section:
            problems.add(f"{key_path}: set twice (as '{key}' and '{raw_key}')")
        # a later section wins whatever the spelling (MindSpeed-RL applies them in order)
        where[key] = section
        per_group[owner[key]][key] = value
    # keys the caller added itself (not in `origin`) are not the YAML's: no fate applies
    injected = {k for k in values if origin is not None and str(k) not in origin}
    out: dict[str, Any] = {}
    for group, cls in groups.items():
        kwargs = _build_fields(
            cls, per_group[group], lambda k: _join(where.get(k, path), k), problems, injected
        )
        out[group] = _construct(cls, kwargs, path, problems)
    return out


def _construct(cls: type[T], kwargs: dict[str, Any], path: str, problems: _Problems) -> T | None:
    """cls(**kwargs); a dataclass's own cross-field check (ValueError) becomes a problem."""
    try:
        return cls(**kwargs)
    except TypeError:
        return None  # a missing or mistyped key, already reported
    except ValueError as exc:
        problems.add(f"{path}: {exc}")
        return None


def as_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dicts/lists, for printing and saving."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [as_dict(v) for v in obj]
    return obj
