"""sympy's `parse_expr` on model output, without letting the output run Python.

The graders MindSpeed-RL's verifiers follow parse answers with `sympy.parse_expr`, which
`eval`s the text with Python's builtins in scope: a response holding `eval(chr(111)...)`
would run. Here the same parser runs with no builtins, names outside a list of math
functions become plain symbols (as any unknown name does in sympy), and text with attribute
access, dunders or quotes is refused before parsing. Runaway arithmetic (`9**9**9**9`) is
left to the verifier pool's per-call timeout.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_REFUSED = re.compile(r"__|['\"`\\]|\.\s*[A-Za-z_]|\blambda\b")
_MAX_LENGTH = 2000

# sympy names a math answer may use; everything else parses as a Symbol / Function.
_MATH_NAMES = (
    "sqrt cbrt root exp log ln sin cos tan cot sec csc asin acos atan acot sinh cosh tanh "
    "asinh acosh atanh pi E I oo zoo nan Abs floor ceiling factorial factorial2 binomial "
    "gamma re im Max Min Integer Float Rational Number Symbol Function Lambda Eq"
).split()


@functools.cache
def _global_dict() -> dict[str, Any]:
    import sympy

    names: dict[str, Any] = {name: getattr(sympy, name) for name in _MATH_NAMES}
    names["__builtins__"] = {}
    return names


def safe_parse_expr(text: str, implicit_multiplication: bool = False) -> Any:
    """`sympy.parse_expr(text)` with standard transformations (plus implicit multiplication
    and function application when asked); ValueError for text refused as unsafe."""
    from sympy.parsing import sympy_parser as sp

    if len(text) > _MAX_LENGTH or _REFUSED.search(text):
        raise ValueError(f"refused to parse {text[:60]!r}")
    transformations = sp.standard_transformations
    if implicit_multiplication:
        transformations = transformations + (sp.implicit_multiplication_application,)
    return sp.parse_expr(text, global_dict=dict(_global_dict()), transformations=transformations)
