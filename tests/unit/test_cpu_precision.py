"""Precision by the machine: the CPU configs train and roll out in bf16 only where the CPU has
bf16 matmul hardware (`${cpu_precision:...}`), and the run's start says which and why."""

from __future__ import annotations

from mindrl.accelerator.cpu_precision import cpu_flags, fast_cpu_precision
from mindrl.config import load_run_config
from mindrl.config.meaning import precision_line

AVX2_HOST = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"
BF16_HOST = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX_HOST = "processor\t: 0\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"


def test_bf16_is_the_fast_path_only_with_bf16_matmul_hardware():
    assert cpu_flags(AVX2_HOST) == {"fpu", "sse2", "avx", "avx2", "fma"}  # the first CPU's
    assert cpu_flags("no flags here") == set()
    plain = fast_cpu_precision(cpu_flags(AVX2_HOST))
    assert not plain.bf16 and plain.vllm_dtype == "float32" and "no bf16" in plain.reason
    for host, flag in ((BF16_HOST, "avx512_bf16"), (AMX_HOST, "amx_bf16")):
        fast = fast_cpu_precision(cpu_flags(host))
        assert fast.bf16 and fast.vllm_dtype == "bfloat16" and flag in fast.reason


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
