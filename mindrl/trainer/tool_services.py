"""The services a multi-turn run's tools call (sandbox, retrieval): checked by the dry run,
stood in for on this machine by mindrl's embedded servers for the length of a real run.

The driver starts them, once, so every generating worker on this machine reaches the same
server at the URL the tool YAML names; a service that is down and not on loopback is named
before any worker starts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mindrl.config.run import RunConfig


def _tool_yaml(run: RunConfig) -> Path | None:
    from mindrl.config.multi_turn import tool_config_file

    mode = run.rl.rollout_mode
    if not mode.multi_turn_enable or not mode.tool_config_path:
        return None
    return Path(tool_config_file(mode.tool_config_path))


def tool_service_warnings(run: RunConfig) -> list[str]:
    """The dry run's lines for tool services that a real run could not reach or stand in for."""
    from mindrl.tools.local_servers import check_tool_services
    from mindrl.tools.registry import ToolConfigError, read_tool_config

    path = _tool_yaml(run)
    if path is None:
        return []
    try:  # an unreadable YAML is already a config error of its own
        entries = read_tool_config(path)
        return check_tool_services(entries, path.parent)
    except ToolConfigError:
        return []


@contextmanager
def tool_services(run: RunConfig) -> Iterator[None]:
    """Embedded servers for the tools whose loopback URL nothing answers, stopped on exit;
    `ToolServiceError` for a service that is down elsewhere."""
    path = _tool_yaml(run)
    if path is None:
        yield
        return
    from mindrl.tools.local_servers import ensure_local_servers
    from mindrl.tools.registry import read_tool_config

    with ensure_local_servers(read_tool_config(path), path.parent):
        yield
