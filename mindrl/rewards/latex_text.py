"""LaTeX math answers rendered as plain text, as the PRM800K grader sees them.

The grader behind MindSpeed-RL's `base_acc` / `math_17k_acc` / `acc_for_ppo` turns a LaTeX
answer into text with `pylatexenc` before sympy reads it. This renders the constructs math
answers use the same way, so `pylatexenc` is not needed: `\\frac{a}{b}` -> `a/b` (no
parentheses), `\\sqrt[n]{x}` -> `√(x)` (the index is dropped), symbols as Unicode, braces
and unknown macros dropped (their braced arguments stay), a letter macro swallows the spaces
after it.
"""

from __future__ import annotations

_GREEK = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega"
).split()
_SYMBOLS: dict[str, str] = {
    **{name: chr(0x3B1 + i + (i > 16)) for i, name in enumerate(_GREEK)},  # skips final sigma
    **{name.capitalize(): chr(0x391 + i + (i > 16)) for i, name in enumerate(_GREEK)},
    "varepsilon": "ε",
    "vartheta": "ϑ",
    "varphi": "φ",
    "infty": "∞",
    "cup": "∪",
    "cap": "∩",
    "cdot": "·",
    "times": "×",
    "div": "÷",
    "pm": "±",
    "mp": "∓",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "neq": "≠",
    "ne": "≠",
    "approx": "≈",
    "circ": "∘",
    "in": "∈",
    "to": "→",
    "emptyset": "∅",
    "varnothing": "∅",
    "ldots": "…",
    "dots": "…",
    "cdots": "⋯",
    "prime": "'",
    "quad": "  ",
    "qquad": "    ",
    "left": "",
    "right": "",
    **{name: name for name in "sin cos tan ln log exp max min inf sup lim".split()},
}
_CHAR_MACROS = {",": " ", ";": " ", ":": " ", " ": " ", "!": "", "\\": "\n"}
_TWO_ARGS = {"frac", "dfrac", "tfrac", "nicefrac", "textfrac"}


class _Renderer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def render(self, stop_at_brace: bool = False) -> str:
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "}":
                self.pos += 1
                if stop_at_brace:
                    break
            elif char == "{":
                self.pos += 1
                out.append(self.render(stop_at_brace=True))
            elif char == "\\":
                out.append(self._macro())
            else:
                self.pos += 1
                out.append("\xa0" if char == "~" else char)
        return "".join(out)

    def _argument(self) -> str:
        """A braced group or the next single token, after spaces."""
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1
        if self.pos >= len(self.text):
            return ""
        char = self.text[self.pos]
        if char == "{":
            self.pos += 1
            return self.render(stop_at_brace=True)
        if char == "\\":
            return self._macro()
        self.pos += 1
        return char

    def _macro(self) -> str:
        start = self.pos + 1
        end = start
        while end < len(self.text) and self.text[end].isalpha():
            end += 1
        if end == start:  # a one-character macro: \, \{ \% ...
            char = self.text[start : start + 1]
            self.pos = start + 1
            return _CHAR_MACROS.get(char, char)
        name = self.text[start:end]
        self.pos = end
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1
        if name in _TWO_ARGS:
            numerator = self._argument()
            return f"{numerator}/{self._argument()}"
        if name == "sqrt":
            if self.text.startswith("[", self.pos):
                close = self.text.find("]", self.pos)
                self.pos = close + 1 if close != -1 else len(self.text)
            return f"√({self._argument()})"
        if name in ("begin", "end"):
            self._argument()  # the environment name
            return ""
        return _SYMBOLS.get(name, "")


def latex_to_text(expr: str) -> str:
    """Plain-text form of a LaTeX answer, with the PRM800K grader's symbol replacements."""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # keeps mixed numbers apart: 7\frac34 -> 7 3/4
    text = _Renderer(expr).render()
    for symbol, plain in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*")):
        text = text.replace(symbol, plain)
    return text.replace("×", "*").strip()
