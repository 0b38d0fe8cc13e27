"""Benchmark: HF -> megatron -> HF conversion of SmolLM2-135M against the safetensors I/O floor.

    python tools/bench/convert.py [--hf-dir DIR] [--repeats 2] [--tp 3 --pp 2]

Our time: `convert_hf_to_mcore` (target TP/PP) then `convert_mcore_to_hf`, in this process
(imports warmed up first). The floor, in the same run: read every tensor of the HF folder with
safetensors and write it to a new file, then read that file and write another (the same two
reads and two writes of the same bytes the conversion does), each written file fsynced as the
converter's are. Best of --repeats for both. ratio = floor / ours (higher is better).

Peak memory of each direction is measured in a fresh subprocess (ru_maxrss of the process
and of the dist_checkpointing writer processes it forks), minus the RSS after imports.
SmolLM2 has 9 heads / 3 kv heads, so TP=2 cannot split it; the default target is TP=3, PP=2.
Writes bench/results/convert.json; the last line is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TARGET = 0.5


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def floor_pass(src_dir: Path, work: Path) -> float:
    """Read all HF tensors -> write a file -> read it back -> write another (fsynced)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    start = time.perf_counter()
    tensors = {}
    for file in sorted(src_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for name in fh.keys():
                tensors[name] = fh.get_tensor(name)
    first = work / "floor_a.safetensors"
    save_file(tensors, str(first))
    _fsync(first)
    del tensors
    again = {k: v.clone() for k, v in load_file(str(first)).items()}
    second = work / "floor_b.safetensors"
    save_file(again, str(second))
    _fsync(second)
    elapsed = time.perf_counter() - start
    del again, torch
    first.unlink()
    second.unlink()
    return elapsed


def ours_pass(src_dir: Path, work: Path, tp: int, pp: int) -> dict[str, float]:
    from mindrl.checkpoint.offline import convert_hf_to_mcore, convert_mcore_to_hf

    mg, hf = work / "mg", work / "hf"
    t0 = time.perf_counter()
    convert_hf_to_mcore(
        src_dir, mg, target_tensor_parallel_size=tp, target_pipeline_parallel_size=pp
    )
    t1 = time.perf_counter()
    convert_mcore_to_hf(mg, hf)
    t2 = time.perf_counter()
    shutil.rmtree(mg)
    shutil.rmtree(hf)
    return {"hf_to_mcore_s": t1 - t0, "mcore_to_hf_s": t2 - t1, "total_s": t2 - t0}


def check_exact(src_dir: Path, work: Path, tp: int, pp: int) -> bool:
    import torch
    from safetensors.torch import load_file

    from mindrl.checkpoint.offline import convert_hf_to_mcore, convert_mcore_to_hf

    convert_hf_to_mcore(
        src_dir, work / "mg", target_tensor_parallel_size=tp, target_pipeline_parallel_size=pp
    )
    convert_mcore_to_hf(work / "mg", work / "hf")
    a = load_file(str(src_dir / "model.safetensors"))
    b = load_file(str(work / "hf" / "model.safetensors"))
    ok = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    shutil.rmtree(work / "mg")
    shutil.rmtree(work / "hf")
    return ok


def _status_kib(field: str) -> int:
    """VmRSS / VmHWM from /proc/self/status (VmHWM is per process image, unlike ru_maxrss,
    which Linux carries over from the parent across fork + exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(direction: str, src: str, dst: str, tp: int, pp: int) -> None:
    """One conversion direction in a fresh process; prints its memory as JSON."""
    warnings.filterwarnings("ignore")
    import megatron.core.dist_checkpointing  # noqa: F401  (imports before the baseline)
    import megatron.core.models.gpt  # noqa: F401

    from mindrl.checkpoint import offline

    base = _status_kib("VmRSS") * 1024
    if direction == "hf2mg":
        offline.convert_hf_to_mcore(
            src, dst, target_tensor_parallel_size=tp, target_pipeline_parallel_size=pp
        )
    else:
        offline.convert_mcore_to_hf(src, dst)
    peak = _status_kib("VmHWM") * 1024
    # the dist_checkpointing writers are forked: their ru_maxrss starts at ours at fork time
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"baseline_rss": base, "peak_rss": peak, "children_peak_rss": children}))


def measure_memory(src_dir: Path, work: Path, tp: int, pp: int) -> dict[str, dict[str, float]]:
    out = {}
    for direction, src, dst in (
        ("hf2mg", src_dir, work / "mem_mg"),
        ("mg2hf", work / "mem_mg", work / "mem_hf"),
    ):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", direction, str(src), str(dst), str(tp), str(pp)],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        m = json.loads(proc.stdout.strip().splitlines()[-1])
        gib = float(1 << 30)
        out[direction] = {
            "peak_rss_gib": m["peak_rss"] / gib,
            "peak_above_baseline_gib": (m["peak_rss"] - m["baseline_rss"]) / gib,
            "forked_writers_peak_rss_gib": m["children_peak_rss"] / gib,
        }
    shutil.rmtree(work / "mem_mg")
    shutil.rmtree(work / "mem_hf")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-dir", help="HF folder (default: SmolLM2-135M-Instruct test asset)")
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "convert.json"))
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        direction, src, dst, tp, pp = args.child
        child(direction, src, dst, int(tp), int(pp))
        return
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)
    if args.hf_dir:
        src_dir = Path(args.hf_dir)
    else:
        from mindrl.assets.smollm2 import smollm2_dir

        src_dir = smollm2_dir()
    nbytes = sum(f.stat().st_size for f in src_dir.glob("*.safetensors"))
    with tempfile.TemporaryDirectory(
        dir=REPO / "bench" if (REPO / "bench").is_dir() else None
    ) as tmp:
        work = Path(tmp)
        exact = check_exact(src_dir, work, args.tp, args.pp)  # also warms imports and page cache
        ours, floors = [], []
        for _ in range(args.repeats):
            floors.append(floor_pass(src_dir, work))
            ours.append(ours_pass(src_dir, work, args.tp, args.pp))
        memory = measure_memory(src_dir, work, args.tp, args.pp)
    best = min(ours, key=lambda r: r["total_s"])
    floor = min(floors)
    ratio = floor / best["total_s"]
    result = {
        "model_dir": str(src_dir),
        "safetensors_bytes": nbytes,
        "target_tp": args.tp,
        "target_pp": args.pp,
        "bit_exact_roundtrip": exact,
        "ours_runs": ours,
        "floor_runs_s": floors,
        "ours_best": best,
        "floor_best_s": floor,
        "ratio": ratio,
        "target": TARGET,
        "memory": memory,
        "cpu_count": os.cpu_count(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    status = "ok" if ratio >= TARGET and exact else "below"
    print(f"convert: ratio={ratio:.2f} target>={TARGET:.2f} {status}")


if __name__ == "__main__":
    main()
