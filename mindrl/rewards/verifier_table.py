"""The name -> verifier table and the decorator that fills it.

Its own module so `builtin` (which registers into the table) and `registry` (which serves
lookups and loads the built-ins) both import it rather than each other.
"""

from __future__ import annotations

from collections.abc import Callable

VerifierFn = Callable[..., float]

VERIFIERS: dict[str, VerifierFn] = {}

# MindSpeed-RL verifier names mindrl refuses, with the reason; a custom verifier file may
# still register one of these names with its own function.
UNSUPPORTED_VERIFIERS: dict[str, str] = {}


def register_verifier(name: str) -> Callable[[VerifierFn], VerifierFn]:
    """Decorator: make `fn` selectable as `verifier_function: [name]`."""

    def wrap(fn: VerifierFn) -> VerifierFn:
        if name in VERIFIERS and VERIFIERS[name] is not fn:
            raise ValueError(f"verifier {name!r} is already registered by {VERIFIERS[name]!r}")
        VERIFIERS[name] = fn
        return fn

    return wrap
