"""The one exception config problems raise: every message names the full key path."""

from __future__ import annotations


class ConfigError(ValueError):
    """One or more config problems, each naming the offending key path."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:  # one problem, one line
            super().__init__(f"invalid config: {self.problems[0]}")
            return
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config ({len(self.problems)} problem(s)):\n{lines}")
