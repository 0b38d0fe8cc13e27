"""Name -> verifier function lookups used by `rl_config.verifier_function`.

Kept free of heavy imports so config validation can check verifier names before anything
starts. The built-in verifiers (`mindrl.rewards.builtin`) are registered on import; custom
ones come from files listed in `rl_config.verifier_files`, which call `register_verifier`
(importable from here, its home is `verifier_table`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from mindrl.rewards import builtin  # noqa: F401  (registers the built-in verifiers)
from mindrl.rewards.verifier_table import (
    UNSUPPORTED_VERIFIERS,
    VERIFIERS,
    VerifierFn,
    register_verifier,
)

__all__ = [
    "VerifierFn",
    "get_verifier",
    "load_verifier_file",
    "loaded_verifier_files",
    "register_verifier",
    "unsupported_verifier_reason",
    "verifier_names",
]

_LOADED_FILES: list[Path] = []


def load_verifier_file(path: str | Path) -> None:
    """Import a user file whose `@register_verifier` calls add custom verifiers."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"verifier file not found: {path}")
    module_name = f"mindrl_custom_verifier_{abs(hash(str(path.resolve())))}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    before = set(VERIFIERS)  # a custom name that clashes with a built-in fails while loading
    try:
        spec.loader.exec_module(module)
    except BaseException:  # undo, so that a fixed file can be loaded again
        del sys.modules[module_name]
        for name in set(VERIFIERS) - before:
            del VERIFIERS[name]
        raise
    _LOADED_FILES.append(path.resolve())


def loaded_verifier_files() -> list[Path]:
    """Files loaded so far, in order: scorer worker processes load the same ones."""
    return list(_LOADED_FILES)


def verifier_names() -> list[str]:
    """All registered verifier names, built-ins included."""
    return sorted(VERIFIERS)


def unsupported_verifier_reason(name: str) -> str | None:
    """Why a MindSpeed-RL verifier name is refused (None for any other name): the sentence
    reads after the quoted name ("'NAME' is ...")."""
    return None if name in VERIFIERS else UNSUPPORTED_VERIFIERS.get(name)


def get_verifier(name: str) -> VerifierFn:
    """The verifier registered as `name`; KeyError naming the registered ones otherwise."""
    try:
        return VERIFIERS[name]
    except KeyError:
        reason = unsupported_verifier_reason(name)
        if reason is not None:
            raise KeyError(f"verifier {name!r} {reason}") from None
        raise KeyError(f"unknown verifier {name!r}; registered: {sorted(VERIFIERS)}") from None
