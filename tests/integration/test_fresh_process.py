"""The fresh-process protocol (tests/fresh_process.py): JSON in, JSON out, the stderr tail on
failure, processes killed by pid on timeout, gloo-style rank fan-out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.fresh_process import REPO, FreshProcessError, kill_tree

TIMEOUT_S = 120.0  # generous: these scripts only start Python


def _script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(
        "import json, os, sys, time\n"
        "from tests.fresh_process import json_main\n\n" + textwrap.dedent(body)
    )
    return path


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_arguments_in_result_out(fresh_process, tmp_path):
    script = _script(
        tmp_path,
        "echo.py",
        """
        def main(args):
            return {"args": args, "cwd": os.getcwd(), "path0": os.environ["PYTHONPATH"].split(os.pathsep)[0],
                    "extra": os.environ.get("EXTRA"), "nan": float("nan")}

        json_main(main)
        """,
    )
    args = {"n": 3, "nested": {"xs": [1.5, None, "a"]}, "flag": True}
    out = fresh_process(script, args, timeout_s=TIMEOUT_S, env={"EXTRA": "yes"})
    assert out["args"] == args
    assert out["cwd"] == str(REPO) and out["path0"] == str(REPO)
    assert out["extra"] == "yes"
    assert out["nan"] != out["nan"]  # NaN survives the round trip


def test_failure_raises_with_the_stderr_tail(fresh_process, tmp_path):
    script = _script(
        tmp_path,
        "boom.py",
        """
        def main(args):
            for i in range(200):
                print(f"noise line {i}", file=sys.stderr)
            raise ValueError("boom " + args["why"])

        json_main(main)
        """,
    )
    with pytest.raises(FreshProcessError) as err:
        fresh_process(script, {"why": "on purpose"}, timeout_s=TIMEOUT_S)
    msg = str(err.value)
    assert "boom.py exited with 1" in msg
    assert "ValueError: boom on purpose" in msg
    assert "noise line 199" in msg and "noise line 0\n" not in msg  # the tail, not everything
    run = fresh_process.run(script, {"why": "again"}, timeout_s=TIMEOUT_S)
    assert run.returncode == 1 and run.result is None
    assert "ValueError: boom again" in run.stderr and "noise line 0" in run.stderr


def test_a_script_must_write_a_dict(fresh_process, tmp_path):
    silent = _script(tmp_path, "silent.py", "print('no json_main here')\n")
    with pytest.raises(FreshProcessError, match="silent.py wrote no result"):
        fresh_process(silent, timeout_s=TIMEOUT_S)
    listy = _script(tmp_path, "listy.py", "json_main(lambda args: [1, 2])\n")
    with pytest.raises(FreshProcessError, match="returns a dict, not list"):
        fresh_process(listy, timeout_s=TIMEOUT_S)


def test_timeout_kills_the_process_by_pid(fresh_process, tmp_path):
    script = _script(tmp_path, "hang.py", "json_main(lambda args: time.sleep(10**6))\n")
    with pytest.raises(FreshProcessError) as err:
        fresh_process(script, timeout_s=1.0)
    msg = str(err.value)
    assert "killed after its timeout of 1 s" in msg
    pid = int(msg.split("pid ", 1)[1].split()[0])
    assert _gone(pid)


def test_kill_tree_reaches_grandchildren():
    code = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10**6)']); "
        "print(g.pid, flush=True); time.sleep(10**6)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = psutil.Process(int(child.stdout.readline()))  # EOF (a crash): int('') fails
        assert grandchild.ppid() == child.pid
        kill_tree(child.pid)
        assert child.wait(timeout=TIMEOUT_S) == -9  # left for its own Popen to reap
        _, alive = psutil.wait_procs([grandchild], timeout=TIMEOUT_S)
        assert alive == []
    finally:
        if grandchild is not None and not _gone(grandchild.pid):
            grandchild.kill()
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_ranks_get_their_environment_and_results(fresh_process, tmp_path):
    script = _script(
        tmp_path,
        "rank.py",
        """
        def main(args):
            env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                              "MASTER_PORT", "OMP_NUM_THREADS")}
            return {"env": env, "tag": args["tag"]}

        json_main(main)
        """,
    )
    out = fresh_process.ranks(script, {"tag": "t"}, world_size=3, timeout_s=TIMEOUT_S)
    assert [r["env"]["RANK"] for r in out] == ["0", "1", "2"]
    assert {r["env"]["WORLD_SIZE"] for r in out} == {"3"}
    assert {r["env"]["MASTER_ADDR"] for r in out} == {"127.0.0.1"}
    assert len({r["env"]["MASTER_PORT"] for r in out}) == 1
    assert {r["tag"] for r in out} == {"t"}


def test_a_failed_rank_is_named_and_its_peers_are_killed(fresh_process, tmp_path):
    script = _script(
        tmp_path,
        "bad_rank.py",
        """
        def main(args):
            if os.environ["RANK"] == "1":
                raise RuntimeError("rank one is broken")
            time.sleep(10**6)  # a peer stuck in a collective

        json_main(main)
        """,
    )
    with pytest.raises(FreshProcessError) as err:
        fresh_process.ranks(script, world_size=2, timeout_s=TIMEOUT_S, peer_grace_s=0.5)
    msg = str(err.value)
    assert "killed after its timeout" not in msg  # ended by the failure, not the deadline
    assert "rank 1 (pid" in msg and "RuntimeError: rank one is broken" in msg
    assert "rank 0 (pid" in msg and "exited with -9" in msg
