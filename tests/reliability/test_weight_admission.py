"""The weight-transfer rendezvous admits only the expected ranks (`weight_admission`), on a
real TCPStore bound to the address and port the test chose, with real gloo groups: honest
workers that hold the token are admitted and prove themselves over the formed group; a stray
peer (no token, a wrong group size, an unknown rank, one peer too many) is refused and named
on both sides, and no side waits past the configured timeout. A store that cannot prove the
token is refused by the worker."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mindrl.rollout.gloo_link import open_group, open_store
from mindrl.rollout.weight_admission import (
    PEER,
    VERDICT,
    WeightPeerRefused,
    admit,
    announce,
    check_group,
    new_token,
    proof,
)
from tests.fresh_process import free_port

HOST = "127.0.0.1"
TIMEOUT_S = 8.0  # the link's configured timeout: every wait below is bounded by it


def worker(port: int, token: str, rank: int, world: int) -> str:
    """A server worker's side, as `vllm_gloo_engine` runs it."""
    store = open_store(HOST, port, world, master=False, timeout_s=TIMEOUT_S)
    announce(store, token, rank, world, TIMEOUT_S)
    group = open_group(store, rank, world, HOST, TIMEOUT_S)
    check_group(group, token, rank, world)
    return "joined"


def stray(port: int, world: int, **entry) -> None:
    """A process that reached the store and announces itself without the run's token."""
    store = open_store(HOST, port, world, master=False, timeout_s=TIMEOUT_S)
    slot = store.add("mindrl-admission/arrivals", 1)
    body = {"rank": 1, "world_size": world, "host": "stray", "pid": 4242, "proof": "00"}
    store.set(f"{PEER}/{slot}", json.dumps({**body, **entry}))


def trainer(store, token: str, world: int) -> str:
    admit(store, token, world, TIMEOUT_S, f"{HOST}:{store.port}")
    group = open_group(store, 0, world, HOST, TIMEOUT_S)
    check_group(group, token, 0, world)
    return "admitted"


def test_the_store_listens_on_the_chosen_port_and_admits_the_honest_workers():
    port = free_port()
    world, token = 3, new_token()
    store = open_store(HOST, port, world, master=True, timeout_s=TIMEOUT_S)
    assert store.port == port
    with ThreadPoolExecutor(3) as pool:
        workers = [pool.submit(worker, port, token, r, world) for r in (1, 2)]
        assert trainer(store, token, world) == "admitted"
        assert [w.result(timeout=TIMEOUT_S) for w in workers] == ["joined", "joined"]


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({}, "no proof of the run's token"),
        ({"world_size": 7}, "expects a group of 7, this one has 2"),
        ({"rank": 5, "proof": None}, "not a rank of this group"),
    ],
    ids=["no-token", "wrong-rank-count", "unknown-rank"],
)
def test_a_stray_peer_first_on_the_store_is_refused_and_named(entry, named):
    port = free_port()
    world, token = 2, new_token()
    store = open_store(HOST, port, world, master=True, timeout_s=TIMEOUT_S)
    stray(port, world, **entry)  # arrives before the server's worker
    with ThreadPoolExecutor(1) as pool:
        honest = pool.submit(worker, port, token, 1, world)
        start = time.monotonic()
        with pytest.raises(WeightPeerRefused, match="stray peer on the weight-sync store") as err:
            trainer(store, token, world)
        assert named in str(err.value) and "'stray', pid 4242" in str(err.value)
        assert f"{HOST}:{port}" in str(err.value)
        # the worker learns of the refusal from the store instead of waiting for a group
        with pytest.raises(WeightPeerRefused, match="the trainer refused"):
            honest.result(timeout=TIMEOUT_S)
        assert time.monotonic() - start < 2 * TIMEOUT_S


def test_one_peer_too_many_is_refused():
    port = free_port()
    world, token = 2, new_token()
    store = open_store(HOST, port, world, master=True, timeout_s=TIMEOUT_S)
    with ThreadPoolExecutor(1) as pool:
        honest = pool.submit(worker, port, token, 1, world)
        store.wait([f"{PEER}/1"])  # the worker first: the stray takes the next slot
        stray(port, world, rank=1, proof=proof(token, "worker", 1, world))  # even a replay
        with pytest.raises(WeightPeerRefused, match="2 peers announced themselves, 1 expected"):
            trainer(store, token, world)
        with pytest.raises(WeightPeerRefused):
            honest.result(timeout=TIMEOUT_S)


def test_a_store_without_the_token_is_refused_by_the_worker():
    port = free_port()
    world = 2
    impostor = open_store(HOST, port, world, master=True, timeout_s=TIMEOUT_S)
    impostor.set(VERDICT, json.dumps({"proof": proof(new_token(), "trainer", 0, world)}))
    with pytest.raises(WeightPeerRefused, match="not the trainer that asked"):
        worker(port, new_token(), 1, world)


def test_nobody_arriving_ends_within_the_timeout():
    store = open_store(HOST, 0, 2, master=True, timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(WeightPeerRefused, match="waited for 1 rank"):
        admit(store, new_token(), 2, 1.0, "here")
    assert time.monotonic() - start < 1.0 + 5.0
