"""Run a script in a fresh Python process and read its JSON result: one protocol for every
helper script under tests/.

Protocol: the parent writes the arguments as one JSON document and runs

    python SCRIPT ARGS.json RESULT.json

(with the repo root first on PYTHONPATH, cwd = the repo root). The script reads its arguments
and writes its result as one JSON document with `json_main(fn)`; a script that fails exits
non-zero with its traceback on stderr. Each run gets its own folder (arguments, result,
stdout.log, stderr.log) under the caller's work folder, so a failure can be looked at later.

Parent side: `run_json_script` (a result or a `FreshProcessError` naming the exit code and the
stderr tail), `run_script` (the exit code and streams too, for scripts expected to fail),
`run_json_ranks` (the same script on N gloo ranks over 127.0.0.1, one result per rank) and
`run_process` (any command, same timeout and clean-up). Every run is bounded by the caller's
`timeout_s`; on timeout, failure or interruption the process and its descendants are killed by
pid. The pytest fixture `fresh_process` (tests/conftest.py) binds these to the test's tmp_path.

This module imports only the standard library at import time: the scripts import it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TAIL_LINES = 40
TAIL_CHARS = 6000
KILL_WAIT_S = 30.0  # how long to wait for SIGKILLed processes to be reaped
PEER_GRACE_S = 10.0  # after one rank fails, how long the others get to exit on their own


class FreshProcessError(AssertionError):
    """A fresh process failed: non-zero exit, timeout, or no (valid) JSON result."""


@dataclass(frozen=True)
class ProcessRun:
    """A finished process: its command, exit code and captured streams."""

    cmd: tuple[str, ...]
    pid: int
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ScriptRun(ProcessRun):
    """A finished JSON script: also its result (None when it wrote none) and its folder."""

    result: dict[str, Any] | None = None
    folder: Path | None = None


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `text`, at most TAIL_CHARS characters."""
    return "\n".join(text.rstrip().splitlines()[-lines:])[-TAIL_CHARS:]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (mindrl's pick, outside the range of outgoing
    connections' source ports)."""
    from mindrl.cluster.calls import free_port as node_free_port

    return node_free_port("127.0.0.1")


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every descendant it has now (each by its pid), then wait for them.

    Our own children are left for their `Popen.wait()` to reap, so it sees the real -9."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    others = []
    for p in procs:
        try:
            if p.ppid() != os.getpid():
                others.append(p)
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(others, timeout=KILL_WAIT_S)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ + `extra`, the repo root first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    env.update(extra or {})
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _start(cmd: Sequence[str], folder: Path, name: str, env: Mapping[str, str], cwd: Path):
    out = open(folder / f"{name}stdout.log", "wb")
    err = open(folder / f"{name}stderr.log", "wb")
    try:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=dict(env), cwd=cwd)
    finally:
        out.close()
        err.close()
    return proc


def _finish(proc: subprocess.Popen, folder: Path, name: str) -> ProcessRun:
    return ProcessRun(
        cmd=tuple(str(a) for a in proc.args),
        pid=proc.pid,
        returncode=proc.returncode,
        stdout=_read(folder / f"{name}stdout.log"),
        stderr=_read(folder / f"{name}stderr.log"),
    )


def _wait(procs: list[subprocess.Popen], timeout_s: float, peer_grace_s: float) -> bool:
    """Wait for every process; once one has failed the others get `peer_grace_s`. False when
    the timeout passed with processes still running (the caller kills what is left)."""
    deadline = time.monotonic() + timeout_s
    peer_failed = False
    while True:
        codes = [p.poll() for p in procs]  # every one: poll() is what records an exit
        if None not in codes:
            return True
        now = time.monotonic()
        if now >= deadline:
            return peer_failed  # a failure ended the wait, not the timeout
        if not peer_failed and any(c not in (None, 0) for c in codes):
            peer_failed = True
            deadline = min(deadline, now + peer_grace_s)
        try:
            procs[codes.index(None)].wait(timeout=min(0.2, deadline - now))
        except subprocess.TimeoutExpired:
            pass


def _run_all(
    cmds: list[list[str]],
    names: list[str],
    folder: Path,
    envs: list[dict[str, str]],
    timeout_s: float,
    cwd: Path,
    peer_grace_s: float = PEER_GRACE_S,
) -> tuple[list[ProcessRun], bool]:
    """Start every command, wait (bounded), kill what is left by pid; (runs, finished)."""
    procs: list[subprocess.Popen] = []
    finished = False
    try:
        for cmd, name, env in zip(cmds, names, envs):
            procs.append(_start(cmd, folder, name, env, cwd))
        finished = _wait(procs, timeout_s, peer_grace_s)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
                p.wait()
    return [_finish(p, folder, n) for p, n in zip(procs, names)], finished


def run_process(
    cmd: Sequence[str | os.PathLike],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    log_dir: Path | None = None,
) -> ProcessRun:
    """Run `cmd` (stdout and stderr to log files); raise FreshProcessError on timeout.

    A non-zero exit is returned, not raised: the caller asserts on it."""
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryDirectory(prefix="fresh-") as scratch:
        folder = Path(log_dir) if log_dir is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        (run,), finished = _run_all([cmd], [""], folder, [child_env(env)], timeout_s, cwd)
    if not finished:
        raise FreshProcessError(
            f"{' '.join(cmd[:3])} ...: pid {run.pid} killed after its timeout of {timeout_s:g} s\n"
            f"stderr tail:\n{tail(run.stderr)}\nstdout tail:\n{tail(run.stdout)}"
        )
    return run


def _prepare(script: Path, args: Mapping[str, Any] | None, workdir: Path) -> Path:
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(script)
    workdir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{script.stem.lstrip('_')}-", dir=workdir))
    (folder / "args.json").write_text(json.dumps(dict(args or {})))
    return folder


def _result(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def run_script(
    script: Path,
    args: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
    workdir: Path,
    env: Mapping[str, str] | None = None,
) -> ScriptRun:
    """Run a JSON script once; its exit code, streams and result (None if it wrote none).

    Raises FreshProcessError only on timeout: use this for scripts expected to fail."""
    folder = _prepare(script, args, workdir)
    cmd = [sys.executable, str(script), str(folder / "args.json"), str(folder / "result.json")]
    (run,), finished = _run_all([cmd], [""], folder, [child_env(env)], timeout_s, REPO)
    if not finished:
        raise FreshProcessError(
            f"{Path(script).name}: pid {run.pid} killed after its timeout of {timeout_s:g} s "
            f"({folder})\n"
            f"stderr tail:\n{tail(run.stderr)}"
        )
    return ScriptRun(**vars(run), result=_result(folder / "result.json"), folder=folder)


def run_json_script(
    script: Path,
    args: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
    workdir: Path,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run a JSON script once and return its result; raise FreshProcessError (with the stderr
    tail) on a non-zero exit, a timeout or a missing result."""
    run = run_script(script, args, timeout_s=timeout_s, workdir=workdir, env=env)
    if run.returncode != 0 or run.result is None:
        why = f"exited with {run.returncode}" if run.returncode else "wrote no result"
        raise FreshProcessError(
            f"{Path(script).name} {why} ({run.folder})\nstderr tail:\n{tail(run.stderr)}"
        )
    return run.result


def run_json_ranks(
    script: Path,
    args: Mapping[str, Any] | None = None,
    *,
    world_size: int,
    timeout_s: float,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    peer_grace_s: float = PEER_GRACE_S,
) -> list[dict[str, Any]]:
    """Run a JSON script on `world_size` ranks at once (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR=127.0.0.1, MASTER_PORT, OMP_NUM_THREADS=1 set); the results by rank.

    Same arguments for every rank, one result file per rank. When a rank fails the others get
    `peer_grace_s` to exit, then every rank still running is killed by pid; the error names each
    failed rank with its stderr tail."""
    folder = _prepare(script, args, workdir)
    port = free_port()
    cmds, names, envs = [], [], []
    for rank in range(world_size):
        cmds.append(
            [
                sys.executable,
                str(script),
                str(folder / "args.json"),
                str(folder / f"result.rank{rank}.json"),
            ]
        )
        names.append(f"rank{rank}.")
        rank_env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        envs.append(child_env({**(env or {}), **rank_env}))
    runs, finished = _run_all(cmds, names, folder, envs, timeout_s, REPO, peer_grace_s)
    results = [_result(folder / f"result.rank{r}.json") for r in range(world_size)]
    problems = [] if finished else [f"killed after its timeout of {timeout_s:g} s"]
    for rank, (run, result) in enumerate(zip(runs, results)):
        if run.returncode != 0 or result is None:
            why = f"exited with {run.returncode}" if run.returncode else "wrote no result"
            problems.append(
                f"rank {rank} (pid {run.pid}) {why}; stderr tail:\n{tail(run.stderr, 25)}"
            )
    if problems:
        raise FreshProcessError(
            f"{Path(script).name} on {world_size} ranks ({folder}):\n" + "\n".join(problems)
        )
    return [r for r in results if r is not None]


def json_main(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Script side: `fn(arguments)` with the arguments document (argv[1]); its dict result is
    written to argv[2] (atomically: a result file is always complete)."""
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} ARGS.json RESULT.json")
    args = json.loads(Path(sys.argv[1]).read_text())
    result = fn(args)
    if not isinstance(result, dict):
        raise TypeError(f"a fresh-process script returns a dict, not {type(result).__name__}")
    out = Path(sys.argv[2])
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(result))
    os.replace(partial, out)


class FreshProcess:
    """The `fresh_process` fixture: the functions above with the test's work folder bound."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def __call__(
        self,
        script: Path,
        args: Mapping[str, Any] | None = None,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """`run_json_script`: the script's result, or FreshProcessError."""
        return run_json_script(script, args, timeout_s=timeout_s, workdir=self.workdir, env=env)

    def run(
        self,
        script: Path,
        args: Mapping[str, Any] | None = None,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> ScriptRun:
        """`run_script`: exit code, streams and result, for scripts expected to fail."""
        return run_script(script, args, timeout_s=timeout_s, workdir=self.workdir, env=env)

    def ranks(
        self,
        script: Path,
        args: Mapping[str, Any] | None = None,
        *,
        world_size: int,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        peer_grace_s: float = PEER_GRACE_S,
    ) -> list[dict[str, Any]]:
        """`run_json_ranks`: one result per rank, or FreshProcessError naming the failed ranks."""
        return run_json_ranks(
            script,
            args,
            world_size=world_size,
            timeout_s=timeout_s,
            workdir=self.workdir,
            env=env,
            peer_grace_s=peer_grace_s,
        )

    def command(
        self,
        cmd: Sequence[str | os.PathLike],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO,
    ) -> ProcessRun:
        """`run_process`: any command, logs kept in the work folder."""
        log_dir = Path(tempfile.mkdtemp(prefix="cmd-", dir=self._workdir()))
        return run_process(cmd, timeout_s=timeout_s, env=env, cwd=cwd, log_dir=log_dir)

    def _workdir(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir
