"""The embedded sandbox stops hostile code and keeps serving: a real server on 127.0.0.1.

One server for the module (``max_concurrent`` 2), run twice: with the user / network / pid
namespaces, and without them (as on a machine that refuses user namespaces: Landlock, the
rlimits and the cgroup alone); every case is an HTTP ``/run_code`` call as
SandboxFusion's clients make it, then the same server runs ``print(6 * 7)``. Each limit is
checked by what the code sees (the error it gets) and by what the host sees (no file outside
the run's directory, the run's directory gone, the run ended within its timeout).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mindrl.tools.http_service import ServiceError, post_json
from mindrl.tools.sandbox_server import SandboxLimits, SandboxServer

MEMORY_MB = 256
RUN_TIMEOUT = 4.0


@pytest.fixture(scope="module", params=[True, False], ids=["namespaces", "no-namespaces"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[SandboxServer]:
    """The full sandbox, and the one a machine that refuses user namespaces gets."""
    limits = SandboxLimits(
        default_memory_mb=MEMORY_MB,
        max_processes=16,
        max_output_bytes=4096,
        max_concurrent=2,
        namespaces=request.param,
    )
    server = SandboxServer(limits).start()
    yield server
    server.stop()


def run(
    sandbox: SandboxServer, code: str, timeout: float = RUN_TIMEOUT, stdin: str | None = None
) -> dict[str, Any]:
    request = {"code": code, "language": "python", "run_timeout": timeout, "stdin": stdin}
    answer = post_json(sandbox.url, request, timeout=timeout + 30)
    assert set(answer) >= {"status", "run_result", "compile_result"}
    return answer


def still_serving(sandbox: SandboxServer) -> None:
    answer = run(sandbox, "print(6 * 7)")
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n"


def test_plain_code_runs_in_a_private_directory_that_is_removed(sandbox: SandboxServer) -> None:
    answer = run(
        sandbox,
        "import os, sys\nopen('out.txt', 'w').write('ok')\nprint(os.getcwd())\nprint(sys.stdin.read())",
        stdin="from stdin",
    )
    result = answer["run_result"]
    assert answer["status"] == "Success", result
    assert result["status"] == "Finished" and result["return_code"] == 0
    cwd, echoed = result["stdout"].splitlines()
    assert echoed == "from stdin"
    workdir = Path(cwd)
    assert workdir.name.startswith("mindrl-sandbox-") and not workdir.exists()


def test_a_network_connection_is_refused(sandbox: SandboxServer) -> None:
    if not sandbox.isolation["tcp_denied"]:
        pytest.skip(f"this machine grants no network isolation: {sandbox.isolation}")
    with socket.socket() as listener:  # a port the code would reach without isolation
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        answer = run(
            sandbox,
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "print('connected')",
        )
    result = answer["run_result"]
    assert answer["status"] == "Failed" and "connected" not in result["stdout"]
    assert "Error" in result["stderr"], result
    if sandbox.isolation["network_isolated"]:
        host_ns = Path("/proc/self/ns/net").resolve().name
        seen = run(sandbox, "import os\nprint(os.readlink('/proc/self/ns/net'))")
        assert seen["run_result"]["stdout"].strip() not in ("", host_ns)
    still_serving(sandbox)


def test_a_write_outside_its_directory_is_refused(sandbox: SandboxServer, tmp_path: Path) -> None:
    if not sandbox.isolation["writes_confined"]:
        pytest.skip(f"this machine has no Landlock: {sandbox.isolation}")
    target = tmp_path / "escaped.txt"
    answer = run(sandbox, f"open({str(target)!r}, 'w').write('x')")
    assert answer["status"] == "Failed"
    assert "PermissionError" in answer["run_result"]["stderr"]
    assert not target.exists()
    still_serving(sandbox)


def test_forking_without_bound_is_stopped(sandbox: SandboxServer) -> None:
    if sandbox.isolation["process_limit"] == "none":
        pytest.skip(f"this machine gives root no pids cgroup: {sandbox.isolation}")
    answer = run(
        sandbox,
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        children += 1\n"
        "except OSError as exc:\n"
        "    print('stopped after', children, exc.errno)\n",
    )
    result = answer["run_result"]
    assert result["status"] == "Finished", result  # the sleeping children died with the run
    words = result["stdout"].split()
    assert words[:2] == ["stopped", "after"] and int(words[2]) < 16, result
    still_serving(sandbox)


def test_allocating_past_the_memory_limit_is_stopped(sandbox: SandboxServer) -> None:
    answer = run(sandbox, f"block = bytearray({2 * MEMORY_MB} * 1024 * 1024)\nprint('allocated')")
    result = answer["run_result"]
    assert answer["status"] == "Failed" and "allocated" not in result["stdout"]
    assert "MemoryError" in result["stderr"], result
    still_serving(sandbox)


def test_running_forever_is_stopped_at_the_timeout(sandbox: SandboxServer) -> None:
    started = time.monotonic()
    answer = run(sandbox, "while True:\n    pass", timeout=2)
    assert answer["status"] == "Failed"
    assert answer["run_result"]["status"] == "TimeLimitExceeded"
    assert time.monotonic() - started < 2 + 20  # the run's limit, plus start-up under load
    still_serving(sandbox)


def test_flooding_output_is_cut_at_the_limit(sandbox: SandboxServer) -> None:
    answer = run(sandbox, "while True:\n    print('x' * 1000)")
    result = answer["run_result"]
    assert len(result["stdout"]) <= 4096
    assert "output past 4096 bytes" in result["stderr"]
    still_serving(sandbox)


def test_an_unsupported_language_or_a_bad_request_is_answered(sandbox: SandboxServer) -> None:
    answer = post_json(sandbox.url, {"code": "console.log(1)", "language": "nodejs"}, timeout=30)
    assert answer["status"] == "SandboxError" and "python only" in answer["message"]
    with pytest.raises(ServiceError, match="HTTP 422"):
        post_json(sandbox.url, {"code": "print(1)", "run_timeout": "soon"}, timeout=30)
    still_serving(sandbox)
