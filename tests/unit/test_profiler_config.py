"""MindSpeed-RL's `profiler_config.integrated` as mindrl reads it: its keys and defaults, the
values it refuses, and which keys go to torch_npu's profiler on NPU only."""

from __future__ import annotations

import dataclasses

import pytest

from mindrl.config import ConfigError, load_run_config
from mindrl.config.fates import TORCH_NPU_PROFILER, handoffs
from mindrl.config.profiler import STAGES, ProfilerConfig, profiler_problems, profiler_warnings

BASE = "grpo_tiny_cpu"
P = "+profiler_config.integrated."

# MindSpeed-RL's ProfilerConfig (config_cls/mindstudio_config.py): every key at its default
MINDSPEED_DEFAULTS = {
    "profile": False,
    "mstx": False,
    "stage": "all",
    "profile_save_path": "",
    "profile_export_type": "text",
    "profile_level": "level0",
    "profile_with_memory": False,
    "profile_record_shapes": False,
    "profile_with_cpu": True,
    "profile_with_npu": True,
    "profile_with_module": False,
    "profile_step_start": 1,
    "profile_step_end": 2,
    "profile_analysis": False,
    "profile_ranks": "all",
}
# its stage names for the calls mindrl has (actor_image_embeds is a multimodal one)
MINDSPEED_STAGES = {
    "actor_generate",
    "actor_compute_log_prob",
    "reference_compute_log_prob",
    "critic_compute_values",
    "actor_update",
    "critic_update",
}


def _load(*overrides: str):
    run, _ = load_run_config(BASE, list(overrides), check_paths=False)
    return run.profiler


def test_keys_and_defaults_are_mindspeed_rls():
    cfg = ProfilerConfig()
    assert {f.name for f in dataclasses.fields(cfg)} == set(MINDSPEED_DEFAULTS)
    assert dataclasses.asdict(cfg) == MINDSPEED_DEFAULTS
    assert set(STAGES) == MINDSPEED_STAGES
    assert _load() == cfg  # no section: not profiling


def test_the_documented_section_builds_as_written():
    """The section of MindSpeed-RL's profiler guide, every key spelled out."""
    doc = {**MINDSPEED_DEFAULTS, "profile": True, "profile_level": "level1"}
    doc["profile_save_path"] = "./profiler_data"
    overrides = [
        f"{P}{k}={v if not isinstance(v, bool) else str(v).lower()}" for k, v in doc.items()
    ]
    cfg = _load(*overrides)
    assert cfg.profile and cfg.profile_level == "level1"
    assert cfg.profile_save_path == "./profiler_data"
    assert cfg.stages is None  # all: one capture of the whole worker
    assert cfg.in_window(1) and not cfg.in_window(2)  # the end is exclusive


def test_stages_ranks_and_window():
    cfg = _load(
        f"{P}profile=true",
        f"{P}stage=[actor_update,reference_compute_log_prob]",
        f"{P}profile_ranks=[0,2]",
        f"{P}profile_step_start=3",
        f"{P}profile_step_end=5",
    )
    assert cfg.stages == ("actor_update", "reference_compute_log_prob")
    assert cfg.profiles_rank(0) and cfg.profiles_rank(2) and not cfg.profiles_rank(1)
    assert [s for s in range(1, 8) if cfg.in_window(s)] == [3, 4]
    assert _load(f"{P}stage=actor_generate").stages == ("actor_generate",)


@pytest.mark.parametrize(
    "override, message",
    [
        (f"{P}stage=actor_image_embeds", "not among 'all'"),
        (f"{P}stage=[]", "an empty list profiles nothing"),
        (f"{P}profile_step_end=1", "must exceed profile_step_start (1)"),
        (f"{P}profile_step_start=0", "profile_step_start"),
        (f"{P}profile_ranks=some", "'all' or a list of ranks"),
        (f"{P}profile_level=level3", "is not one of"),
        (f"{P}profile_export_type=json", "is not one of"),
        ("+profiler_config.actor.profile=true", "read only profiler_config.integrated"),
    ],
)
def test_bad_values_are_config_errors(override, message):
    with pytest.raises(ConfigError) as err:
        _load(f"{P}profile=true", override)
    assert message in str(err.value)


def test_a_section_that_is_off_is_not_checked_further():
    """MindSpeed-RL reads nothing of it without `profile`: the run runs unchanged."""
    cfg = _load(f"{P}stage=[actor_image_embeds]", f"{P}profile_step_end=1")
    assert not cfg.profile
    with pytest.raises(ConfigError, match="is not one of"):  # a choice is still a choice
        _load(f"{P}profile_level=level3")


def test_captures_the_run_cannot_make_are_warned():
    listed = (f"{P}profile=true", f"{P}stage=[actor_update,critic_update,actor_generate]")
    cfg = _load(*listed, f"{P}profile_step_start=41", f"{P}profile_step_end=42")
    warned = profiler_warnings(
        cfg, steps=40, reference=True, critic=False, generating_workers=False
    )
    assert warned == [
        "profiler_config.integrated.stage: critic_update records nothing: there is no critic",
        "profiler_config.integrated.stage: actor_generate records nothing: vLLM servers the "
        "run does not start generate",
        "profiler_config.integrated.profile_step_start: 41 is past this run's 40 steps: "
        "nothing is recorded",
    ]
    every = dict(reference=True, critic=True, generating_workers=True)
    assert profiler_warnings(_load(*listed), steps=40, **every) == []
    assert profiler_warnings(_load(f"{P}stage=critic_update"), steps=1, **every) == []


def test_a_cpu_profile_needs_the_host_operators():
    cfg = _load(f"{P}profile=true", f"{P}profile_with_cpu=false")
    assert "refused on cpu" in profiler_problems(cfg, "cpu")[0]
    assert profiler_problems(cfg, "npu") == [] and profiler_problems(cfg, "cuda") == []
    off = _load(f"{P}profile_with_cpu=false")  # not profiling: nothing to refuse
    assert profiler_problems(off, "cpu") == []


def test_npu_only_keys_go_to_torch_npu_and_warn_elsewhere(fate_log):
    cfg = _load(f"{P}mstx=true", f"{P}profile_level=level2", f"{P}profile_export_type=db")
    npu = handoffs(cfg, "npu").to(TORCH_NPU_PROFILER)
    assert npu == {
        "msprof_tx": True,
        "export_type": "db",
        "profiler_level": "level2",
        "npu_activity": True,
        "analyse_flag": False,
    }
    assert not fate_log.records
    handoffs(cfg, "cpu")
    warned = sorted(r.getMessage() for r in fate_log.records)
    assert len(warned) == 3, warned
    assert all("has no effect on cpu: handed to torch_npu's profiler on npu" in w for w in warned)
    fate_log.clear()
    handoffs(_load(f"{P}profile_analysis=true"), "cpu")  # an operator table there instead
    assert not fate_log.records
