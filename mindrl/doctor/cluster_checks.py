"""Checks against the Ray cluster the run would use: its nodes and resources against the
placement plan, what each worker sees under that placement (devices, free memory against the
memory plan), and whether the save folder is one folder for every node."""

from __future__ import annotations

import secrets
from typing import Any

from mindrl.cluster.placement import ClusterResources, PlacementPlan
from mindrl.doctor import node_probes
from mindrl.doctor.remote import NodeInfo, Where, submit, wait_all
from mindrl.doctor.report import CheckResult
from mindrl.doctor.settings import DoctorSettings

GIB = float(1 << 30)
PROBE_S = 180.0  # a worker process's start on a busy node, and its answer


def placement_plan(settings: DoctorSettings, cluster: ClusterResources) -> PlacementPlan | None:
    """The config's placement plan on this cluster (None without a config)."""
    if settings.run is None:
        return None
    from mindrl.cluster.placement import plan_placement

    res = settings.accelerator.ray_resource
    return plan_placement(settings.run, res, cluster.max_per_node(res))


def cluster_check(settings: DoctorSettings, nodes: list[NodeInfo]) -> CheckResult:
    """Nodes and their resources; the plan's demand against them."""
    acc = settings.accelerator
    cluster = ClusterResources(nodes=tuple(n.resources for n in nodes))
    shown = "; ".join(
        f"{n.address}: "
        + ", ".join(
            f"{k} {n.resources.get(k, 0):g}" for k in ("CPU", "GPU", "NPU") if k in n.resources
        )
        for n in nodes
    )
    details: dict[str, Any] = {
        "nodes": [{"address": n.address, "resources": n.resources} for n in nodes]
    }
    plan = placement_plan(settings, cluster)
    if plan is not None:
        details["plan"] = plan.describe()
        problems = plan.fit_problems(cluster)
        if problems:
            fix = (
                "; ".join(problems)
                + ": add nodes (ray start --address ...) or lower the *_resource counts"
            )
            return CheckResult("ray", "fail", problems[0], fix, details)
        need = ", ".join(f"{k} {v:g}" for k, v in plan.demand().items())
        return CheckResult(
            "ray", "pass", f"{len(nodes)} node(s) ({shown}); the plan needs {need}", "", details
        )
    most = max((n.devices(acc) for n in nodes), default=0)
    if not acc.is_cpu and most < settings.tp:
        fix = f"TP {settings.tp} needs {settings.tp} {acc.ray_resource} on one node; Ray sees at most {most}"
        return CheckResult(
            "ray",
            "fail",
            fix,
            "start Ray with the node's devices (ray start --num-gpus / --resources)",
            details,
        )
    return CheckResult("ray", "pass", f"{len(nodes)} node(s) ({shown})", "", details)


def devices_check(settings: DoctorSettings, nodes: list[NodeInfo]) -> CheckResult:
    """One task per placement bundle (the config's plan) or per node (defaults): the devices it
    sees and their free memory, against the memory plan's peak per device (host memory on CPU)."""
    from mindrl.cluster.placement_groups import create_placement_groups, remove_placement_groups

    acc = settings.accelerator
    plan = placement_plan(settings, ClusterResources(nodes=tuple(n.resources for n in nodes)))
    groups: dict[str, Any] = {}
    try:
        if plan is not None:
            groups = create_placement_groups(plan, timeout_s=PROBE_S)
            spots = [
                (f"{g.name}[{i}]", Where(placement_group=groups[g.name], bundle=i))
                for g in plan.groups
                for i in range(g.num_devices)
            ]
        else:
            spots = [
                (n.address, Where(node_id=n.node_id)) for n in nodes if acc.is_cpu or n.devices(acc)
            ]
        refs = [
            submit(
                acc,
                node_probes.worker_view,
                acc.name,
                acc.visible_devices_env,
                where=w,
                device=not acc.is_cpu,
            )
            for _, w in spots
        ]
        views = wait_all(refs, PROBE_S, "devices")
    finally:
        remove_placement_groups(groups)
    workers = [{"where": name, **view} for (name, _), view in zip(spots, views)]
    details: dict[str, Any] = {"workers": workers}
    fails: list[str] = []
    if acc.is_cpu:
        need = settings.host_bytes
        for w in workers:
            if need is not None and w["available_host_bytes"] < need:
                fails.append(
                    f"{w['where']}: {w['available_host_bytes'] / GIB:.1f} GiB of host memory "
                    f"available, the memory plan needs {need / GIB:.1f} GiB"
                )
        summary = ", ".join(
            f"{w['where']}: {w['available_host_bytes'] / GIB:.1f} GiB free" for w in workers
        )
    else:
        need = settings.device_bytes
        for w in workers:
            if w["devices"] < 1:
                fails.append(
                    f"{w['where']}: no {acc.name} device visible ({acc.visible_devices_env}={w['visible']!r})"
                )
            elif need is not None and w["free_bytes"] < need:
                fails.append(
                    f"{w['where']}: {w['free_bytes'] / GIB:.1f} GiB free on device "
                    f"{w['visible']}, the memory plan's peak is {need / GIB:.1f} GiB"
                )
        summary = ", ".join(
            f"{w['where']}: {acc.visible_devices_env}={w['visible']} {w['free_bytes'] / GIB:.1f}/"
            f"{(w['total_bytes'] or 0) / GIB:.1f} GiB free"
            for w in workers
        )
    if need is not None:
        details["needed_bytes"] = need
    if fails:
        fix = "free the memory other processes hold there (nvidia-smi / npu-smi / top), or shrink the plan (the dry run names the knob)"
        return CheckResult("devices", "fail", "; ".join(fails), fix, details)
    return CheckResult("devices", "pass", summary, "", details)


def save_folder_check(settings: DoctorSettings, nodes: list[NodeInfo]) -> CheckResult:
    """Write a marker into the save folder from the first node, read it on every node.

    The folder is resolved on each node (`node_probes.node_folder`): a folder that is a local
    disk on each node, or names another path per node, is not where a resume would look."""
    acc = settings.accelerator
    folder = str(settings.save_dir)
    token = secrets.token_hex(8)
    writer = nodes[0]
    try:
        wrote = wait_all(
            [
                submit(
                    acc,
                    node_probes.write_marker,
                    folder,
                    token,
                    where=Where(node_id=writer.node_id),
                )
            ],
            PROBE_S,
            "save folder",
        )[0]
    except OSError as exc:
        fix = f"make {folder} writable from every node (a shared file system)"
        return CheckResult(
            "save_folder", "fail", f"cannot write {folder} on {writer.address}: {exc}", fix
        )
    refs = [
        submit(acc, node_probes.read_marker, folder, token, where=Where(node_id=n.node_id))
        for n in nodes
    ]
    reads = wait_all(refs, PROBE_S, "save folder")
    wait_all(
        [
            submit(
                acc, node_probes.remove_marker, folder, token, where=Where(node_id=writer.node_id)
            )
        ],
        PROBE_S,
        "save folder",
    )
    seen = [{"node": n.address, **r} for n, r in zip(nodes, reads)]
    details = {"folder": folder, "written": {"node": writer.address, **wrote}, "read": seen}
    missing = [r for r in seen if not r["ok"]]
    if missing:
        names = ", ".join(f"{r['node']} (as {r['path']})" for r in missing)
        summary = f"{folder}: written on {writer.address} as {wrote['path']}, not seen on {names}"
        fix = (
            "point actor_config.save (and load) at storage every node mounts at the same path "
            "(NFS, a parallel file system), with no per-node variables in it"
        )
        return CheckResult("save_folder", "fail", summary, fix, details)
    note = "" if len(nodes) > 1 else " (one node)"
    return CheckResult(
        "save_folder",
        "pass",
        f"{folder}: written on {writer.address}, read on {len(nodes)} node(s){note}",
        "",
        details,
    )
