"""The driver's tokenizer, without transformers' model stack in the driver.

The driver only decodes responses for the verifiers and reads the pad id. Importing
`AutoTokenizer` pulls in transformers' modelling machinery (its masking utilities import
torch._dynamo, inductor and sympy: resident memory in a process that never runs a model).
Which class `AutoTokenizer` picks depends on config.json, tokenizer_config.json and
transformers' own tables; rather than re-deriving that choice, a short-lived child process
asks `AutoTokenizer` and names the class, and the driver loads that class itself the way
`AutoTokenizer` would (`cls.from_pretrained(path)`). The child runs while Ray and the
workers start; the tokenizer is waited for at first use. Should the child fail, the driver
loads through `AutoTokenizer` itself, so the user sees transformers' own error.

`python -m mindrl.data.tokenizer PATH [--slow]` is the child: it prints the class as JSON.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger("mindrl.data")

# generous: a child importing transformers on a busy laptop is slow, and a timeout here only
# guards against a hung child
RESOLVE_TIMEOUT_S = 600.0


class TokenizerSource(Protocol):
    """Where the driver's tokenizer comes from: `get()` it, `close()` it."""

    def get(self) -> Any: ...

    def close(self) -> None: ...


def pad_id_of(tokenizer: Any) -> int:
    """The id prompts are padded with: the pad token, else end-of-sequence, else 0."""
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id or 0
    return int(pad_id)


def _load_with_auto(path: str, use_fast: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, use_fast=use_fast)


def _child_env() -> dict[str, str]:
    """This process's environment, with this mindrl importable (a checkout run through
    cli/train_grpo.py is on sys.path, not installed)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class DriverTokenizer:
    """The tokenizer of `path`, resolved in a child process, loaded at first `get()`."""

    def __init__(self, path: str, use_fast: bool, *, timeout_s: float = RESOLVE_TIMEOUT_S):
        self.path, self.use_fast, self.timeout_s = path, use_fast, timeout_s
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        command = [sys.executable, "-m", __name__, path] + ([] if use_fast else ["--slow"])
        self._child: subprocess.Popen[str] | None = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_child_env()
        )

    def get(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._load()
            return self._tokenizer

    def close(self) -> None:
        """End a child still resolving (a run that failed before its first step)."""
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.communicate()

    def _load(self) -> Any:
        cls = self._resolved_class()
        if cls is None:
            return _load_with_auto(self.path, self.use_fast)
        return cls.from_pretrained(self.path, _from_auto=True)

    def _resolved_class(self) -> type[Any] | None:
        child, self._child = self._child, None
        if child is None:  # closed before use, or a load that failed before
            return None
        try:
            out, _ = child.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            logger.warning(
                "tokenizer class lookup took over %.0f s; loading in the driver", self.timeout_s
            )
            return None
        if child.returncode != 0:
            return None  # _load_with_auto raises transformers' own error
        named = json.loads(out.strip().splitlines()[-1])
        return getattr(importlib.import_module(named["module"]), named["name"])


class LoadedTokenizer:
    """A tokenizer already in hand, behind the same `get()` (tests, tools)."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer

    def get(self) -> Any:
        return self._tokenizer

    def close(self) -> None:
        pass


def _child_main(argv: list[str]) -> int:
    path, use_fast = argv[0], "--slow" not in argv[1:]
    cls = type(_load_with_auto(path, use_fast))
    print(json.dumps({"module": cls.__module__, "name": cls.__qualname__}))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
