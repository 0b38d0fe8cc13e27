"""The repository's import graph keeps the layering docs/architecture.md describes.

Built from source with `ast`, so it sees every import whatever its depth (inside functions,
`if TYPE_CHECKING:` blocks, try/except) and `importlib.import_module("mindrl...")` string
literals: a circle hidden in a function body is still a circle between two modules. Every
Python file of mindrl/, cli/, tools/ and tests/ is a module named by its path from the repo
root (`tools/bench/lora.py` is `tools.bench.lora`); a script's import of a file beside it
(`from _actor_setup import ...`, its folder being on sys.path) names that sibling.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mindrl"
ROOTS = ("mindrl", "cli", "tools", "tests")
SIZED = ("mindrl", "cli", "tools")  # the code; a test file grows with its cases
LOOK_AT_LINES = 600
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {
    _module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))
}


def _absolute(node: ast.ImportFrom, module: str) -> str:
    """The absolute module named by a (possibly relative) `from X import ...`."""
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_import_module(func: ast.expr) -> bool:
    """`importlib.import_module(...)` or a bare `import_module(...)`."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id == "import_module"


def _imported(module: str) -> Iterator[str]:
    """Every module name `module` imports, at any depth."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield sub if sub in MODULES else source
        elif (
            isinstance(node, ast.Call)
            and _is_import_module(node.func)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def _resolve(name: str, module: str) -> str | None:
    """The repository module `name` means in `module`: itself, the module holding an
    imported name (`mindrl.a.b.C` -> `mindrl.a.b`), or a sibling file of a script."""
    # `import mindrl.a.b.C`-style names that are not modules point at their module
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    if name in MODULES:
        return name
    sibling = f"{module.rsplit('.', 1)[0]}.{name}"
    return sibling if MODULES[module].name != "__init__.py" and sibling in MODULES else None


def _graph() -> dict[str, set[str]]:
    """Repository module -> the repository modules it imports (self-references dropped)."""
    graph = {}
    for module in MODULES:
        targets = set()
        for name in _imported(module):
            target = _resolve(name, module)
            if target is not None and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


GRAPH = _graph()


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative DFS, colours)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_graph_sees_the_package():
    assert "mindrl.config.compose" in GRAPH
    assert "mindrl.config.errors" in GRAPH["mindrl.config.compose"]


def test_graph_sees_the_whole_repository():
    assert "tools.bench.training_run" in GRAPH["tools.bench.variants"]
    assert "mindrl.trainer.entry" in GRAPH["cli.train_grpo"]
    assert "tests.fresh_process" in GRAPH["tests.integration._critic_rank"]
    # a script's sibling, imported with the script's folder on sys.path
    assert "tests.integration._actor_setup" in GRAPH["tests.integration._actor_on_policy"]


def test_cycle_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_workers_never_import_trainer():
    bad = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _in(module, "mindrl.workers")
        for target in sorted(targets)
        if _in(target, "mindrl.trainer")
    ]
    assert not bad, "workers import trainer: " + ", ".join(bad)


def test_algorithms_import_only_algorithms():
    bad = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _in(module, "mindrl.algorithms")
        for target in sorted(targets)
        if not _in(target, "mindrl.algorithms")
    ]
    assert not bad, "algorithms import outside mindrl.algorithms: " + ", ".join(bad)


def test_modules_stay_small():
    """Files are split by idea, not by size: a file past ~LOOK_AT_LINES lines is worth a look
    (does it hold two ideas?); only one past MAX_LINES fails."""
    sizes = {
        m: len(p.read_text().splitlines())
        for m, p in MODULES.items()
        if any(_in(m, root) for root in SIZED)
    }
    over = sorted(((n, m) for m, n in sizes.items() if n > MAX_LINES), reverse=True)
    assert not over, (
        f"modules over {MAX_LINES} lines: "
        + ", ".join(f"{m} ({n})" for n, m in over)
        + f"; files are split by idea: one past ~{LOOK_AT_LINES} lines is worth a look for "
        "an idea of its own to move out (not a cut by size)"
    )
