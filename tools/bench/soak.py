"""Soak: a long tiny run, its resources sampled every N steps, growth after warm-up reported.

Runs `cli/train_grpo.py --config-name grpo_tiny_cpu` (the lean variant of tools/bench/tiny_step.py:
the reference in the actor's processes) for `--steps` steps on an embedded Ray cluster, with a
checkpoint every `--save-every` steps and `actor_config.keep_last_n_checkpoints` rotating them.
Every `--sample-every` steps (read from the run's metrics.jsonl) it records, for every process of
the run's tree (driver, Ray's GCS and raylet, every Ray worker, the vLLM engine processes):
resident memory, open file descriptors and threads; the Ray object store's bytes and objects
(asked of the run's raylet through its GCS); the size of the run's log files (mindrl's
OUTPUT_DIR/logs and Ray's session logs), of metrics.jsonl / TensorBoard, and of the checkpoint
folder with its checkpoint names.

The summary compares the sample at `--warmup-step` with the last: RSS growth per process (and
summed), fd and thread deltas, processes started or gone, object store, checkpoint folder
(bounded by the rotation) and the per-step growth of the logs. JSON to `--json`, one summary line
last on stdout.

    python tools/bench/soak.py                      # 500 steps, checkpoints every 50, keep 2
    python tools/bench/soak.py --steps 60 --save-every 10 --sample-every 10 --warmup-step 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mindrl.cluster.ray_cluster import LOOPBACK_ONLY_ENV  # noqa: E402
from tools.bench.tiny_step import LEAN  # noqa: E402

# before Ray is imported: else Ray's client swaps the run's 127.0.0.1 for the host's address
os.environ.update(LOOPBACK_ONLY_ENV)

CONFIG = "grpo_tiny_cpu"
GCS_ADDRESS_RE = re.compile(r"--gcs-address=(\S+)")
# `python -c "from multiprocessing.X import main..."` children, named by X
MULTIPROCESSING_ROLES = ("spawn", "forkserver", "resource_tracker")
SESSION_DIR_RE = re.compile(r"--session-dir=(\S+)|--session_dir=(\S+)")


@dataclass
class ProcessSample:
    """One process of the run at one sample."""

    pid: int
    role: str  # stable across the process's life: Ray's `ray::ClassName`, not its method
    rss_mib: float
    fds: int
    threads: int


@dataclass
class Sample:
    step: int
    time: float
    processes: list[ProcessSample]
    object_store_bytes: int | None
    object_store_objects: int | None
    checkpoints: list[str]
    checkpoint_bytes: int
    log_bytes: int  # OUTPUT_DIR/logs and Ray's session logs
    metrics_bytes: int  # metrics.jsonl and the TensorBoard folder
    output_bytes: int  # the whole output folder


@dataclass
class SoakSettings:
    steps: int = 500
    save_every: int = 50
    keep: int = 2
    sample_every: int = 50
    warmup_step: int = 100
    extra_overrides: list[str] = field(default_factory=list)

    def overrides(self, out_dir: Path) -> list[str]:
        return [
            *LEAN,
            "runtime.ray_address=local",  # the run's own cluster, whatever else is running
            f"runtime.output_dir={out_dir}",
            f"actor_config.save={out_dir / 'ckpt'}",
            # two steps past the last multiple: its sample (taken once the step after it is
            # recorded) sees the steady state, not the run's final save, export and teardown
            f"megatron_training.train_iters={self.steps + 2}",
            f"megatron_training.save_interval={self.save_every}",
            f"actor_config.keep_last_n_checkpoints={self.keep}",
            *self.extra_overrides,
        ]


def role_of(name: str, cmdline: list[str]) -> str:
    """A stable name for a process: Ray rewrites a worker's title to `ray::Class.method` while a
    method runs, so the method is dropped; other processes by their executable and module."""
    if name.startswith("ray::") or (cmdline and cmdline[0].startswith("ray::")):
        title = cmdline[0] if cmdline and cmdline[0].startswith("ray::") else name
        return title.split()[0].split(".")[0]
    joined = " ".join(cmdline)
    for marker in MULTIPROCESSING_ROLES:  # e.g. vLLM's engine core, the verifier pool
        if f"multiprocessing.{marker}" in joined:
            return f"multiprocessing.{marker}"
    for marker in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env"):
        if marker in joined:
            return marker
    if "-m" in cmdline:
        return cmdline[cmdline.index("-m") + 1]
    script = next((Path(a).name for a in cmdline[1:] if a.endswith(".py")), None)
    return script or name


def folder_bytes(folder: Path) -> int:
    total = 0
    if folder.is_dir():
        for path in folder.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink():
                    total += path.stat().st_size
            except OSError:  # removed meanwhile (a rotated checkpoint)
                pass
    return total


def _cluster_info(procs: list[Any]) -> tuple[str | None, Path | None]:
    """The run's GCS address and Ray session folder, from its raylet's command line."""
    for proc in procs:
        try:
            joined = " ".join(proc.cmdline())
        except Exception:
            continue
        if "raylet" in joined and "--gcs-address" in joined:
            gcs = GCS_ADDRESS_RE.search(joined)
            session = SESSION_DIR_RE.search(joined)
            path = next((g for g in session.groups() if g), None) if session else None
            return (gcs.group(1) if gcs else None), (Path(path) if path else None)
    return None, None


def object_store_usage(gcs_address: str) -> tuple[int, int]:
    """Bytes and objects in the cluster's object store, as `ray memory --stats-only` reads
    them: the raylets' store stats through the GCS, without joining the cluster as a driver."""
    from mindrl.cluster.ray_cluster import use_token_auth_for_address

    use_token_auth_for_address(gcs_address)  # the run's GCS asks for Ray's token
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(gcs_address), timeout_seconds=30)
    stats = reply.store_stats
    return int(stats.object_store_bytes_used), int(stats.num_local_objects)


def sample_run(root_pid: int, step: int, out_dir: Path) -> Sample:
    import psutil

    root = psutil.Process(root_pid)
    procs = [root, *root.children(recursive=True)]
    rows = []
    for proc in procs:
        try:
            with proc.oneshot():
                rows.append(
                    ProcessSample(
                        proc.pid,
                        role_of(proc.name(), proc.cmdline()),
                        round(proc.memory_info().rss / 2**20, 1),
                        proc.num_fds(),
                        proc.num_threads(),
                    )
                )
        except psutil.Error:  # ended meanwhile
            continue
    gcs, session = _cluster_info(procs)
    store_bytes = store_objects = None
    if gcs is not None:
        try:
            store_bytes, store_objects = object_store_usage(gcs)
        except Exception as exc:
            print(f"soak: object store at step {step} unreadable: {exc}", file=sys.stderr)
    ckpt = out_dir / "ckpt"
    names = sorted(p.name for p in ckpt.glob("iter_*")) if ckpt.is_dir() else []
    metrics = out_dir / "metrics.jsonl"
    return Sample(
        step=step,
        time=time.time(),
        processes=rows,
        object_store_bytes=store_bytes,
        object_store_objects=store_objects,
        checkpoints=names,
        checkpoint_bytes=folder_bytes(ckpt),
        log_bytes=folder_bytes(out_dir / "logs")
        + (folder_bytes(session / "logs") if session else 0),
        metrics_bytes=(metrics.stat().st_size if metrics.exists() else 0)
        + folder_bytes(out_dir / "tensorboard"),
        output_bytes=folder_bytes(out_dir),
    )


def last_step(metrics: Path) -> int:
    """The newest training step recorded in metrics.jsonl (0 before the first)."""
    if not metrics.exists():
        return 0
    step = 0
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line being written
            continue
        if "timing/step" in record:
            step = max(step, int(record["step"]))
    return step


RAY_START_TIMEOUT = "The current node timed out during startup"
POLL_S = 1.0  # metrics.jsonl read this often (a whole read: cheap beside a step)


def run_soak(
    settings: SoakSettings, out_dir: Path, time_limit_s: float, start_tries: int = 3
) -> tuple[list[Sample], bool]:
    """Run the soak; a sample each time the run has passed a multiple of `sample_every` by
    one step (that multiple's checkpoint save complete; taken while the next step runs). Returns the samples and
    whether the run reached `steps`: past `time_limit_s` it is stopped and the samples so far
    are returned. Ray gives its node a fixed 30 s to start, which a busy shared host can
    miss: such a start is tried again."""
    for attempt in range(1, start_tries + 1):
        try:
            return _run_once(settings, out_dir, time_limit_s)
        except RuntimeError as exc:
            if RAY_START_TIMEOUT not in str(exc) or attempt == start_tries:
                raise
            print(f"soak: Ray's node did not start in time (try {attempt}); again", flush=True)
    raise AssertionError("unreachable")


def _run_once(
    settings: SoakSettings, out_dir: Path, time_limit_s: float
) -> tuple[list[Sample], bool]:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    cmd = [sys.executable, "cli/train_grpo.py", "--config-name", CONFIG]
    cmd += settings.overrides(out_dir)
    print("soak:", " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    samples: list[Sample] = []
    with open(out_dir / "soak_run.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        deadline = time.monotonic() + time_limit_s
        next_sample = settings.sample_every
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    print(f"soak: stopped at the {time_limit_s:.0f} s limit", flush=True)
                    proc.send_signal(signal.SIGTERM)  # the driver stops its cluster itself
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        pass
                    return samples, False
                step = last_step(out_dir / "metrics.jsonl")
                # a step past each multiple: its checkpoint save (writer threads, megatron's
                # helper processes, the temporary folder) has finished by then
                if next_sample < step <= settings.steps + 1:
                    samples.append(sample_run(proc.pid, step, out_dir))
                    print(f"soak: {summary_of_sample(samples[-1])}", flush=True)
                    next_sample = (step // settings.sample_every + 1) * settings.sample_every
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    if proc.returncode != 0:
        tail = (out_dir / "soak_run.log").read_text()[-3000:]
        raise RuntimeError(f"the soak run failed with exit code {proc.returncode}:\n{tail}")
    return samples, True


def summary_of_sample(s: Sample) -> str:
    rss = sum(p.rss_mib for p in s.processes)
    return (
        f"step {s.step}: {len(s.processes)} processes, RSS {rss:.0f} MiB, "
        f"fds {sum(p.fds for p in s.processes)}, threads {sum(p.threads for p in s.processes)}, "
        f"object store {s.object_store_bytes} B / {s.object_store_objects} objects, "
        f"checkpoints {s.checkpoints} ({s.checkpoint_bytes / 2**20:.1f} MiB), "
        f"logs {s.log_bytes / 2**10:.0f} KiB, metrics {s.metrics_bytes / 2**10:.0f} KiB"
    )


def growth(samples: list[Sample], warmup_step: int) -> dict[str, Any]:
    """From the first sample at or after `warmup_step` to the last: per process (by pid, alive
    in both) RSS growth %, fd and thread deltas; processes started / gone; the object store's,
    the checkpoint folder's, the logs' and metrics' change."""
    base = next((s for s in samples if s.step >= warmup_step), None)
    last = samples[-1] if samples else None
    if base is None or last is None or base is last:
        raise ValueError(
            f"need samples after step {warmup_step}: got steps {[s.step for s in samples]}"
        )
    before = {p.pid: p for p in base.processes}
    after = {p.pid: p for p in last.processes}
    per_process = {}
    for pid in sorted(before.keys() & after.keys()):
        b, a = before[pid], after[pid]
        per_process[f"{b.role}[{pid}]"] = {
            "rss_mib": [b.rss_mib, a.rss_mib],
            "rss_growth_pct": round(100 * (a.rss_mib - b.rss_mib) / max(b.rss_mib, 1e-9), 2),
            "fds_delta": a.fds - b.fds,
            "threads_delta": a.threads - b.threads,
        }
    rss_b = sum(p.rss_mib for p in base.processes)
    rss_a = sum(p.rss_mib for p in last.processes)
    steps = last.step - base.step
    return {
        "from_step": base.step,
        "to_step": last.step,
        "per_process": per_process,
        "max_rss_growth_pct": max(v["rss_growth_pct"] for v in per_process.values()),
        "total_rss_mib": [round(rss_b, 1), round(rss_a, 1)],
        "total_rss_growth_pct": round(100 * (rss_a - rss_b) / rss_b, 2),
        "fds_delta": sum(p.fds for p in last.processes) - sum(p.fds for p in base.processes),
        "threads_delta": sum(p.threads for p in last.processes)
        - sum(p.threads for p in base.processes),
        "processes_started": sorted(f"{after[p].role}[{p}]" for p in after.keys() - before),
        "processes_gone": sorted(f"{before[p].role}[{p}]" for p in before.keys() - after),
        "object_store_bytes": [base.object_store_bytes, last.object_store_bytes],
        "object_store_objects": [base.object_store_objects, last.object_store_objects],
        "checkpoints_last": last.checkpoints,
        "max_checkpoints_kept": max(len(s.checkpoints) for s in samples),
        "checkpoint_mib_max": round(max(s.checkpoint_bytes for s in samples) / 2**20, 2),
        "log_bytes_per_step": round((last.log_bytes - base.log_bytes) / max(steps, 1), 1),
        "metrics_bytes_per_step": round(
            (last.metrics_bytes - base.metrics_bytes) / max(steps, 1), 1
        ),
    }


def summary_line(g: dict[str, Any]) -> str:
    store = g["object_store_bytes"]
    return (
        f"soak: steps {g['from_step']}->{g['to_step']}: RSS {g['total_rss_mib'][0]:.0f}->"
        f"{g['total_rss_mib'][1]:.0f} MiB ({g['total_rss_growth_pct']:+.2f}%, worst process "
        f"{g['max_rss_growth_pct']:+.2f}%), fds {g['fds_delta']:+d}, threads "
        f"{g['threads_delta']:+d}, processes +{len(g['processes_started'])}/"
        f"-{len(g['processes_gone'])}, object store {store[0]}->{store[1]} B, checkpoints "
        f"<= {g['max_checkpoints_kept']} kept ({g['checkpoint_mib_max']} MiB max), logs "
        f"+{g['log_bytes_per_step']:.0f} B/step, metrics +{g['metrics_bytes_per_step']:.0f} B/step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = SoakSettings()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--save-every", type=int, default=defaults.save_every)
    parser.add_argument("--keep", type=int, default=defaults.keep)
    parser.add_argument("--sample-every", type=int, default=defaults.sample_every)
    parser.add_argument("--warmup-step", type=int, default=defaults.warmup_step)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "soak")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "soak.json")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=4 * 3600,
        help="seconds; past it the run is stopped and the samples so far are reported",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the run")
    args = parser.parse_args()
    settings = SoakSettings(
        args.steps,
        args.save_every,
        args.keep,
        args.sample_every,
        args.warmup_step,
        args.overrides,
    )
    samples, finished = run_soak(settings, args.out, args.time_limit)
    result = {
        "finished": finished,
        "settings": asdict(settings),
        "overrides": settings.overrides(args.out),
        "samples": [asdict(s) for s in samples],
        "growth": growth(samples, settings.warmup_step),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    partial = (
        ""
        if finished
        else f" (stopped at the time limit: {samples[-1].step} of {args.steps} steps)"
    )
    print(summary_line(result["growth"]) + partial)


if __name__ == "__main__":
    main()
