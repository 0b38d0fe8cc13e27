"""tools/bench/host.py: every benchmark report says which CPU it ran on (model, family /
model numbers, the flags that decide its matmul rates, cores)."""

from __future__ import annotations

import json
import os

from tools.bench.host import host_facts
from tools.bench.variants import write_report

EPYC_AVX2 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
    "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx fma avx2\n"
)
XEON_NO_AMX = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
    "model name\t: Intel(R) Xeon(R) Processor\n"
    "flags\t\t: avx2 avx512f avx512_bf16 avx512_fp16 avx512_vnni\n"
)
XEON_AMX = XEON_NO_AMX.replace("avx512_vnni", "avx512_vnni amx_tile amx_bf16")


def test_the_cpu_and_its_matmul_flags_are_named():
    epyc = host_facts(EPYC_AVX2)
    assert epyc["cpu_model"] == "AMD EPYC 7B13" and epyc["cpu_family_model"] == "25/1"
    assert epyc["matmul_flags"] == ["avx2"]
    assert host_facts(XEON_NO_AMX)["matmul_flags"] == ["avx2", "avx512f", "avx512_bf16"]
    amx = host_facts(XEON_AMX)
    assert amx["cpu_family_model"] == "6/207"
    assert amx["matmul_flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]
    bare = host_facts("")
    assert bare["cpu_model"] == "unknown" and bare["cpu_family_model"] is None
    assert bare["matmul_flags"] == [] and bare["cpu_count"] == os.cpu_count()


def test_reports_carry_this_machine(tmp_path, capsys):
    out = tmp_path / "bench.json"
    write_report(out, {"runs": {}}, os.getloadavg())
    report = json.loads(out.read_text())
    here = host_facts()
    assert {k: report[k] for k in here} == here and report["runs"] == {}
    assert report["cpu_model"] != "unknown"  # this Linux host has a /proc/cpuinfo
