"""What runs on a Ray node for the doctor: what a worker there sees (devices, memory), and the
save folder as that node names it. Plain functions; `ray_session` ships them as Ray tasks."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

MARKER_DIR = ".mindrl-doctor"


def node_folder(folder: str) -> Path:
    """The folder as a process on this node resolves it: `~` and environment variables are
    expanded here, so a path that means another disk on each node shows up as one."""
    return Path(os.path.expandvars(os.path.expanduser(folder))).absolute()


def worker_view(accelerator: str, visible_env: str | None) -> dict[str, Any]:
    """Host, visible-devices value, device count and free memory as this worker sees them.

    On a device worker the free memory is the device's (`mem_get_info`); on CPU, the host's
    available memory."""
    import psutil

    view: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "visible": os.environ.get(visible_env) if visible_env else None,
        "available_host_bytes": float(psutil.virtual_memory().available),
    }
    if accelerator == "cpu":
        view.update(devices=0, free_bytes=view["available_host_bytes"], total_bytes=None)
        return view
    import torch

    if accelerator == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
    module = getattr(torch, accelerator)
    count = int(module.device_count())
    view["devices"] = count
    if count:
        free, total = module.mem_get_info(0)
        view.update(free_bytes=float(free), total_bytes=float(total))
    else:
        view.update(free_bytes=0.0, total_bytes=0.0)
    return view


def write_marker(folder: str, token: str) -> dict[str, Any]:
    """Write `token` into the folder as this node resolves it; returns where it went."""
    target = node_folder(folder) / MARKER_DIR
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{token}.txt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(token)
    os.replace(tmp, path)
    return {"host": socket.gethostname(), "path": str(path)}


def read_marker(folder: str, token: str) -> dict[str, Any]:
    """Read the marker back on this node: the path it resolved and whether it holds `token`."""
    path = node_folder(folder) / MARKER_DIR / f"{token}.txt"
    try:
        seen = path.read_text()
    except OSError as exc:
        return {"host": socket.gethostname(), "path": str(path), "ok": False, "error": str(exc)}
    return {"host": socket.gethostname(), "path": str(path), "ok": seen == token, "error": ""}


def remove_marker(folder: str, token: str) -> None:
    path = node_folder(folder) / MARKER_DIR / f"{token}.txt"
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # only when no other marker is left
    except OSError:
        pass


def free_port() -> int:
    """A port free on this node now (for a rendezvous this node hosts)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])
