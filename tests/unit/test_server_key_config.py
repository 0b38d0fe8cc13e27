"""`generate_config.server.api_key`: taken from the config or VLLM_API_KEY, and never shown:
not in the typed config's repr, the resolved YAML (printed by --dry-run, saved with the run,
handed to the trackers) nor a config error about it."""

from __future__ import annotations

import pytest

from mindrl.config import load_run_config
from mindrl.config.compose import resolved_yaml
from mindrl.config.errors import ConfigError
from mindrl.config.generate import RolloutServerConfig
from mindrl.config.secrets import REDACTED, redacted

KEY = "sk-mindrl-4c2b9e"
SERVER = ["+generate_config.server.host=127.0.0.1", "+generate_config.server.port=8000"]


def test_the_key_is_honoured_and_never_shown(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    run, raw = load_run_config("grpo_tiny_cpu", [*SERVER, f"+generate_config.server.api_key={KEY}"])
    server = run.generate.server
    assert server is not None and server.key() == KEY
    assert KEY not in repr(run) and KEY not in resolved_yaml(raw)
    assert f"api_key: {REDACTED}" in resolved_yaml(raw)
    assert raw["generate_config"]["server"]["api_key"] == KEY  # the run's own tree keeps it
    assert redacted({"a": [{"api_key": KEY}], "api_key": None}) == {
        "a": [{"api_key": REDACTED}],
        "api_key": None,
    }


def test_the_environment_gives_the_key_when_the_config_has_none(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert RolloutServerConfig(host="h").key() == KEY
    assert RolloutServerConfig(host="h", api_key="other").key() == "other"
    monkeypatch.delenv("VLLM_API_KEY")
    assert RolloutServerConfig(host="h").key() is None


def test_a_key_of_the_wrong_type_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as err:
        load_run_config("grpo_tiny_cpu", [*SERVER, "+generate_config.server.api_key=90210417"])
    assert "generate_config.server.api_key" in str(err.value)
    assert "90210417" not in str(err.value)


def test_the_dry_run_prints_no_key(capsys, monkeypatch):
    from mindrl.trainer.entry import main

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    args = ["--config-name", "grpo_tiny_cpu", "--dry-run"]
    code = main([*args, *SERVER, f"+generate_config.server.api_key={KEY}"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert KEY not in out.out + out.err and REDACTED in out.out


def test_a_weight_sync_port_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="weight_sync_port"):
        load_run_config(
            "grpo_tiny_cpu", [*SERVER, "+generate_config.server.weight_sync_port=70000"]
        )


def test_weight_sync_ports_past_the_last_port_are_refused():
    urls = "+generate_config.server.urls=[a:1,b:1,c:1]"
    with pytest.raises(ConfigError, match="past 65535"):
        load_run_config("grpo_tiny_cpu", [urls, "+generate_config.server.weight_sync_port=65534"])
    run, _ = load_run_config(
        "grpo_tiny_cpu", [urls, "+generate_config.server.weight_sync_port=65533"]
    )
    assert run.generate.server is not None and run.generate.server.weight_sync_port == 65533
