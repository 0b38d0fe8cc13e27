"""tools/bench/convert.py's bookkeeping: the MoE case's checkpoint is the size the bench is
meant for and splits at the default target layout, and the summary line names every case."""

from __future__ import annotations

from tools.bench import convert


def test_the_moe_checkpoint_is_io_sized_and_splits_at_the_default_layout():
    from mindrl.assets.models import tiny_model_config
    from mindrl.models.gpt import validate_parallel_layout
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.planning.params import model_params

    arch = arch_from_hf_config(tiny_model_config(**convert.MOE_SPEC).to_dict())
    assert arch.family == "qwen3_moe" and arch.num_experts == 16 and arch.moe_router_topk == 2
    assert 150e6 <= model_params(arch) <= 300e6  # big enough that I/O dominates
    validate_parallel_layout(arch, tp=2, pp=2, ep=2)  # the bench's --moe-tp/pp/ep defaults


def test_summary_line_has_every_case_and_needs_all_of_them():
    good = {"ratio": 0.8, "bit_exact_roundtrip": True}
    slow = {"ratio": 0.4, "bit_exact_roundtrip": True}
    inexact = {"ratio": 0.9, "bit_exact_roundtrip": False}
    line = convert.summary_line({"smollm2": good, "qwen3_moe": good})
    assert line == "convert: smollm2 ratio=0.80 qwen3_moe ratio=0.80 target>=0.50 ok"
    assert convert.summary_line({"smollm2": good, "qwen3_moe": slow}).endswith(" below")
    assert convert.summary_line({"qwen3_moe": inexact}).endswith(" below")
