"""Benchmark: HF -> megatron -> HF conversion against the safetensors I/O floor, for two models.

    python tools/bench/convert.py [--repeats 2] [--cases smollm2,qwen3_moe]
                                  [--hf-dir DIR] [--tp 3 --pp 2] [--moe-tp 2 --moe-pp 2 --moe-ep 2]

Cases: SmolLM2-135M (dense; `--hf-dir` replaces it) and a random-init Qwen3-MoE built here
from transformers' `Qwen3MoeConfig` (MOE_SPEC: ~200M parameters, 16 experts, top-2, bf16,
about 400 MB, so I/O dominates as it does for the dense model), converted with expert
parallel. Our time: `convert_hf_to_mcore` (target TP/PP/EP) then `convert_mcore_to_hf`, in this
process (imports warmed up first). The floor, in the same run: read every tensor of the HF
folder with safetensors and write it to a new file, then read that file and write another (the
same two reads and two writes of the same bytes the conversion does), each written file
fsynced as the converter's are. Best of --repeats for both. ratio = floor / ours (higher is
better), per case.

Peak memory of each direction is measured in a fresh subprocess (ru_maxrss of the process
and of the dist_checkpointing writer processes it forks), minus the RSS after imports.
SmolLM2 has 9 heads / 3 kv heads, so TP=2 cannot split it; its default target is TP=3, PP=2.
Writes bench/results/convert.json; the last line is the summary (every case's ratio).
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.host import host_facts  # noqa: E402

TARGET = 0.5
CASES = ("smollm2", "qwen3_moe")

# The MoE checkpoint (`build_tiny_model` arguments): per layer 16 experts x 3 x 1024 x 512
# (25M) + attention (2.6M); 6 layers + untied 16384-row embeddings = ~200M parameters.
MOE_SPEC = dict(
    family="qwen3_moe",
    vocab_size=16384,
    hidden_size=1024,
    num_layers=6,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    ffn_hidden_size=512,
    num_experts=16,
    moe_ffn_hidden_size=512,
    moe_topk=2,
    tie_word_embeddings=False,
    dtype="bfloat16",
)


@dataclass(frozen=True)
class Case:
    """One checkpoint and the layout it is converted to."""

    name: str
    src_dir: Path
    tp: int
    pp: int
    ep: int = 1


def build_moe_checkpoint(out_dir: Path) -> Path:
    """Write the random-init Qwen3-MoE HF folder of MOE_SPEC (no network)."""
    from mindrl.assets.models import build_tiny_model

    return build_tiny_model(out_dir, **MOE_SPEC)


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


def to_mcore(src: str | Path, dst: str | Path, tp: int, pp: int, ep: int) -> None:
    from mindrl.checkpoint.offline import convert_hf_to_mcore

    convert_hf_to_mcore(
        src,
        dst,
        target_tensor_parallel_size=tp,
        target_pipeline_parallel_size=pp,
        target_expert_parallel_size=ep,
    )


def ours_pass(case: Case, work: Path) -> dict[str, float]:
    from mindrl.checkpoint.offline import convert_mcore_to_hf

    mg, hf = work / "mg", work / "hf"
    t0 = time.perf_counter()
    to_mcore(case.src_dir, mg, case.tp, case.pp, case.ep)
    t1 = time.perf_counter()
    convert_mcore_to_hf(mg, hf)
    t2 = time.perf_counter()
    shutil.rmtree(mg)
    shutil.rmtree(hf)
    return {"hf_to_mcore_s": t1 - t0, "mcore_to_hf_s": t2 - t1, "total_s": t2 - t0}


def _load_folder(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def check_exact(case: Case, work: Path) -> bool:
    import torch

    from mindrl.checkpoint.offline import convert_mcore_to_hf

    to_mcore(case.src_dir, work / "mg", case.tp, case.pp, case.ep)
    convert_mcore_to_hf(work / "mg", work / "hf")
    a, b = _load_folder(case.src_dir), _load_folder(work / "hf")
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


def child(direction: str, src: str, dst: str, tp: int, pp: int, ep: int) -> None:
    """One conversion direction in a fresh process; prints its memory as JSON."""
    warnings.filterwarnings("ignore")
    import megatron.core.dist_checkpointing  # noqa: F401  (imports before the baseline)
    import megatron.core.models.gpt  # noqa: F401

    from mindrl.checkpoint import offline

    base = _status_kib("VmRSS") * 1024
    if direction == "hf2mg":
        to_mcore(src, dst, tp, pp, ep)
    else:
        offline.convert_mcore_to_hf(src, dst)
    peak = _status_kib("VmHWM") * 1024
    # the dist_checkpointing writers are forked: their ru_maxrss starts at ours at fork time
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"baseline_rss": base, "peak_rss": peak, "children_peak_rss": children}))


def measure_memory(case: Case, work: Path) -> dict[str, dict[str, float]]:
    out = {}
    layout = [str(case.tp), str(case.pp), str(case.ep)]
    for direction, src, dst in (
        ("hf2mg", case.src_dir, work / "mem_mg"),
        ("mg2hf", work / "mem_mg", work / "mem_hf"),
    ):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", direction, str(src), str(dst), *layout],
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


def run_case(case: Case, work: Path, repeats: int) -> dict:
    """Round-trip check, best-of-`repeats` timings against the floor, and peak memory."""
    exact = check_exact(case, work)  # also warms imports and page cache
    ours, floors = [], []
    for _ in range(repeats):
        floors.append(floor_pass(case.src_dir, work))
        ours.append(ours_pass(case, work))
    best = min(ours, key=lambda r: r["total_s"])
    floor = min(floors)
    return {
        "model_dir": str(case.src_dir),
        "safetensors_bytes": sum(f.stat().st_size for f in case.src_dir.glob("*.safetensors")),
        "target_tp": case.tp,
        "target_pp": case.pp,
        "target_ep": case.ep,
        "bit_exact_roundtrip": exact,
        "ours_runs": ours,
        "floor_runs_s": floors,
        "ours_best": best,
        "floor_best_s": floor,
        "ratio": floor / best["total_s"],
        "memory": measure_memory(case, work),
    }


def summary_line(cases: dict[str, dict]) -> str:
    """`convert: smollm2 ratio=0.55 qwen3_moe ratio=0.61 target>=0.50 ok` (ok: every case
    meets the target and round-trips bit-exactly)."""
    ok = all(c["ratio"] >= TARGET and c["bit_exact_roundtrip"] for c in cases.values())
    ratios = " ".join(f"{name} ratio={c['ratio']:.2f}" for name, c in cases.items())
    return f"convert: {ratios} target>={TARGET:.2f} {'ok' if ok else 'below'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + str(CASES))
    parser.add_argument("--hf-dir", help="dense HF folder (default: SmolLM2-135M-Instruct asset)")
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--moe-tp", type=int, default=2)
    parser.add_argument("--moe-pp", type=int, default=2)
    parser.add_argument("--moe-ep", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "convert.json"))
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        direction, src, dst, *layout = args.child
        child(direction, src, dst, *map(int, layout))
        return
    names = [n for n in args.cases.split(",") if n]
    if unknown := set(names) - set(CASES):
        parser.error(f"unknown --cases {sorted(unknown)}; choose from {CASES}")
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(
        dir=REPO / "bench" if (REPO / "bench").is_dir() else None
    ) as tmp:
        work = Path(tmp)
        for name in names:
            if name == "smollm2":
                from mindrl.assets.smollm2 import smollm2_dir

                src = Path(args.hf_dir) if args.hf_dir else smollm2_dir()
                case = Case(name, src, args.tp, args.pp)
            else:
                src = build_moe_checkpoint(work / "moe_hf")
                case = Case(name, src, args.moe_tp, args.moe_pp, args.moe_ep)
            results[name] = run_case(case, work, args.repeats)
            if name == "qwen3_moe":
                results[name]["model_spec"] = MOE_SPEC
                shutil.rmtree(src)
    result = {
        "cases": results,
        "target": TARGET,
        **host_facts(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(summary_line(results))


if __name__ == "__main__":
    main()
