"""What happens to each config key: every key mindrl accepts has exactly one fate.

MindSpeed-RL users' YAML files must run unchanged, so mindrl accepts every key of
MindSpeed-RL's config classes. Accepting a key and then ignoring it would silently change the
run, so each field declares (in `spec(fate=...)`) what becomes of it:

* honoured (the default): code outside `mindrl/config` reads it (tests/unit/test_key_fates.py
  checks); `honoured(via="RoleConfig.num_devices")` when the config builder carries it into
  another field that is read;
* `handed(MINDSPEED, ...)`: mindrl does not implement it but passes the value to what does on
  that backend (MindSpeed's megatron adaptor, the HCCL environment, vllm-ascend); on any other
  backend a value other than the default is warned once as having no effect there, or, with
  `elsewhere`, mindrl honours it there itself (MindSpeed's fused kernels: mindrl's compiled
  ones on CPU / GPU);
* `no_effect(reason)`: accepted, and a value other than the default is warned once (logging
  cadence, dispatch sizes, TransferDock tuning, memory/speed switches of a path mindrl does
  not take). The result of the run does not depend on it;
* `refused(reason)`: a value other than the default (or outside `allowed`) is a config error
  naming the feature that is not built yet.

The builder (`fields.py`) applies refusals and no-effect warnings as it reads the YAML;
`handoffs(config, backend)` collects the handed values once the backend is known.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

logger = logging.getLogger("mindrl.config")

BACKENDS = ("npu", "cuda", "cpu")


@dataclass(frozen=True)
class Target:
    """Where a handed key goes on one backend. `env` targets take string values."""

    name: str
    backend: str
    where: str
    env: bool = False


MINDSPEED = Target("mindspeed", "npu", "MindSpeed's megatron adaptor")
VLLM_ASCEND = Target("vllm_ascend", "npu", "vllm-ascend (additional_config)")
HCCL_ENV = Target("hccl_env", "npu", "the HCCL environment", env=True)
TORCH_NPU_PROFILER = Target("torch_npu_profiler", "npu", "torch_npu's profiler")
TARGETS = (MINDSPEED, VLLM_ASCEND, HCCL_ENV, TORCH_NPU_PROFILER)


@dataclass(frozen=True)
class Fate:
    """What becomes of a key; declared with `spec(fate=...)` (none: honoured)."""

    kind: ClassVar[str] = ""


@dataclass(frozen=True)
class Honoured(Fate):
    """Read by mindrl (directly, or through `via`, the field the builder carries it into)."""

    kind: ClassVar[str] = "honoured"
    via: str = ""


@dataclass(frozen=True)
class Handed(Fate):
    """Passed as `name` (default: the key) to each target on that target's backend."""

    kind: ClassVar[str] = "handed"
    to: tuple[Target, ...] = ()
    name: str | None = None
    cpu_refusal: str = ""  # set: a value other than the default is refused on CPU, with this
    elsewhere: str = ""  # set: mindrl honours it (so) on the backends without a target

    def on(self, backend: str) -> tuple[Target, ...]:
        return tuple(t for t in self.to if t.backend == backend)

    def honoured_on(self, backend: str) -> bool:
        """True where the value acts: handed to a target there, or honoured by mindrl."""
        return bool(self.on(backend)) or bool(self.elsewhere)

    def describe(self) -> str:
        return "; ".join(f"handed to {t.where} on {t.backend}" for t in self.to)


@dataclass(frozen=True)
class NoEffect(Fate):
    kind: ClassVar[str] = "no_effect"
    reason: str = ""


@dataclass(frozen=True)
class Refused(Fate):
    """A value outside `allowed` (default: only the field's default) is an error; `reasons`
    gives a value its own reason (e.g. per MindSpeed-RL `stage`)."""

    kind: ClassVar[str] = "refused"
    reason: str = ""
    allowed: tuple[Any, ...] | None = None
    reasons: tuple[tuple[Any, str], ...] = ()

    def reason_for(self, value: Any) -> str:
        return dict(self.reasons).get(value, self.reason) if _hashable(value) else self.reason


HONOURED = Honoured()


def honoured(via: str = "") -> Honoured:
    return Honoured(via) if via else HONOURED


def handed(
    *to: Target, name: str | None = None, cpu_refusal: str = "", elsewhere: str = ""
) -> Handed:
    return Handed(tuple(to), name, cpu_refusal, elsewhere)


def no_effect(reason: str) -> NoEffect:
    return NoEffect(reason)


def refused(
    reason: str,
    *,
    allowed: tuple[Any, ...] | None = None,
    reasons: Mapping[Any, str] | None = None,
) -> Refused:
    return Refused(reason, allowed, tuple((reasons or {}).items()))


def shown(value: Any) -> str:
    """A value as the YAML spells it (true / null / [a, b])."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = (f"{f.name}: {shown(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return "{" + ", ".join(items) + "}"
    return str(value)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# -- per field ----------------------------------------------------------------------------------


def fate_of(f: dataclasses.Field) -> Fate:
    return f.metadata.get("fate") or HONOURED


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def is_default(f: dataclasses.Field, value: Any) -> bool:
    default = default_of(f)
    return default is not MISSING and value == default and type(value) is type(default)


def refusal(f: dataclasses.Field, value: Any) -> str | None:
    """The reason `value` is refused for field `f`, else None."""
    fate = fate_of(f)
    if not isinstance(fate, Refused):
        return None
    if fate.allowed is not None:
        return None if value in fate.allowed else fate.reason_for(value)
    return None if is_default(f, value) else fate.reason_for(value)


def apply_fate(f: dataclasses.Field, owner: type, value: Any, path: str) -> str | None:
    """At build time: the refusal message for `value`, or None (after warning a no-effect
    value once). Handed keys wait for `handoffs`, which knows the backend."""
    reason = refusal(f, value)
    if reason is not None:
        return f"{path}: {shown(value)} is refused: {reason}"
    fate = fate_of(f)
    if isinstance(fate, NoEffect) and not is_default(f, value):
        warn_once(
            f"{owner.__name__}.{f.name}",
            f"{path}: {shown(value)} has no effect in mindrl: {fate.reason}",
        )
    return None


# -- top-level sections mindrl has no group for ------------------------------------------------

SECTION_FATES: dict[str, Fate] = {
    "msprobe_config": NoEffect("msprobe accuracy dumps are not built"),
}


def section_fate(name: str, value: Any) -> str | None:
    """For a top-level section in `SECTION_FATES`: the refusal message, or None (after warning
    once when the section is not empty). The builder calls it before its unknown-section
    check."""
    fate = SECTION_FATES[name]
    if not value:
        return None
    if isinstance(fate, Refused):
        return f"{name}: {fate.reason}"
    if isinstance(fate, NoEffect):
        warn_once(f"section.{name}", f"{name}: has no effect in mindrl: {fate.reason}")
    return None


# -- once-only warnings -------------------------------------------------------------------------

_warned: dict[str, str] = {}  # key -> the message logged for it


def warn_once(key: str, message: str) -> bool:
    """Log `message` the first time `key` is seen in this process; True if it was logged."""
    if key in _warned:
        return False
    _warned[key] = message
    logger.warning(message)
    return True


def warned() -> dict[str, str]:
    """Every fate warning logged so far: key (Class.field) -> message."""
    return dict(_warned)


def reset_warnings() -> None:
    """Forget which keys were warned (tests; a process that builds a new run)."""
    _warned.clear()


# -- handed keys --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Handoffs:
    """The handed values for one backend: target name -> {name at the target: value}."""

    backend: str
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to(self, target: Target) -> dict[str, Any]:
        return dict(self.values.get(target.name, {}))

    def env(self) -> dict[str, str]:
        """Environment variables of every env target, as strings (booleans as 1 / 0)."""
        out: dict[str, str] = {}
        for t in TARGETS:
            if t.env:
                for k, v in self.values.get(t.name, {}).items():
                    out[k] = str(int(v)) if isinstance(v, bool) else str(v)
        return out


def handoffs(config: Any, backend: str) -> Handoffs:
    """Collect the handed values of `config` (a RunConfig or any part of it) for `backend`.

    A handed key is passed on its targets' backend whatever its value (as MindSpeed-RL passes
    every megatron argument); on a backend without a target, a value other than the default
    is warned once ("no effect on cpu"), or, for a key whose fate carries a `cpu_refusal`
    (MindSpeed's memory switches: nothing on CPU does what they promise), refused on CPU with
    that reason; a key mindrl honours `elsewhere` is neither (mindrl's code reads it).
    """
    from mindrl.config.errors import ConfigError

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    values: dict[str, dict[str, Any]] = {}
    refusals: list[str] = []
    for path, owner, f, value in walk(config):
        fate = fate_of(f)
        if not isinstance(fate, Handed):
            continue
        targets = fate.on(backend)
        for t in targets:
            values.setdefault(t.name, {}).setdefault(fate.name or f.name, value)
        if targets or fate.elsewhere or is_default(f, value):
            continue
        if backend == "cpu" and fate.cpu_refusal:
            refusals.append(f"{path}: {shown(value)} is refused on cpu: {fate.cpu_refusal}")
        else:
            warn_once(
                f"{owner.__name__}.{f.name}",
                f"{path}: {shown(value)} has no effect on {backend}: {fate.describe()}",
            )
    if refusals:
        raise ConfigError(refusals)
    return Handoffs(backend, values)


def walk(config: Any, path: str = "") -> Iterator[tuple[str, type, dataclasses.Field, Any]]:
    """(yaml path, owning class, field, value) of every key under `config`.

    Containers say how their groups appear in YAML: `KEY_SECTIONS` maps a field to its section
    (RunConfig.actor -> actor_config); a `FLAT_GROUPS` container (a role, rl_config) holds
    groups whose keys sit directly in its section. A container's other fields are not keys.
    """
    cls = type(config)
    sections: Mapping[str, str] = getattr(cls, "KEY_SECTIONS", {})
    flat = getattr(cls, "FLAT_GROUPS", False)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if sections or flat:
            if f.name in sections and value is not None:
                yield from walk(value, sections[f.name])
            elif flat and dataclasses.is_dataclass(value):
                yield from walk(value, path)
            continue
        sub = f"{path}.{f.name}" if path else f.name
        yield (sub, cls, f, value)
        if dataclasses.is_dataclass(value) and isinstance(fate_of(f), Honoured):
            yield from walk(value, sub)  # a fated mapping's own keys share its fate


def key_fields(cls: type, path: str = "") -> Iterator[tuple[str, type, dataclasses.Field]]:
    """(yaml path, owning class, field) of every key a config class accepts (as `walk`, from
    the classes: roles appear once per role section)."""
    hints = typing.get_type_hints(cls)
    sections: Mapping[str, str] = getattr(cls, "KEY_SECTIONS", {})
    flat = getattr(cls, "FLAT_GROUPS", False)
    for f in dataclasses.fields(cls):
        sub_cls = _dataclass_in(hints[f.name])
        if sections or flat:
            if f.name in sections and sub_cls is not None:
                yield from key_fields(sub_cls, sections[f.name])
            elif flat and sub_cls is not None:
                yield from key_fields(sub_cls, path)
            continue
        sub = f"{path}.{f.name}" if path else f.name
        yield (sub, cls, f)
        if sub_cls is not None and isinstance(fate_of(f), Honoured):
            yield from key_fields(sub_cls, sub)


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass in an annotation (`X`, `X | None`), else None."""
    for arg in typing.get_args(tp) or (tp,):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None
