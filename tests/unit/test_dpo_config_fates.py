"""A stage dpo config's sections that offline DPO does not read are warned, not ignored."""

from mindrl.config import load_run_config
from mindrl.config.fates import warned


def test_generate_config_in_a_dpo_config_is_warned_as_no_effect() -> None:
    run, _ = load_run_config("dpo_tiny_cpu", ["+generate_config.max_num_seqs=4"], local_paths=False)
    assert run.actor.data.stage == "dpo"
    assert "no effect with stage dpo" in warned()["dpo.generate_config"]
