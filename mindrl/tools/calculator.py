"""A calculator tool: arithmetic on integers and decimals, read with ``ast`` (never ``eval``).

Only number literals, ``+ - * / // % **``, unary signs and parentheses are accepted; exponents
and the size of every intermediate result are bounded, so no expression can take long or eat
memory. Named in a tool YAML as ``mindrl.tools.calculator.Calculator``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from mindrl.tools.base import Tool, ToolResult, ToolSchema

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 60  # of any intermediate integer

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}

SCHEMA = ToolSchema(
    name="calculator",
    description="Evaluates an arithmetic expression (+ - * / // % ** and parentheses).",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 123*(45+6)"}},
        "required": ["expression"],
    },
)


class CalculationError(ValueError):
    """An expression the calculator does not evaluate; the message is shown to the model."""


def _checked(value: Any) -> int | float:
    if isinstance(value, int) and len(str(abs(value))) > MAX_DIGITS:
        raise CalculationError(f"a result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and value != value:
        raise CalculationError("the result is not a number")
    return value


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculationError(f"exponents are limited to {MAX_EXPONENT}")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except (ZeroDivisionError, OverflowError) as exc:
            raise CalculationError(str(exc)) from exc
    raise CalculationError(
        f"only numbers and + - * / // % ** ( ) are allowed, not {ast.dump(node)[:60]}"
    )


def calculate(expression: str) -> str:
    """The value of ``expression`` as text (an integer when it is one)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expressions are limited to {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"not an arithmetic expression ({exc.msg})") from exc
    value = _evaluate(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


class Calculator(Tool):
    """The calculator as a tool; stateless, so one instance serves every sample."""

    def __init__(self, config: Mapping[str, Any] | None = None, schema: ToolSchema = SCHEMA):
        super().__init__(config or {}, schema)

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult("Error: expression must be a string.", error="bad_call")
        try:
            return ToolResult(calculate(expression))
        except CalculationError as exc:
            return ToolResult(f"Error: {exc}", error="error")
