"""mindrl's embedded code sandbox: SandboxFusion's ``POST /run_code`` on 127.0.0.1, Python only.

For a laptop or a CPU test, where no SandboxFusion server runs. Each request runs in a separate
process started through ``sandbox_child.py`` (see there for the isolation it applies), in a
private temporary directory removed afterwards, with:

- a wall timeout (``run_timeout``) and ``RLIMIT_CPU``: the whole process group is killed;
- ``RLIMIT_AS`` = ``memory_limit_MB`` (the request's, else the server's default);
- ``RLIMIT_NPROC`` (counted per sandbox inside its user namespace) and ``RLIMIT_FSIZE``;
- an output limit per stream: past it the run is killed and the output kept so far returned;
- at most ``max_concurrent`` runs at once (later requests wait), so a flood of calls cannot
  fork the host to death.

What it does not isolate: reads (the code can read any file the mindrl user can read), CPU
and memory bandwidth shared with training, and, where the machine refuses user namespaces,
the network (Landlock then denies TCP only) and the process count (then counted over the
whole user); ``GET /health`` and the start-up log line say which layers this machine gave.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mindrl.tools.http_service import EmbeddedService

logger = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("sandbox_child.py")
MiB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    """The server's bounds; a request may lower the time and memory, never raise past these."""

    default_memory_mb: int = 1024
    max_memory_mb: int = 4096
    max_run_timeout_s: float = 300.0
    max_processes: int = 32
    max_output_bytes: int = 256 * 1024
    max_file_bytes: int = 64 * MiB
    max_concurrent: int = max(1, os.cpu_count() or 1)
    # False: no user / network / pid namespaces even where the machine allows them (Landlock,
    # the rlimits and the cgroup still apply), as on a machine that refuses them
    namespaces: bool = True


PIDS_CGROUP_V1 = Path("/sys/fs/cgroup/pids")


def pids_cgroup_root() -> Path | None:
    """Where a root server makes one pids cgroup per run (root ignores ``RLIMIT_NPROC``)."""
    if os.getuid() != 0:
        return None
    if (PIDS_CGROUP_V1 / "cgroup.procs").is_file() and os.access(PIDS_CGROUP_V1, os.W_OK):
        return PIDS_CGROUP_V1
    return None


def _process_limit() -> str:
    if os.getuid() != 0:
        return "RLIMIT_NPROC"
    return "pids cgroup" if pids_cgroup_root() is not None else "none"


def probe_isolation(namespaces: bool = True) -> dict[str, Any]:
    """Which isolation layers a sandboxed process gets here (namespaces, Landlock)."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(CHILD), "--probe"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = {"namespaces": [], "landlock_abi": 0, "probe_error": result.stderr[-500:]}
    if not namespaces:
        found["namespaces"] = []
    found["network_isolated"] = "net" in found["namespaces"]
    found["tcp_denied"] = found["network_isolated"] or found["landlock_abi"] >= 4
    found["writes_confined"] = found["landlock_abi"] >= 1
    found["process_limit"] = _process_limit()
    return dict(found)


class _CappedReader(threading.Thread):
    """Reads one pipe until EOF, keeping at most ``cap`` bytes; ``on_overflow`` once past it."""

    def __init__(self, pipe: IO[bytes], cap: int, on_overflow: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.pipe, self.cap, self.on_overflow = pipe, cap, on_overflow
        self.data = bytearray()
        self.overflowed = False

    def run(self) -> None:
        try:
            while chunk := os.read(self.pipe.fileno(), 65536):
                room = self.cap - len(self.data)
                self.data += chunk[: max(room, 0)]
                if len(chunk) > room and not self.overflowed:
                    self.overflowed = True
                    self.on_overflow()
        except (OSError, ValueError):
            return


def _remove_tree(path: str) -> None:
    def make_writable(func: Any, target: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(target) or target, 0o700)
        if os.path.isdir(target):
            os.chmod(target, 0o700)
        func(target)

    shutil.rmtree(path, onerror=make_writable)


def _remove_cgroup(cgroup: Path) -> None:
    """Kill what is left in the run's cgroup, then remove it."""
    for _ in range(50):
        try:
            pids = (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.05)
    logger.warning("embedded sandbox: could not remove %s", cgroup)


@dataclass
class SandboxServer(EmbeddedService):
    """The ``/run_code`` service; ``start()`` binds 127.0.0.1 (``port`` 0: a free one)."""

    path = "/run_code"
    what = "sandbox"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    port: int = 0
    isolation: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent)

    def start(self) -> SandboxServer:
        self.isolation = probe_isolation(self.limits.namespaces)
        missing = [
            what
            for what, ok in (
                (
                    "network namespace (only TCP is denied, by Landlock)",
                    self.isolation["network_isolated"],
                ),
                ("any network block", self.isolation["tcp_denied"]),
                (
                    "Landlock (writes are not confined to the run's directory)",
                    self.isolation["writes_confined"],
                ),
                (
                    "process-count limit (root without a writable pids cgroup)",
                    self.isolation["process_limit"] != "none",
                ),
            )
            if not ok
        ]
        if missing:
            logger.warning("embedded sandbox: this machine gives no %s", "; no ".join(missing))
        self.serve({"service": "mindrl sandbox", "languages": ["python"], **self.isolation})
        logger.info("embedded sandbox on 127.0.0.1:%d (isolation: %s)", self.port, self.isolation)
        return self

    def handle(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self.run_code(request)

    def run_code(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One SandboxFusion ``RunCodeRequest`` -> ``(HTTP status, RunCodeResponse)``."""
        code = request.get("code")
        if not isinstance(code, str):
            return 422, {"detail": "code must be a string"}
        language = request.get("language", "python")
        if language != "python":
            return 200, {
                "status": "SandboxError",
                "message": f"language {language!r} is not supported by mindrl's embedded sandbox "
                "(python only); run a SandboxFusion server for other languages",
                "compile_result": None,
                "run_result": None,
                "files": {},
            }
        try:
            run_timeout = float(request.get("run_timeout") or 10)
            memory_mb = int(request.get("memory_limit_MB") or -1)
        except (TypeError, ValueError):
            return 422, {"detail": "run_timeout and memory_limit_MB must be numbers"}
        if not 0 < run_timeout <= self.limits.max_run_timeout_s:
            run_timeout = self.limits.max_run_timeout_s if run_timeout > 0 else 10.0
        if memory_mb <= 0:
            memory_mb = self.limits.default_memory_mb
        memory_mb = min(memory_mb, self.limits.max_memory_mb)
        with self._slots:
            run_result, files = self._run_python(
                code,
                stdin=request.get("stdin"),
                run_timeout=run_timeout,
                memory_mb=memory_mb,
                files=request.get("files") or {},
                fetch_files=request.get("fetch_files") or [],
            )
        ok = run_result["status"] == "Finished" and run_result["return_code"] == 0
        return 200, {
            "status": "Success" if ok else "Failed",
            "message": "",
            "compile_result": None,
            "run_result": run_result,
            "files": files,
        }

    def _run_python(
        self,
        code: str,
        stdin: str | None,
        run_timeout: float,
        memory_mb: int,
        files: dict[str, Any],
        fetch_files: list[Any],
    ) -> tuple[dict[str, Any], dict[str, str]]:
        workdir = tempfile.mkdtemp(prefix="mindrl-sandbox-")
        cgroup_root = pids_cgroup_root()
        cgroup = cgroup_root / Path(workdir).name if cgroup_root is not None else None
        try:
            if cgroup is not None:
                cgroup.mkdir()
                (cgroup / "pids.max").write_text(str(self.limits.max_processes))
            return self._run_in(
                workdir, code, stdin, run_timeout, memory_mb, files, fetch_files, cgroup
            )
        finally:
            if cgroup is not None:
                _remove_cgroup(cgroup)
            _remove_tree(workdir)

    def _run_in(
        self,
        workdir: str,
        code: str,
        stdin: str | None,
        run_timeout: float,
        memory_mb: int,
        files: dict[str, Any],
        fetch_files: list[Any],
        cgroup: Path | None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        root = Path(workdir)
        for name, content in files.items():
            target = (root / name).resolve()
            if root.resolve() not in target.parents or content is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(content))
        (root / "main.py").write_text(code)
        (root / "stdin.txt").write_text(stdin or "")
        limits = self.limits
        spec = {
            "workdir": workdir,
            "cpu_seconds": math.ceil(run_timeout) + 1,
            "memory_bytes": memory_mb * MiB,
            "max_processes": limits.max_processes,
            "file_bytes": limits.max_file_bytes,
            "pids_cgroup": str(cgroup or ""),
            "server_pid": os.getpid(),
            "namespaces": limits.namespaces,
            "argv": [sys.executable, "-I", "main.py"],
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            },
        }
        started = time.monotonic()
        with open(root / "stdin.txt", "rb") as stdin_file:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD), json.dumps(spec)],
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                start_new_session=True,
            )

        def kill() -> None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        assert process.stdout is not None and process.stderr is not None
        readers = [
            _CappedReader(pipe, limits.max_output_bytes, kill)
            for pipe in (process.stdout, process.stderr)
        ]
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            return_code = process.wait(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill()
            return_code = process.wait()
        kill()  # what the code left behind in its process group
        for reader in readers:
            reader.join(timeout=5)
        process.stdout.close()
        process.stderr.close()
        elapsed = time.monotonic() - started
        stdout, stderr = (bytes(reader.data).decode(errors="replace") for reader in readers)
        if any(reader.overflowed for reader in readers):
            stderr += (
                f"\n[mindrl sandbox: output past {limits.max_output_bytes} bytes, run stopped]"
            )
        cpu_exceeded = return_code == 128 + signal.SIGXCPU
        if cpu_exceeded:
            stderr += "\n[mindrl sandbox: CPU time limit reached]"
        status = "TimeLimitExceeded" if timed_out or cpu_exceeded else "Finished"
        fetched = {}
        for name in fetch_files:
            target = (root / str(name)).resolve()
            if root.resolve() in target.parents and target.is_file():
                fetched[str(name)] = base64.b64encode(
                    target.read_bytes()[: limits.max_output_bytes]
                ).decode()
        return {
            "status": status,
            "execution_time": round(elapsed, 3),
            "return_code": return_code,
            "stdout": stdout,
            "stderr": stderr,
        }, fetched


def main() -> None:
    """``python -m mindrl.tools.sandbox_server --port 8080``: serve until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--memory-mb", type=int, default=SandboxLimits.default_memory_mb)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    limits = SandboxLimits(default_memory_mb=args.memory_mb)
    SandboxServer(limits, port=args.port).start().serve_until_interrupted()


if __name__ == "__main__":
    main()
