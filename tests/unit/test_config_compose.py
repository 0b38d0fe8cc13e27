"""Every shipped config composes and validates; override precedence is model < shared < role < CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import (
    CONFIG_DIR,
    ConfigError,
    compose_raw,
    load_run_config,
    save_resolved_config,
)
from mindrl.config.fields import field_names
from mindrl.config.role import ROLE_GROUPS

NPU_CONFIGS = ["grpo_qwen25_7b", "r1_zero_qwen25_7b", "r1_zero_qwen25_32b"]
MODEL_FILES = [
    "qwen25_0.5b",
    "qwen25_1.5b",
    "qwen25_7b",
    "qwen25_32b",
    "llama3_8b",
    "smollm2_135m",
    "tiny",
]


def test_all_top_level_configs_are_covered():
    shipped = {p.stem for p in CONFIG_DIR.glob("*.yaml")}
    assert set(NPU_CONFIGS) <= shipped
    assert "grpo_tiny_cpu" in shipped


@pytest.mark.parametrize("name", NPU_CONFIGS)
def test_npu_configs_compose_and_validate(name):
    run, raw = load_run_config(name, check_paths=False)
    assert run.config_name == name
    for role in run.roles:
        assert role.num_devices % (role.tp * role.pp) == 0 and role.dp >= 1
    assert run.runtime.accelerator == "npu"
    assert "actor_config" in raw


def test_r1_zero_7b_layout_matches_the_seed():
    run, _ = load_run_config("r1_zero_qwen25_7b.yaml", check_paths=False)  # .yaml suffix accepted
    assert (run.actor.tp, run.actor.pp, run.actor.dp) == (2, 4, 1)
    assert (run.ref.tp, run.ref.pp, run.ref.dp) == (2, 2, 2)
    assert run.reward is None  # rule reward, no reward_resource
    assert run.actor.model.num_kv_heads == 4 and run.actor.model.add_qkv_bias
    assert run.actor.optim.lr == pytest.approx(5e-7)
    assert run.rl.reward.verifier_function == ("base_acc",)
    assert run.generate.sampling_config.max_tokens == 2048


def test_grpo_qwen25_7b_has_a_reward_model():
    run, _ = load_run_config("grpo_qwen25_7b", check_paths=False)
    assert run.reward is not None and run.reward.num_devices == 2
    assert not run.rl.reward.rule_reward
    assert run.rl.algorithm.shuffle_minibatch is False  # alias shuffle_mini_batch


def test_grpo_tiny_cpu_validates_with_paths(tiny_model_dir):
    run, _ = load_run_config("grpo_tiny_cpu", check_paths=True)
    assert run.runtime.accelerator == "cpu"
    assert Path(run.actor.data.tokenizer_name_or_path).is_dir()
    assert run.ref is not None and run.ref.num_devices == run.actor.num_devices


@pytest.mark.parametrize("model", MODEL_FILES)
def test_every_model_file_builds(model):
    overrides = [f"model={model}", f"megatron_training.model={model}"]
    overrides += [f"{r}.model={model}" for r in ("actor_config", "ref_config", "reward_config")]
    overrides += [
        "actor_config.tensor_model_parallel_size=1",
        "actor_config.pipeline_model_parallel_size=1",
    ]
    overrides += [
        "ref_config.tensor_model_parallel_size=1",
        "ref_config.pipeline_model_parallel_size=1",
    ]
    overrides += ["generate_config.infer_tensor_parallel_size=1"]
    run, raw = load_run_config("r1_zero_qwen25_7b", overrides, check_paths=False)
    arch = run.actor.model
    assert arch.name == model
    assert arch.hidden_size % arch.num_attention_heads == 0
    assert arch.num_attention_heads % arch.num_kv_heads == 0


def test_published_architecture_values():
    def arch(name):
        run, _ = load_run_config(
            "r1_zero_qwen25_7b",
            [
                f"model={name}",
                f"megatron_training.model={name}",
                f"actor_config.model={name}",
                f"ref_config.model={name}",
                f"reward_config.model={name}",
                "actor_config.tensor_model_parallel_size=1",
                "actor_config.pipeline_model_parallel_size=1",
                "ref_config.tensor_model_parallel_size=1",
                "ref_config.pipeline_model_parallel_size=1",
                "generate_config.infer_tensor_parallel_size=1",
            ],
            check_paths=False,
        )
        return run.actor.model

    smol = arch("smollm2_135m")
    assert (smol.hidden_size, smol.num_layers, smol.num_attention_heads, smol.num_kv_heads) == (
        576,
        30,
        9,
        3,
    )
    assert smol.tie_word_embeddings and smol.vocab_size == 49152 and smol.head_dim == 64
    q05 = arch("qwen25_0.5b")
    assert (q05.hidden_size, q05.num_layers, q05.num_kv_heads, q05.vocab_size) == (
        896,
        24,
        2,
        151936,
    )
    assert q05.tie_word_embeddings and q05.add_qkv_bias and q05.rotary_base == 1e6
    llama = arch("llama3_8b")
    assert llama.family == "llama" and llama.rotary_base == 500000 and not llama.add_qkv_bias


def test_precedence_role_over_shared_over_model():
    base = [
        "megatron_training.norm_epsilon=1e-5",
        "actor_config.norm_epsilon=1e-4",
        "megatron_training.lr=3e-6",
    ]
    run, _ = load_run_config("r1_zero_qwen25_7b", base, check_paths=False)
    # model file says 1e-6; megatron_training overrides it for every role; the actor's own wins
    assert run.actor.model.norm_epsilon == pytest.approx(1e-4)
    assert run.ref.model.norm_epsilon == pytest.approx(1e-5)
    # lr: the actor sets its own; the ref has none and inherits megatron_training's
    assert run.actor.optim.lr == pytest.approx(5e-7)
    assert run.ref.optim.lr == pytest.approx(3e-6)
    # micro_batch_size is per role in the file
    assert (run.actor.batch.micro_batch_size, run.ref.batch.micro_batch_size) == (4, 8)


def test_command_line_overrides_file():
    run, raw = load_run_config(
        "r1_zero_qwen25_7b",
        [
            "actor_config.lr=1e-5",
            "rl_config.clip_ratio=0.28",
            "generate_config.sampling_config.top_p=0.5",
        ],
        check_paths=False,
    )
    assert run.actor.optim.lr == pytest.approx(1e-5)
    assert raw["actor_config"]["lr"] == pytest.approx(1e-5)
    assert run.rl.algorithm.clip_ratio == pytest.approx(0.28)
    assert run.generate.sampling_config.top_p == pytest.approx(0.5)


def test_new_key_on_command_line_is_added_then_checked():
    run, _ = load_run_config("r1_zero_qwen25_7b", ["actor_config.adam_eps=1e-6"], check_paths=False)
    assert run.actor.optim.adam_eps == pytest.approx(1e-6)


def test_unknown_config_name_suggests():
    with pytest.raises(ConfigError, match="r1_zero_qwen25_7b"):
        compose_raw("r1_zero_qwen25_7")


def test_resolved_config_saved(tmp_path):
    run, raw = load_run_config("r1_zero_qwen25_7b", ["actor_config.lr=2e-6"], check_paths=False)
    path = save_resolved_config(raw, tmp_path / "run")
    text = path.read_text()
    assert "lr: 2.0e-06" in text and "qwen25_7b" in text
    again = load_run_config("r1_zero_qwen25_7b", ["actor_config.lr=2e-6"], check_paths=False)[1]
    assert again == raw


def test_each_role_key_lives_in_one_group():
    seen: dict[str, str] = {}
    for group, cls in ROLE_GROUPS.items():
        for name in field_names(cls):
            assert name not in seen, f"{name} in {seen.get(name)} and {group}"
            seen[name] = group


def test_typed_config_is_frozen():
    run, _ = load_run_config("r1_zero_qwen25_7b", check_paths=False)
    with pytest.raises(AttributeError):
        run.actor.optim.lr = 1.0  # type: ignore[misc]


def test_mindspeed_rl_defaults_without_self_compose_as_hydra_does_without_its_warning(tmp_path):
    """MindSpeed-RL's files list no `_self_`: the file's own keys come after its defaults (as
    MindSpeed-RL's Hydra composes them), and Hydra's warning about it is not shown."""
    import warnings

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny.yaml").write_text("tiny:\n  num_layers: 28\n  hidden_size: 64\n")
    (tmp_path / "run.yaml").write_text(
        "defaults:\n  - model:\n      - tiny\n\nmodel:\n  tiny:\n    num_layers: 2\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = compose_raw("run", config_dir=tmp_path)
    assert raw["model"]["tiny"] == {"num_layers": 2, "hidden_size": 64}  # the file's own last
    assert not [w for w in caught if "_self_" in str(w.message)]
