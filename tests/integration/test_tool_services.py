"""The built-in tools against mindrl's embedded servers on 127.0.0.1, loaded from MindSpeed-RL's YAML.

The code interpreter (success, non-zero exit, timeout, server down), ReTool's code preparation,
the search tool's top-k order on a corpus made here, the start of embedded servers where a
loopback URL does not answer, and the dry-run check naming a remote service that is down.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mindrl.tools.base import Tool
from mindrl.tools.code_interpreter import CodeInterpreterTool, ReToolInterpreter
from mindrl.tools.http_service import LoopbackServer, port_answers
from mindrl.tools.local_servers import ToolServiceError, check_tool_services, ensure_local_servers
from mindrl.tools.registry import load_tools, read_tool_config
from mindrl.tools.retrieval_server import RetrievalServer
from mindrl.tools.sandbox_server import PIDS_CGROUP_V1, SandboxLimits, SandboxServer
from mindrl.tools.search import SearchTool
from tests.local_ports import OTHER_LOOPBACK, unused_port

RETOOL_YAML = """tools:
  - class_name: "mindspeed_rl.tools.retool.ReTool"
    config:
      sandbox_fusion_url: "{url}"
      num_workers: 4
      enable_global_rate_limit: true
      rate_limit: 4
      default_timeout: {timeout}
      default_language: "python"
      memory_limit_mb: 512
      type: native
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code: {{type: "string", description: "The code to execute."}}
          required: ["code"]
"""

SEARCH_YAML = """tools:
  - class_name: "mindspeed_rl.tools.search_tool.SearchTool"
    config:
      retrieval_service_url: "{url}"
      num_workers: 4
      rate_limit: 4
      timeout: 30
      topk: 2
      type: native
{extra}
    tool_schema:
      type: "function"
      function:
        name: "search"
        description: "Searches the web."
        parameters:
          type: "object"
          properties:
            query_list: {{type: "array", item: {{type: "string"}}}}
          required: ["query_list"]
"""

CORPUS = [
    {"id": "1", "contents": "Paris\nParis is the capital of France."},
    {"id": "2", "contents": "Berlin\nBerlin is the capital of Germany, on the Spree."},
    {"id": "3", "contents": "Spree\nThe Spree river flows through Berlin. Spree, Spree."},
    {"id": "4", "contents": "Cooking\nA recipe for bread."},
]


def free_loopback_port() -> int:
    return unused_port("127.0.0.1")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxServer]:
    server = SandboxServer(SandboxLimits(max_concurrent=2)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    return path


def load_one(tmp_path: Path, text: str) -> Tool:
    (tmp_path / "tools.yaml").write_text(text)
    (tool,) = load_tools(tmp_path / "tools.yaml").values()
    return tool


def call(tool: Tool, arguments: dict[str, object]):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        await tool.create("0")
        try:
            return await tool.execute("0", arguments)
        finally:
            await tool.release("0")
            await tool.close()

    return asyncio.run(go())


def test_retool_runs_code_and_reports_errors_and_timeouts(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    tool = load_one(tmp_path, RETOOL_YAML.format(url=sandbox.url, timeout=3))
    assert isinstance(tool, ReToolInterpreter)
    # ReTool: the fenced block is taken and its last expression printed
    ok = call(tool, {"code": "Let me compute.\n```python\nx = 12345 * 6789\nx\n```"})
    assert ok.error is None and ok.text.strip() == str(12345 * 6789)
    failed = call(tool, {"code": "int('bad input')"})
    assert failed.error == "error" and "ValueError: invalid literal" in failed.text
    slow = call(tool, {"code": "import time\ntime.sleep(30)", "timeout": 1})
    assert slow.error == "timeout" and "time limit (1 s)" in slow.text
    bad = call(tool, {"cod": "print(1)"})
    assert bad.error == "bad_call"


def test_the_sandbox_fusion_tool_sends_code_unchanged(
    sandbox: SandboxServer, tmp_path: Path
) -> None:
    text = RETOOL_YAML.format(url=sandbox.url, timeout=5).replace(
        "mindspeed_rl.tools.retool.ReTool", "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    )
    tool = load_one(tmp_path, text)
    assert type(tool) is CodeInterpreterTool
    result = call(tool, {"code": "x = 2 + 2\nx"})  # no print added: no output
    assert result.error is None and result.text == ""
    assert (
        call(tool, {"code": "import sys\nprint('out'); print('err', file=sys.stderr)"}).text
        == "out\nerr\n"
    )
    flood = call(tool, {"code": "print('a' * 100000 + 'b' * 100000)"}).text
    assert len(flood) < 70000 and flood.startswith("a" * 1000) and flood.endswith("b" * 1000 + "\n")
    assert "...(truncated)..." in flood


def test_a_sandbox_that_is_down_is_an_error_result(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_loopback_port()}/run_code"
    tool = load_one(tmp_path, RETOOL_YAML.format(url=url, timeout=2))
    result = call(tool, {"code": "print(1)"})
    assert result.error == "server_down" and url in result.text


def test_search_returns_the_top_k_passages_in_bm25_order(corpus: Path, tmp_path: Path) -> None:
    server = RetrievalServer(corpus).start()
    try:
        tool = load_one(tmp_path, SEARCH_YAML.format(url=server.url, extra=""))
        assert isinstance(tool, SearchTool)
        result = call(tool, {"query_list": ["Spree river", "capital of France"]})
        assert result.error is None
        spree, france = json.loads(result.text)["result"].split("\n---\n")
        assert spree.startswith("Doc 1 (Title: Spree)\n") and "Doc 2 (Title: Berlin)" in spree
        assert "Doc 3" not in spree  # topk: 2
        assert france.startswith("Doc 1 (Title: Paris)\nParis is the capital of France.")
        assert call(tool, {"query_list": "not a list"}).error is None  # one query as a string
        assert call(tool, {"query_list": []}).error == "bad_call"
    finally:
        server.stop()


def test_embedded_servers_start_where_a_loopback_url_does_not_answer(
    corpus: Path, tmp_path: Path
) -> None:
    code_url = f"http://localhost:{free_loopback_port()}/run_code"
    search_url = f"http://127.0.0.1:{free_loopback_port()}/retrieve"
    code_tool = load_one(tmp_path, RETOOL_YAML.format(url=code_url, timeout=10))
    search_yaml = SEARCH_YAML.format(url=search_url, extra=f"      retrieval_corpus: {corpus}")
    search_tool = load_one(tmp_path, search_yaml)
    (tmp_path / "both.yaml").write_text(
        RETOOL_YAML.format(url=code_url, timeout=10) + search_yaml.removeprefix("tools:\n")
    )
    # read from the YAML's entries, no tool instantiated to learn its URL
    with ensure_local_servers(read_tool_config(tmp_path / "both.yaml")) as servers:
        assert len(servers.servers) == 2
        assert call(code_tool, {"code": "print(7 * 6)"}).text == "42\n"
        assert "Paris" in call(search_tool, {"query_list": ["France"]}).text
    assert call(code_tool, {"code": "print(1)"}).error == "server_down"  # stopped at the end


def test_a_service_that_cannot_be_stood_in_for_is_named(tmp_path: Path) -> None:
    # a host mindrl does not stand in for, on this machine's loopback: refused at once
    remote = f"http://{OTHER_LOOPBACK}:{unused_port(OTHER_LOOPBACK)}/run_code"
    (tmp_path / "remote.yaml").write_text(RETOOL_YAML.format(url=remote, timeout=5))
    problems = check_tool_services(read_tool_config(tmp_path / "remote.yaml"))
    assert problems == [f"tool code_interpreter: {remote} does not answer"]
    with pytest.raises(ToolServiceError, match="does not answer"):
        ensure_local_servers(read_tool_config(tmp_path / "remote.yaml"))
    local = f"http://127.0.0.1:{free_loopback_port()}/retrieve"
    (tmp_path / "search.yaml").write_text(SEARCH_YAML.format(url=local, extra=""))
    (problem,) = check_tool_services(read_tool_config(tmp_path / "search.yaml"))
    assert "retrieval_corpus" in problem


def sandbox_processes() -> dict[int, str]:
    """Processes whose working directory is a run directory of a sandbox, with that directory."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if Path(cwd).name.startswith("mindrl-sandbox-"):
                found[int(entry.name)] = cwd
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_server_that_dies_mid_run_costs_only_the_call_in_flight(tmp_path: Path) -> None:
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}/run_code"
    server = subprocess.Popen(
        [sys.executable, "-m", "mindrl.tools.sandbox_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 60
        while not port_answers(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        tool = load_one(tmp_path, RETOOL_YAML.format(url=url, timeout=30))

        async def run_while_the_server_dies():  # type: ignore[no-untyped-def]
            call = asyncio.ensure_future(
                tool.execute("0", {"code": "import time\ntime.sleep(60)\n1"})
            )
            seen: dict[int, str] = {}
            while len(seen) < 2 and time.monotonic() < deadline:  # the launcher and the code
                await asyncio.sleep(0.2)
                seen = sandbox_processes()
            server.kill()
            result = await call
            await tool.close()
            return result, seen

        result, found = asyncio.run(run_while_the_server_dies())
        runs.update(found)
        assert len(runs) >= 2
        assert result.error == "server_down"
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in runs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in runs)  # the run died with its server
    finally:
        server.kill()
        server.wait()
        for workdir in set(runs.values()):  # what a killed server could not remove
            shutil.rmtree(workdir, ignore_errors=True)
            cgroup = PIDS_CGROUP_V1 / Path(workdir).name
            if cgroup.is_dir():
                cgroup.rmdir()


class SlowRetrieval:
    """A /retrieve handler that takes ``seconds`` and records the most requests it held at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.active, self.most = seconds, 0, 0
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, object]) -> tuple[int, dict[str, object]]:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.seconds)
        with self.lock:
            self.active -= 1
        return 200, {"result": [[{"document": {"id": "1", "contents": "T\\nx"}, "score": 1.0}]]}


def test_num_workers_bounds_the_calls_in_flight_and_timeout_bounds_each(tmp_path: Path) -> None:
    handler = SlowRetrieval(seconds=0.5)
    server = LoopbackServer(routes={"/retrieve": handler}, health={}).start()
    try:
        text = SEARCH_YAML.format(
            url=server.url("/retrieve"), extra="      enable_global_rate_limit: false"
        )
        tool = load_one(tmp_path, text.replace("num_workers: 4", "num_workers: 2"))

        async def six_calls():  # type: ignore[no-untyped-def]
            results = await asyncio.gather(
                *(tool.execute(str(i), {"query_list": ["q"]}) for i in range(6))
            )
            await tool.close()
            return results

        results = asyncio.run(six_calls())
        assert all(result.error is None for result in results)
        assert handler.most == 2
        handler.seconds = 5.0
        slow = load_one(tmp_path, text.replace("timeout: 30", "timeout: 1"))
        result = call(slow, {"query_list": ["q"]})
        assert result.error == "timeout" and "within 1 s" in result.text
    finally:
        server.stop()


def test_two_services_on_one_local_port_and_a_missing_corpus_are_named(
    corpus: Path, tmp_path: Path
) -> None:
    port = free_loopback_port()
    code_yaml = RETOOL_YAML.format(url=f"http://localhost:{port}/run_code", timeout=5)
    search_yaml = SEARCH_YAML.format(
        url=f"http://localhost:{port}/retrieve", extra=f"      retrieval_corpus: {corpus}"
    )
    both = code_yaml + search_yaml.removeprefix("tools:\n")
    (tmp_path / "both.yaml").write_text(both)
    (problem,) = check_tool_services(read_tool_config(tmp_path / "both.yaml"))
    assert f"port {port} is already mindrl's embedded sandbox server" in problem
    with pytest.raises(ToolServiceError, match="give each service its own port"):
        ensure_local_servers(read_tool_config(tmp_path / "both.yaml"))
    assert not port_answers(f"http://127.0.0.1:{port}/")  # the sandbox started first was stopped
    missing = SEARCH_YAML.format(
        url=f"http://127.0.0.1:{port}/retrieve", extra="      retrieval_corpus: /nowhere.jsonl"
    )
    (tmp_path / "missing.yaml").write_text(missing)
    (problem,) = check_tool_services(read_tool_config(tmp_path / "missing.yaml"))
    assert "retrieval_corpus /nowhere.jsonl does not exist" in problem


def test_an_http_error_of_the_sandbox_is_an_error_result(tmp_path: Path) -> None:
    server = LoopbackServer(
        routes={"/run_code": lambda request: (503, {"detail": "overloaded"})}, health={}
    ).start()
    try:
        tool = load_one(tmp_path, RETOOL_YAML.format(url=server.url("/run_code"), timeout=5))
        result = call(tool, {"code": "print(1)"})
        assert result.error == "server_error" and "HTTP 503" in result.text
        assert "overloaded" in result.text
    finally:
        server.stop()
