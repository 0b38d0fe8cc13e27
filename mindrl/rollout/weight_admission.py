"""Who may join a weight-transfer group: only processes that know the run's token.

A TCPStore has no authentication: any process that reaches its port can read, write and list
its keys. So the trainer draws a fresh random token per link and hands it to the server only
over the authenticated HTTP channel (`/init_weight_transfer_engine`, which carries the API
key). Before the gloo group forms, each server worker announces itself on the store (its
rank, the world size it expects, an HMAC of both under the token); the trainer admits the
group only when exactly the expected ranks announced themselves with valid proofs, and
answers with a proof of its own, which every worker checks: a stray peer is refused and named
on both sides. Once the group has formed, every member's proof is exchanged over the group
itself, so a peer that slipped into gloo's own rendezvous is caught before any weight moves.
Every wait is bounded by the link's timeout.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
import socket
from typing import Any

import torch

ARRIVALS = "mindrl-admission/arrivals"
PEER = "mindrl-admission/peer"
VERDICT = "mindrl-admission/verdict"
TRAINER = "trainer"
WORKER = "worker"


class WeightPeerRefused(RuntimeError):
    """A process that may not join the weight transfer tried to, or a side gave no proof."""


def new_token() -> str:
    return secrets.token_hex(32)


def proof(token: str, role: str, rank: int, world_size: int) -> str:
    """What only a holder of `token` can write for (`role`, `rank`, `world_size`)."""
    message = f"{role}:{rank}:{world_size}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def _wait(store: Any, keys: list[str], timeout_s: float, what: str) -> None:
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except RuntimeError as err:  # torch's DistStoreError (a timeout) derives from it
        raise WeightPeerRefused(f"{what}: nothing within {timeout_s:g} s ({err})") from err


def announce(store: Any, token: str, rank: int, world_size: int, timeout_s: float) -> None:
    """A server worker's side: announce this rank, then check the trainer's verdict."""
    slot = store.add(ARRIVALS, 1)
    entry = {
        "rank": rank,
        "world_size": world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "proof": proof(token, WORKER, rank, world_size),
    }
    store.set(f"{PEER}/{slot}", json.dumps(entry))
    _wait(store, [VERDICT], timeout_s, f"rank {rank} waited for the trainer's admission")
    verdict = json.loads(store.get(VERDICT))
    if "refused" in verdict:
        raise WeightPeerRefused(
            f"the trainer refused the weight-transfer group: {verdict['refused']}"
        )
    if not hmac.compare_digest(str(verdict.get("proof")), proof(token, TRAINER, 0, world_size)):
        raise WeightPeerRefused(
            "the weight-sync store answered without proof of the run's token: the process "
            "listening there is not the trainer that asked for weights"
        )


def _entry_problem(entry: dict[str, Any], token: str, world_size: int, seen: set[int]) -> str:
    rank, world = entry.get("rank"), entry.get("world_size")
    who = f"a peer (says host {entry.get('host')!r}, pid {entry.get('pid')}) as rank {rank}"
    if world != world_size:
        return f"{who} expects a group of {world}, this one has {world_size}"
    if not isinstance(rank, int) or not 1 <= rank < world_size:
        return f"{who}: not a rank of this group (1 .. {world_size - 1})"
    if rank in seen:
        return f"{who}: rank {rank} announced twice"
    if not hmac.compare_digest(str(entry.get("proof")), proof(token, WORKER, rank, world_size)):
        return f"{who}: no proof of the run's token"
    return ""


def admit(store: Any, token: str, world_size: int, timeout_s: float, where: str) -> None:
    """The trainer's side: admit exactly ranks 1 .. world_size-1, each with a valid proof;
    anything else is refused (on the store too, so the workers stop waiting) and named."""
    expected = world_size - 1
    keys = [f"{PEER}/{slot}" for slot in range(1, expected + 1)]
    _wait(store, keys, timeout_s, f"the weight-sync store {where} waited for {expected} rank(s)")
    problems: list[str] = []
    seen: set[int] = set()
    for key in keys:
        try:
            entry = json.loads(store.get(key))
        except ValueError:
            entry = {"rank": None}
        problem = _entry_problem(entry if isinstance(entry, dict) else {}, token, world_size, seen)
        if problem:
            problems.append(problem)
        else:
            seen.add(entry["rank"])
    arrived = store.add(ARRIVALS, 0)
    if arrived > expected:
        problems.append(f"{arrived} peers announced themselves, {expected} expected")
    if problems:
        reason = f"stray peer on the weight-sync store {where}: " + "; ".join(problems)
        store.set(VERDICT, json.dumps({"refused": reason}))
        raise WeightPeerRefused(reason)
    store.set(VERDICT, json.dumps({"proof": proof(token, TRAINER, 0, world_size)}))


def check_group(group: Any, token: str, rank: int, world_size: int) -> None:
    """Every member's proof over the formed group; raises naming the ranks without one."""

    def digest(role: str, r: int) -> torch.Tensor:
        raw = bytes.fromhex(proof(token, role, r, world_size))
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    mine = digest(TRAINER if rank == 0 else WORKER, rank)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    group.allgather([gathered], [mine]).wait()
    wrong = [
        r
        for r in range(world_size)
        if not torch.equal(gathered[r], digest(TRAINER if r == 0 else WORKER, r))
    ]
    if wrong:
        raise WeightPeerRefused(
            f"rank(s) {wrong} of the weight-transfer group gave no proof of the run's token: "
            "a stray peer joined the group"
        )
