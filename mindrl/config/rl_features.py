"""`rl_config` keys of MindSpeed-RL features beside GRPO's, built or not.

DAPO's loss switches, dynamic sampling and overlong buffer (built), partial rollout, multi-turn tool
calls, sequence packing / dynamic batch sizes (built: `mindrl.data.packing`) and
MindSpeed-RL's TransferDock dispatch settings. Refused keys name the missing feature; the others change speed or memory only and
are warned once when set to something other than their default.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import HCCL_ENV, handed, honoured, no_effect, refused
from mindrl.config.fields import spec

# read by mindrl.config.dapo into the algorithm settings of stage ray_dapo (warned as no
# effect with ray_grpo)
DAPO_LOSS = honoured("RLConfig.algorithm")
MULTI_TURN = (
    honoured()
)  # mindrl.config.multi_turn checks them, mindrl.rollout.agent_rollout reads them
PACKING = honoured()  # mindrl.data.packing.pass_packing: the actor's and reference's passes
PACKING_BASE = no_effect(
    "MindSpeed-RL's passes read ref_/actor_/update_max_packing_token_size and "
    "ref_/actor_/update_dynamic_max_batch_size (each keeps its own default unless set); "
    "this key sets none of them"
)
MULTIMODAL = no_effect("only multimodal training reads it (is_multimodal: not built yet)")
DISPATCH = no_effect(
    "MindSpeed-RL's TransferDock dispatch tuning: mindrl hands each worker its whole share "
    "of the batch in one call"
)


@dataclass(frozen=True)
class DapoConfig:
    """DAPO's switches, read as MindSpeed-RL reads them (`mindrl.config.dapo`): the loss and
    dynamic-sampling keys by its DAPO trainer only (stage ray_dapo), the overlong buffer by
    its rule reward whatever the stage."""

    clip_higher_enable: bool = spec(
        False,
        fate=DAPO_LOSS,
        help="DAPO's asymmetric clip: [1 - clip_ratio_low, 1 + clip_ratio_high] (else "
        "clip_ratio both ways)",
    )
    clip_ratio_low: float = spec(0.1, gt=0.0, le=1.0, fate=DAPO_LOSS)
    token_level_loss: bool = spec(
        True,
        fate=DAPO_LOSS,
        help="DAPO: token-mean over the batch (true) or the mean of per-sequence token means",
    )
    overlong_buffer_enable: bool = spec(
        False,
        help="penalise responses in the last overlong_buffer tokens before rollout_max_tokens: "
        "linearly down to -overlong_buffer_penalty_factor (rule rewards)",
    )
    overlong_buffer: int = spec(0, ge=0)
    overlong_buffer_penalty_factor: float = spec(1.0, ge=0.0)
    rollout_max_tokens: int = spec(
        2048, ge=1, help="must equal sampling_config.max_tokens when overlong_buffer_enable"
    )
    filter_groups_enable: bool = spec(
        False,
        help="dynamic sampling: keep only groups whose filter_groups_metric scores differ, "
        "generating more batches until filter_groups_train_batch_size prompts are kept",
    )
    filter_groups_metric: str = "acc"
    filter_groups_max_batches: int = spec(
        1, help="generation batches per step at most; <= 0: no limit"
    )
    filter_groups_train_batch_size: int = spec(1, ge=1)


@dataclass(frozen=True)
class RolloutModeConfig:
    """How rollout is driven: partial rollout, the async engine, multi-turn tool calls."""

    partial_rollout_max_split: int = spec(
        1,
        ge=1,
        help="N > 1: partial rollout: each round gives an unfinished response max_tokens // N "
        "more tokens, a step trains once global_batch_size prompts are complete, the rest "
        "continue next step with the new weights (trainer/partial_rollout.py)",
    )
    require_max_age_all_finished: bool = spec(
        True,
        fate=no_effect(
            "every unfinished response gets a round each step and its N-th round takes the "
            "rest of max_tokens, so responses of the oldest prompts are always finished"
        ),
    )
    async_engine: bool = spec(
        False,
        fate=no_effect(
            "MindSpeed-RL's asynchronous engine ends a partial-rollout round once enough "
            "prompts are complete; mindrl's rounds end at their token budget (max_tokens // "
            "partial_rollout_max_split), the asynchronous variant is not built. Multi-turn "
            "rollout always steps vLLM's engine continuously (turns join the next engine step "
            "as they arrive); single-turn generation is one batch per call"
        ),
    )
    multi_turn_enable: bool = spec(
        False,
        fate=MULTI_TURN,
        help="tool-calling rollout: each response alternates model turns and tool answers "
        "(tools from tool_config_path), the loss on the model's tokens only",
    )
    tool_config_path: str | None = spec(
        None,
        fate=MULTI_TURN,
        help="the tool YAML (MindSpeed-RL's / verl's tools: [{class_name, config, "
        "tool_schema}]); a relative path is read from the working directory, as MindSpeed-RL "
        "does, else from mindrl's checkout",
    )
    tool_parser_format: str | None = spec(
        None, fate=MULTI_TURN, help="how tool calls are read from a turn (null: hermes)"
    )
    tool_response_truncate_side: str | None = spec(
        None,
        fate=MULTI_TURN,
        choices=(None, "left", "middle", "right"),
        help="which part of a long tool answer is kept: left (its start), right (its end), "
        "middle / null (both ends)",
    )
    max_tool_calls: int = spec(
        0, ge=0, fate=MULTI_TURN, help="tool calls per response at most (>= 1 with multi-turn)"
    )
    max_parallel_calls: int = spec(
        0,
        ge=0,
        fate=MULTI_TURN,
        help="calls run at once from one turn; further calls in that turn are not run",
    )
    max_total_response_length: int = spec(
        0,
        ge=0,
        fate=MULTI_TURN,
        help="tokens of a response over all its turns (model and tool); >= max_tokens",
    )
    max_tool_response_length: int = spec(
        0, ge=0, fate=MULTI_TURN, help="characters of a tool answer kept (0: all)"
    )
    tool_call_timeout: float = spec(
        60.0,
        gt=0.0,
        fate=MULTI_TURN,
        help="mindrl's own key: seconds a tool call may take before the model is told it "
        "timed out (counted in agent/tool_timeouts)",
    )


@dataclass(frozen=True)
class MicroBatchingConfig:
    """How MindSpeed-RL cuts batches for forward passes: sizes, packing, dynamic batches."""

    actor_forward_micro_batch_size: int | None = spec(
        None,
        fate=no_effect("the old-policy log-prob pass runs at actor_config.micro_batch_size"),
    )
    ref_forward_micro_batch_size: int | None = spec(
        None, fate=no_effect("the reference log-prob pass runs at its micro_batch_size")
    )
    update_micro_batch_size: int | None = spec(
        None, fate=no_effect("seed-era key: the update runs at actor_config.micro_batch_size")
    )
    use_remove_padding: bool = spec(
        False,
        fate=PACKING,
        help="each micro-batch's samples packed into one sequence, attention stopping at "
        "every sample (actor and reference passes; the critic's stay padded)",
    )
    use_dynamic_bsz: bool = spec(
        False,
        fate=PACKING,
        help="micro-batches formed by each pass's token budget "
        "(*_max_packing_token_size, at most *_dynamic_max_batch_size samples)",
    )
    share_prompt_forward: bool = spec(
        False,
        fate=PACKING,
        help="mindrl's own key, with use_remove_padding: the samples of one prompt in a "
        "micro-batch run the prompt once (each response attends to it), the same numbers "
        "with less work; actor and reference passes, megatron's local attention",
    )
    max_packing_token_size: int = spec(4096, ge=1, fate=PACKING_BASE)
    ref_max_packing_token_size: int = spec(4096, ge=1, fate=PACKING)
    actor_max_packing_token_size: int = spec(4096, ge=1, fate=PACKING)
    update_max_packing_token_size: int = spec(4096, ge=1, fate=PACKING)
    dynamic_max_batch_size: int | None = spec(None, fate=PACKING_BASE)
    ref_dynamic_max_batch_size: int | None = spec(None, ge=1, fate=PACKING)
    actor_dynamic_max_batch_size: int | None = spec(None, ge=1, fate=PACKING)
    update_dynamic_max_batch_size: int | None = spec(None, ge=1, fate=PACKING)


@dataclass(frozen=True)
class MultimodalConfig:
    """Vision-language training (a ViT worker feeding image embeddings)."""

    is_multimodal: bool = spec(
        False, fate=refused("multimodal (vision-language) training: not built yet")
    )
    reuse_image_embeds: bool = spec(False, fate=MULTIMODAL)
    colocate_actor_and_vit: bool = spec(False, fate=MULTIMODAL)
    vit_forward_micro_batch_size: int | None = spec(None, fate=MULTIMODAL)


@dataclass(frozen=True)
class TransferConfig:
    """MindSpeed-RL's data movement between workers (TransferDock / TransferQueue / ZMQ)."""

    actor_rollout_dispatch_size: int | None = spec(None, fate=DISPATCH)
    actor_logprob_dispatch_size: int | None = spec(None, fate=DISPATCH)
    ref_dispatch_size: int | None = spec(None, fate=DISPATCH)
    reward_dispatch_size: int | None = spec(None, fate=DISPATCH)
    adv_dispatch_size: int | None = spec(None, fate=DISPATCH)
    actor_update_dispatch_size: int | None = spec(None, fate=DISPATCH)
    kl_dispatch_size: int | None = spec(None, fate=DISPATCH)
    dynamic_sampling_dispatch_size: int | None = spec(None, fate=DISPATCH)
    critic_update_dispatch_size: int | None = spec(None, fate=DISPATCH)
    critic_value_dispatch_size: int | None = spec(None, fate=DISPATCH)
    actor_image_embeds_dispatch_size: int | None = spec(None, fate=DISPATCH)
    experience_count: int = spec(1, fate=DISPATCH, help="seed-era dispatch size")
    experience_count_actor: int | None = spec(None, fate=DISPATCH)
    experience_count_ref: int | None = spec(None, fate=DISPATCH)
    experience_count_reward: int | None = spec(None, fate=DISPATCH)
    experience_count_rule_reward: int | None = spec(None, fate=DISPATCH)
    data_strategy: str = spec("td", fate=DISPATCH)
    transfer_queue_data_shard_num: int = spec(1, fate=DISPATCH)
    transfer_queue_data_shard_port_base: int | None = spec(None, fate=DISPATCH)
    zmq_communication: bool = spec(True, fate=DISPATCH)
    use_dp_batch_balance: bool = spec(
        False, fate=no_effect("each DP rank gets an equal share of the samples")
    )
    enable_sharding_validate: bool = spec(
        False, fate=no_effect("seed-era resharding self-check: not run by mindrl")
    )
    tp_split_expert: bool = spec(
        False,
        fate=refused(
            "experts split over the inference TP ranks (expert-parallel rollout): not built yet"
        ),
    )
    hccl_buffersize: int = spec(256, fate=handed(HCCL_ENV, name="HCCL_BUFFSIZE"))
    runtime_env_path: str = spec(
        "configs/envs/runtime_env.yaml",
        fate=no_effect(
            "mindrl does not read MindSpeed-RL's runtime_env YAML; export its variables where Ray "
            "starts (an embedded cluster inherits the driver's environment)"
        ),
    )
