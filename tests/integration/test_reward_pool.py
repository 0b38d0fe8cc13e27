"""RewardScorer with real worker processes: hangs, crashes and garbage never stall a batch."""

import time

import psutil
import pytest

from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams, SampleMeta
from tests.bounds import call_within

# Misbehaving verifiers, triggered by markers in the response so the other samples stay normal.
VERIFIERS = """
import ctypes, os, subprocess, time
from pathlib import Path
from mindrl.rewards.registry import register_verifier

@register_verifier("itest_hang")
def hang(response, label, meta=None):
    if "HANG" in response:
        time.sleep(10**6)
    if "SLOW" in response:
        time.sleep(0.4)
    return 1.0

@register_verifier("itest_crash")
def crash(response, label, meta=None):
    if "RAISE" in response:
        raise RuntimeError("verifier bug")
    if "EXIT" in response:
        os._exit(3)
    if "SEGV" in response:
        ctypes.string_at(0)
    return 0.5

@register_verifier("itest_garbage")
def garbage(response, label, meta=None):
    values = {"NONE": None, "NAN": float("nan"), "STR": "1.0", "INF": float("inf"),
              "NEGINF": float("-inf"), "LIST": [1.0]}
    return values.get(response, 2)

@register_verifier("itest_child_then_hang")
def child_then_hang(response, label, meta=None):
    child = subprocess.Popen(["sleep", "600"])
    Path(label).write_text(str(child.pid))
    time.sleep(10**6)

@register_verifier("itest_meta")
def uses_meta(response, label, meta=None):
    # length share, plus a column from the dataset, plus a run parameter
    return meta.response_length / meta.max_length + meta.extra["bonus"] + meta.params.repetition_n_grams
"""


@pytest.fixture(scope="module")
def verifier_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("verifiers") / "itest_verifiers.py"
    path.write_text(VERIFIERS)
    return path


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_hanging_verifier_is_killed_within_timeout(verifier_file):
    timeout_s = 1.0
    responses = [r"\boxed{1}", r"HANG \boxed{2}", r"\boxed{3}", r"\boxed{4}", r"\boxed{9}"]
    labels = ["1", "2", "3", "4", "5"]
    with RewardScorer(
        ["lenient_acc", "itest_hang"], [1.0, 1.0], 2, timeout_s, verifier_files=[verifier_file]
    ) as scorer:
        before = set(scorer.worker_pids())
        (scores, per_function, metrics) = call_within(lambda: scorer.score(responses, labels), 30)
        # One hung call costs one timeout; a fork from the warm forkserver replaces the worker.
        assert metrics["reward/timeouts"] == 1
        assert metrics["reward/errors"] == 0 and metrics["reward/invalid"] == 0
        assert per_function["itest_hang"] == [1.0, 0.0, 1.0, 1.0, 1.0]
        assert per_function["lenient_acc"] == [1.0, 1.0, 1.0, 1.0, 0.0]
        assert scores == [2.0, 1.0, 2.0, 2.0, 1.0]
        assert metrics["itest_hang_rewards/mean"] == pytest.approx(4 / 5)
        killed = before - set(scorer.worker_pids())
        assert len(killed) == 1 and not alive(killed.pop())
        assert len(scorer.worker_pids()) == 2

        # Every call hangs: a first wave of timeouts, then the step budget (2 x timeout) cuts
        # what still runs and skips what has not started, however many samples hang.
        (scores, _, metrics) = call_within(lambda: scorer.score(["HANG"] * 4, ["0"] * 4), 30)
        assert metrics["reward/timeouts"] >= 2  # the first wave: one call per worker
        assert metrics["reward/timeouts"] + metrics["reward/skipped"] == 4
        assert metrics["reward/errors"] == metrics["reward/invalid"] == 0
        assert scores == [0.0] * 4  # lenient_acc is 0 ("0" vs no number), itest_hang timed out

        # The pool is healthy afterwards.
        (scores, _, metrics) = call_within(lambda: scorer.score([r"\boxed{7}"], ["7"]), 30)
        assert scores == [2.0] and metrics["reward/timeouts"] == 0


def test_crashing_verifiers_are_counted(verifier_file):
    responses = ["fine", "RAISE", "EXIT", "SEGV", "fine too"]
    with RewardScorer(["itest_crash"], None, 2, 5.0, verifier_files=[verifier_file]) as scorer:
        before = set(scorer.worker_pids())
        (scores, per_function, metrics) = call_within(lambda: scorer.score(responses, [""] * 5), 60)
        assert scores == [0.5, 0.0, 0.0, 0.0, 0.5]
        assert metrics["reward/errors"] == 3
        assert metrics["reward/timeouts"] == 0
        assert metrics["reward/worker_restarts"] == 2  # os._exit and the segfault
        assert metrics["itest_crash_rewards/mean"] == pytest.approx(1.0 / 5)
        for pid in before - set(scorer.worker_pids()):
            assert not alive(pid)


def test_a_worker_runs_a_batch_of_calls_each_under_its_own_timeout(verifier_file):
    # one worker gets the step's calls as one batch: four calls of 0.4 s take longer than the
    # 1 s timeout together, but each is timed on its own
    with RewardScorer(["itest_hang"], None, 1, 1.0, verifier_files=[verifier_file]) as scorer:
        (scores, _, metrics) = call_within(lambda: scorer.score(["SLOW"] * 4, [""] * 4), 30)
        assert scores == [1.0] * 4
        assert metrics["reward/timeouts"] == metrics["reward/worker_restarts"] == 0
        # a call that hangs inside a batch costs that call; the calls after it in the batch
        # run on the replacement worker
        responses = ["a", "HANG", "b", "c"]
        (scores, _, metrics) = call_within(lambda: scorer.score(responses, [""] * 4), 30)
        assert scores == [1.0, 0.0, 1.0, 1.0]
        assert metrics["reward/timeouts"] == metrics["reward/worker_restarts"] == 1


def test_a_crash_inside_a_batch_loses_only_its_own_call(verifier_file):
    responses = ["fine", "EXIT", "fine", "RAISE", "fine"]
    with RewardScorer(["itest_crash"], None, 1, 5.0, verifier_files=[verifier_file]) as scorer:
        (scores, _, metrics) = call_within(lambda: scorer.score(responses, [""] * 5), 60)
    assert scores == [0.5, 0.0, 0.5, 0.0, 0.5]
    assert metrics["reward/errors"] == 2 and metrics["reward/worker_restarts"] == 1


def test_garbage_values_are_counted(verifier_file):
    responses = ["NONE", "NAN", "STR", "INF", "NEGINF", "LIST", "ok"]
    with RewardScorer(
        ["itest_garbage", "format"], [1.0, 1.0], 2, 5.0, verifier_files=[verifier_file]
    ) as scorer:
        (scores, per_function, metrics) = call_within(lambda: scorer.score(responses, [""] * 7), 60)
    assert per_function["itest_garbage"] == [0.0] * 6 + [2.0]
    assert scores == [0.0] * 6 + [2.0]
    assert metrics["reward/invalid"] == 6
    assert metrics["reward/errors"] == 0 and metrics["reward/worker_restarts"] == 0


def test_custom_file_gets_meta_and_params(verifier_file):
    params = RewardParams(repetition_n_grams=5)
    metas = [
        SampleMeta(response_length=25, max_length=100, extra={"bonus": 1.0}),
        SampleMeta(response_length=100, max_length=100, extra={"bonus": 0.0}),
    ]
    with RewardScorer(
        ["itest_meta"], [2.0], 1, 5.0, params=params, verifier_files=[verifier_file]
    ) as scorer:
        (scores, per_function, _) = call_within(
            lambda: scorer.score(["a", "b"], ["", ""], metas), 60
        )
    # length share + bonus + repetition_n_grams, weighted by 2
    assert per_function["itest_meta"] == pytest.approx([0.25 + 1.0 + 5, 1.0 + 0.0 + 5])
    assert scores == pytest.approx([2 * 6.25, 2 * 6.0])


def test_weighted_sum_of_builtins():
    responses = [
        "<think>2+2</think><answer>\\boxed{4}</answer>",  # right, both formats
        "<think>2+2</think><answer>4</answer>",  # right, loose format only (no box)
        "\\boxed{5}",  # wrong, no format
        "a a a a a a",  # no answer, fully repetitive
    ]
    labels = ["4", "4", "4", "4"]
    metas = [SampleMeta(response_length=n, max_length=100) for n in (10, 60, 90, 100)]
    functions = ["lenient_acc", "format", "strict_format", "repetition", "soft_overlong"]
    weights = [1.0, 0.5, 2.0, 1.0, 1.0]
    params = RewardParams(soft_cache_length=20)  # soft_max_length: meta.max_length = 100
    with RewardScorer(functions, weights, 2, 10.0, params=params) as scorer:
        (scores, per_function, metrics) = call_within(
            lambda: scorer.score(responses, labels, metas), 60
        )
    acc = [1.0, 1.0, 0.0, 0.0]
    fmt = [1.0, 1.0, 0.0, 0.0]
    strict = [1.0, -0.5, -0.5, -0.5]
    rep = [0.0, 0.0, 0.0, -(1 - 1 / 4)]  # 6 words: 4 trigrams, 1 distinct
    soft = [0.0, 0.0, (80 - 90) / 20, -1.0]
    expected = [
        1.0 * a + 0.5 * f + 2.0 * s + 1.0 * r + 1.0 * o
        for a, f, s, r, o in zip(acc, fmt, strict, rep, soft)
    ]
    assert per_function["lenient_acc"] == acc
    assert per_function["strict_format"] == strict
    assert per_function["soft_overlong"] == pytest.approx(soft)
    assert scores == pytest.approx(expected)
    assert metrics["reward/mean"] == pytest.approx(sum(expected) / 4)
    assert metrics["strict_format_rewards/mean"] == pytest.approx(sum(strict) / 4)
    assert metrics["reward/timeouts"] == metrics["reward/errors"] == metrics["reward/invalid"] == 0
    # healthy verifiers: nothing skipped, no breaker, no budget, no restart
    assert metrics["reward/skipped"] == metrics["reward/budget_exhausted"] == 0
    assert metrics["reward/worker_restarts"] == 0
    assert all(metrics[f"reward/{name}_circuit_open"] == 0 for name in functions)


def test_configuration_errors_are_raised_not_counted(verifier_file):
    with pytest.raises(ValueError, match="soft_cache_length"):
        RewardScorer(["soft_overlong"])
    with pytest.raises(ValueError, match="verifier weights"):
        RewardScorer(["acc", "format"], [1.0])
    with pytest.raises(KeyError, match="no_such"):
        RewardScorer(["no_such"])
    with RewardScorer(["cosine"], None, 1, 5.0) as scorer:
        with pytest.raises(ValueError, match="response_length"):
            scorer.score(["x"], ["1"], [SampleMeta(max_length=10)])


def test_close_leaves_no_process_behind(verifier_file, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    scorer = RewardScorer(["itest_child_then_hang"], None, 2, 1.0, verifier_files=[verifier_file])
    with scorer:
        workers = scorer.worker_pids()
        assert len(workers) == 2 and all(alive(pid) for pid in workers)
        (_, _, metrics) = call_within(lambda: scorer.score(["x"], [str(pid_file)]), 30)
        assert metrics["reward/timeouts"] == 1
        grandchild = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(grandchild)  # killed with the hung worker's process group
        workers += scorer.worker_pids()
    for pid in workers:
        assert not alive(pid)
    scorer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        scorer.score(["x"], ["y"])


def test_spawn_start_method(verifier_file):
    with RewardScorer(
        ["acc", "itest_crash"], None, 1, 30.0, verifier_files=[verifier_file], start_method="spawn"
    ) as scorer:
        pids = scorer.worker_pids()
        (scores, _, metrics) = call_within(
            lambda: scorer.score([r"\boxed{3}", "EXIT \\boxed{3}"], ["3", "3"]), 120
        )
    assert scores == [1.5, 1.0]
    assert metrics["reward/errors"] == 1
    assert not any(alive(pid) for pid in pids)
