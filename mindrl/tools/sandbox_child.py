"""The launcher of one sandboxed run: isolates itself, then runs the code file as a fresh Python.

Run as a script by the sandbox server (``python -I -S sandbox_child.py SPEC_JSON``), so it imports
only the standard library and nothing of mindrl. In order:

1. (As root, which ignores ``RLIMIT_NPROC``: join the pids cgroup the server made.)
   ``unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID)`` (unprivileged where user namespaces
   are allowed): a network namespace with no interface up, so no connection leaves the sandbox;
   a user namespace, in which ``RLIMIT_NPROC`` counts the sandbox's own processes only; a pid
   namespace, so killing its first process kills every process the code started.
2. A fork: the child (pid 1 of the new namespace) sets the rlimits (CPU time, address space,
   process count, file size, no core files), then Landlock (writes only under the working
   directory; TCP connect / bind denied from ABI 4; signals and abstract unix sockets scoped
   to the sandbox from ABI 6), then ``execve`` of the Python interpreter on the code file.
   The launcher waits and exits with the child's status. Both die with their parent
   (``PR_SET_PDEATHSIG``), so a server that dies mid-run leaves no run behind.

``--probe`` prints which layers this machine grants, as JSON, and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH = 1
NOBODY = 65534  # the id the code runs as inside its user namespace: no capabilities after exec

_libc = ctypes.CDLL(None, use_errno=True)


def _write_rights(abi: int) -> int:
    rights = 1 << 1  # WRITE_FILE
    rights |= sum(1 << bit for bit in range(4, 13))  # REMOVE_DIR .. MAKE_SYM
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= 1 << 14  # TRUNCATE
    return rights


def _file_write_rights(abi: int) -> int:
    return (1 << 1) | ((1 << 14) if abi >= 3 else 0)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


def landlock_abi() -> int:
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def _landlock(writable_dir: str, abi: int) -> None:
    attr = _RulesetAttr(handled_access_fs=_write_rights(abi))
    size = 8
    if abi >= 4:
        attr.handled_access_net = 1 | 2  # BIND_TCP | CONNECT_TCP: no rule grants any port
        size = 16
    if abi >= 6:
        attr.scoped = 1 | 2  # ABSTRACT_UNIX_SOCKET | SIGNAL
        size = 24
    ruleset = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    for path, rights in (
        (writable_dir, _write_rights(abi)),
        ("/dev/null", _file_write_rights(abi)),
    ):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = _PathBeneath(allowed_access=rights, parent_fd=fd)
        added = _libc.syscall(
            SYS_LANDLOCK_ADD_RULE,
            ctypes.c_int(ruleset),
            ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
            ctypes.byref(rule),
            ctypes.c_uint32(0),
        )
        os.close(fd)
        if added < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def _join_pids_cgroup(path: str) -> None:
    """Root ignores ``RLIMIT_NPROC``: a root server bounds the process count by a pids cgroup."""
    if path:
        with open(os.path.join(path, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))


def _enter_namespaces() -> list[str]:
    """The namespaces entered, widest set first; none where user namespaces are not allowed."""
    uid, gid = os.getuid(), os.getgid()
    for flags, names in (
        (CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, ["user", "net", "pid"]),
        (CLONE_NEWUSER | CLONE_NEWNET, ["user", "net"]),
    ):
        if _libc.unshare(ctypes.c_int(flags)) == 0:
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{NOBODY} {uid} 1"),
                ("gid_map", f"{NOBODY} {gid} 1"),
            ):
                try:
                    with open(f"/proc/self/{name}", "w") as handle:
                        handle.write(text)
                except OSError:  # unmapped ids only change how the code sees itself
                    pass
            return names
    return []


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent goes (a server that dies mid-run must not leave its runs behind)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() not in (parent, 0):  # it went first (0: a parent outside our pid namespace)
        os._exit(137)


def _limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def _run_child(spec: dict[str, Any]) -> None:
    """In the forked child: limits, Landlock, then the code. Never returns."""
    try:
        workdir = str(spec["workdir"])
        os.chdir(workdir)
        _limit(resource.RLIMIT_CORE, 0)
        _limit(resource.RLIMIT_CPU, int(spec["cpu_seconds"]))
        _limit(resource.RLIMIT_FSIZE, int(spec["file_bytes"]))
        _limit(resource.RLIMIT_NPROC, int(spec["max_processes"]))
        memory = int(spec["memory_bytes"])
        if memory > 0:
            _limit(resource.RLIMIT_AS, memory)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        abi = landlock_abi()
        if abi >= 1:
            _landlock(workdir, abi)
        argv = [str(part) for part in spec["argv"]]
        os.execve(argv[0], argv, {str(k): str(v) for k, v in dict(spec["env"]).items()})
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure, then die
        os.write(2, f"mindrl sandbox: set-up failed: {exc!r}\n".encode())
    os._exit(126)


def main() -> None:
    if sys.argv[1:] == ["--probe"]:
        pid = os.fork()
        if pid == 0:
            names = _enter_namespaces()
            print(json.dumps({"namespaces": names, "landlock_abi": landlock_abi()}), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        return
    spec = json.loads(sys.argv[1])
    _die_with_parent(int(spec["server_pid"]))
    _join_pids_cgroup(str(spec.get("pids_cgroup") or ""))
    if spec["namespaces"]:
        _enter_namespaces()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with_parent(launcher)
        _run_child(spec)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
