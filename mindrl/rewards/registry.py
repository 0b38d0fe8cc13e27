"""Name -> verifier function registry used by `rl_config.verifier_function`.

Kept free of heavy imports so config validation can check verifier names before anything
starts. Built-in verifiers register themselves when `mindrl.rewards.builtin` is imported;
custom ones come from files listed in `rl_config.verifier_files`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

VerifierFn = Callable[..., float]

_REGISTRY: dict[str, VerifierFn] = {}
_BUILTINS_LOADED = False
_LOADED_FILES: list[Path] = []


def register_verifier(name: str) -> Callable[[VerifierFn], VerifierFn]:
    """Decorator: make `fn` selectable as `verifier_function: [name]`."""

    def wrap(fn: VerifierFn) -> VerifierFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"verifier {name!r} is already registered by {_REGISTRY[name]!r}")
        _REGISTRY[name] = fn
        return fn

    return wrap


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        try:
            importlib.import_module("mindrl.rewards.builtin")
        except ModuleNotFoundError as exc:  # built-ins not written yet in this checkout
            if exc.name != "mindrl.rewards.builtin":
                raise


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
    _load_builtins()  # a custom name that clashes with a built-in fails here, not later
    before = set(_REGISTRY)
    try:
        spec.loader.exec_module(module)
    except BaseException:  # undo, so that a fixed file can be loaded again
        del sys.modules[module_name]
        for name in set(_REGISTRY) - before:
            del _REGISTRY[name]
        raise
    _LOADED_FILES.append(path.resolve())


def loaded_verifier_files() -> list[Path]:
    """Files loaded so far, in order: scorer worker processes load the same ones."""
    return list(_LOADED_FILES)


def verifier_names() -> list[str]:
    """All registered verifier names, built-ins included."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_verifier(name: str) -> VerifierFn:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; registered: {sorted(_REGISTRY)}") from None
