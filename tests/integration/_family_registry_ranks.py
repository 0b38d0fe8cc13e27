"""One rank of test_family_registry's TP=2 launch: a fresh process knows only mindrl's own
families, so it registers the test's Mistral first, then runs `_mp_worker`'s steps."""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main


def main(spec: dict[str, Any]) -> dict[str, Any]:
    from mindrl.families import register_family
    from tests.integration import _mp_worker
    from tests.integration.test_family_registry import MISTRAL

    register_family(MISTRAL)
    return _mp_worker.main(spec)


if __name__ == "__main__":
    json_main(main)
