"""GRPO with rollout on a real vLLM server (`generate_config.server`): the test starts
`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 with mindrl's weight-transfer
backend, and `cli/train_grpo.py --config-name grpo_tiny_cpu` generates on it. Every step the
server's log-probs equal the trainer's (the weights pushed after each update arrived whole,
the tied LM head included), the tiny model learns, and a run pointed at a server that is not
there stops with an error naming it."""

from __future__ import annotations

from tests.e2e._run import first_and_last_scores, read_metrics, run_train
from tests.fresh_process import free_port
from tests.vllm_server import start_server, wait_ready

LOGPROB_NOISE = 1e-4
TIMEOUT_S = 300.0


def test_tiny_run_learns_on_a_vllm_server(tmp_path, tiny_model_dir):
    server = start_server(tiny_model_dir, tmp_path / "server")
    try:
        wait_ready(server)
        out = tmp_path / "server_run"
        proc = run_train(
            out,
            "megatron_training.seed=7",
            f"+generate_config.server.urls=[{server.url}]",
            f"+generate_config.server.timeout={TIMEOUT_S}",
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log_tail()
    finally:
        server.stop()
    metrics = read_metrics(out)
    first, last = first_and_last_scores(metrics)
    assert last >= first + 0.3, (first, last)
    assert all(m["rollout/logprob_abs_diff_max"] < LOGPROB_NOISE for m in metrics)
    assert all(m["resharding/bytes"] > 0 for m in metrics)


def test_a_run_without_its_server_names_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    proc = run_train(tmp_path / "no_server", f"+generate_config.server.urls=[{url}]")
    assert proc.returncode != 0
    assert f"rollout server {url}: /v1/models failed" in proc.stdout + proc.stderr
