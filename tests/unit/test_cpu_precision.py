"""Precision by the machine: the CPU configs train and roll out in bf16 only where this CPU's
bf16 matmuls measurably beat fp32 (`${cpu_precision:...}`), and the run's start says which
and why. The flags alone do not tell: a Xeon showing avx512_bf16 without AMX ran bf16 at
~0.6x fp32."""

from __future__ import annotations

import json

import pytest

from mindrl.accelerator import matmul_probe
from mindrl.accelerator.cpu_precision import (
    BF16_MIN_SPEEDUP,
    choose_cpu_precision,
    cpu_flags,
    fast_cpu_precision,
)
from mindrl.accelerator.matmul_probe import MatmulRates, cached_matmul_rates, machine_key
from mindrl.config import load_run_config
from mindrl.config.meaning import precision_line

AVX2_HOST = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"
BF16_HOST = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX_HOST = "processor\t: 0\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"
AMX_RATES = MatmulRates(fp32_gflops=250.0, bf16_gflops=1100.0)  # a 2-core Xeon with AMX
NO_AMX_RATES = MatmulRates(fp32_gflops=246.0, bf16_gflops=147.0)  # a Xeon, avx512_bf16 only


def test_without_bf16_flags_fp32_and_no_measurement_needed():
    assert cpu_flags(AVX2_HOST) == {"fpu", "sse2", "avx", "avx2", "fma"}  # the first CPU's
    assert cpu_flags("no flags here") == set()
    plain = choose_cpu_precision(cpu_flags(AVX2_HOST), None)
    assert not plain.bf16 and plain.vllm_dtype == "float32" and "no bf16" in plain.reason


def test_with_bf16_flags_the_measured_rates_decide():
    for host, flag in ((BF16_HOST, "avx512_bf16"), (AMX_HOST, "amx_bf16")):
        fast = choose_cpu_precision(cpu_flags(host), AMX_RATES)
        assert fast.bf16 and fast.vllm_dtype == "bfloat16" and flag in fast.reason
        assert "4.40x fp32" in fast.reason
        slow = choose_cpu_precision(cpu_flags(host), NO_AMX_RATES)
        assert not slow.bf16 and slow.vllm_dtype == "float32"
        assert "0.60x fp32" in slow.reason and "fp32 is faster" in slow.reason
    just_below = MatmulRates(200.0, 200.0 * BF16_MIN_SPEEDUP - 1)
    assert not choose_cpu_precision(cpu_flags(BF16_HOST), just_below).bf16


def test_unmeasured_only_amx_counts_as_fast():
    amx = choose_cpu_precision(cpu_flags(AMX_HOST), "the matmul probe failed: boom")
    assert amx.bf16 and "not measured (the matmul probe failed: boom)" in amx.reason
    assert not choose_cpu_precision(cpu_flags(BF16_HOST), "no torch").bf16


def test_the_probe_measures_in_a_child_once_then_reads_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDRL_CACHE_DIR", str(tmp_path))
    rates, path = cached_matmul_rates(BF16_HOST)  # a real torch child process
    assert path.parent == tmp_path and path.exists()
    assert rates.fp32_gflops > 0 and rates.bf16_gflops > 0
    assert MatmulRates(**json.loads(path.read_text())) == rates
    path.write_text(json.dumps({"fp32_gflops": 1.0, "bf16_gflops": 9.0}))  # no new child
    assert cached_matmul_rates(BF16_HOST) == (MatmulRates(1.0, 9.0), path)
    assert machine_key(BF16_HOST) != machine_key(AMX_HOST)  # another CPU, another entry
    path.write_text("{not json")  # a torn or foreign file is measured again, not trusted
    assert cached_matmul_rates(BF16_HOST)[0].fp32_gflops > 1.0


def test_a_cache_it_cannot_write_does_not_lose_the_measurement(tmp_path, monkeypatch):
    blocked = tmp_path / "file_not_folder"
    blocked.write_text("")
    monkeypatch.setenv("MINDRL_CACHE_DIR", str(blocked))  # mkdir below a file fails
    rates, path = cached_matmul_rates(BF16_HOST)
    assert rates.fp32_gflops > 0 and not path.exists()


def test_a_stuck_probe_is_reported_not_waited_on():
    with pytest.raises(RuntimeError, match="took over"):
        matmul_probe.measure_in_child(timeout_s=0.01)


def test_the_smollm2_config_takes_this_cpus_fast_precision_and_says_so():
    here = fast_cpu_precision()
    run, _ = load_run_config("grpo_smollm2_cpu", check_paths=False)
    assert run.actor.precision.bf16 == here.bf16 == run.ref.precision.bf16
    assert run.generate.dtype == here.vllm_dtype
    assert here.reason in precision_line(run)
    pinned, _ = load_run_config(
        "grpo_smollm2_cpu",
        ["megatron_training.bf16=true", "generate_config.dtype=bfloat16"],
        check_paths=False,
    )
    assert precision_line(pinned).startswith("training bf16 (megatron's mixed precision")
