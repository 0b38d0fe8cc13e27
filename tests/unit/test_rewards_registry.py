"""Verifier registry: built-ins, custom files, failures that leave the registry clean."""

import pytest

from mindrl.rewards import registry
from mindrl.rewards.types import SampleMeta

CUSTOM = """
from mindrl.rewards.registry import register_verifier

@register_verifier("unit_custom_exact")
def exact(response, label, meta=None):
    return 1.0 if response.strip() == label.strip() else 0.0

@register_verifier("unit_custom_length")
def length(response, label, meta=None):
    return meta.response_length / meta.max_length
"""


def test_custom_file_registers_and_scores(tmp_path):
    path = tmp_path / "my_verifiers.py"
    path.write_text(CUSTOM)
    registry.load_verifier_file(path)
    registry.load_verifier_file(path)  # loading twice is a no-op, not a clash
    names = registry.verifier_names()
    assert {"unit_custom_exact", "unit_custom_length", "acc"} <= set(names)
    assert registry.get_verifier("unit_custom_exact")(" 42", "42") == 1.0
    meta = SampleMeta(response_length=30, max_length=120)
    assert registry.get_verifier("unit_custom_length")("x", "y", meta) == pytest.approx(0.25)
    assert path.resolve() in registry.loaded_verifier_files()


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(FileNotFoundError):
        registry.load_verifier_file(tmp_path / "absent.py")
    with pytest.raises(KeyError, match="unit_no_such_verifier"):
        registry.get_verifier("unit_no_such_verifier")


def test_failing_file_is_rolled_back_and_can_be_fixed(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(
        "from mindrl.rewards.registry import register_verifier\n"
        "register_verifier('unit_half_loaded')(lambda r, l, m=None: 1.0)\n"
        "raise RuntimeError('broken on purpose')\n"
    )
    with pytest.raises(RuntimeError, match="broken on purpose"):
        registry.load_verifier_file(path)
    assert "unit_half_loaded" not in registry.verifier_names()
    assert path.resolve() not in registry.loaded_verifier_files()
    path.write_text(
        "from mindrl.rewards.registry import register_verifier\n"
        "register_verifier('unit_half_loaded')(lambda r, l, m=None: 1.0)\n"
    )
    registry.load_verifier_file(path)
    assert registry.get_verifier("unit_half_loaded")("a", "b") == 1.0


def test_builtin_name_clash_is_an_error(tmp_path):
    path = tmp_path / "clash.py"
    path.write_text(
        "from mindrl.rewards.registry import register_verifier\n"
        "register_verifier('acc')(lambda r, l, m=None: 1.0)\n"
    )
    with pytest.raises(ValueError, match="already registered"):
        registry.load_verifier_file(path)
    assert registry.get_verifier("acc")(r"\boxed{2}", "3") == -0.5  # the built-in survived
