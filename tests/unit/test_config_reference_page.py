"""The guide's configuration reference lists every key mindrl accepts, each with its fate.

The page is rendered from the fate declarations at every docs build (tools/docs); this checks
that the rendering leaves no key out and says what each refused key's reason is.
"""

from __future__ import annotations

from mindrl.config.fates import Refused, fate_of, key_fields
from mindrl.config.run import RunConfig
from tools.docs.config_reference import ROLE_SECTIONS, describe, key_rows, render


def test_every_accepted_key_is_on_the_page_once() -> None:
    expected = set()
    for path, _, _ in key_fields(RunConfig):
        section, _, key = path.partition(".")
        if section in ROLE_SECTIONS:
            expected.add(("role", key))
        elif path.startswith("profiler_config.integrated."):
            expected.add(
                ("profiler_config.integrated", path.removeprefix("profiler_config.integrated."))
            )
        else:
            expected.add((section, key))
    rows = key_rows()
    assert {(r.section, r.key) for r in rows} == expected
    assert len(rows) == len(expected)
    page = render()
    for row in rows:
        assert f"| `{row.key}` |" in page


def test_refused_keys_carry_their_reason() -> None:
    page = render()
    refused = [f for _, _, f in key_fields(RunConfig) if isinstance(fate_of(f), Refused)]
    assert refused
    for f in refused:
        word, reason = describe(fate_of(f))
        assert word == "refused" and reason
        assert " ".join(reason.split()).replace("|", "\\|").replace("<", "&lt;") in page
