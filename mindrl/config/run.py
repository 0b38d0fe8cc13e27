"""The whole run's typed config: roles, rl_config, generate_config and runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mindrl.config.dpo_keys import DPO
from mindrl.config.fields import spec
from mindrl.config.generate import GenerateConfig
from mindrl.config.profiler import ProfilerConfig
from mindrl.config.rl import RLConfig
from mindrl.config.role import RoleConfig


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the run executes (mindrl's own section; MindSpeed-RL has no equivalent)."""

    accelerator: str = spec("auto", choices=("auto", "npu", "cuda", "cpu"))
    output_dir: str | None = spec(None, help="metrics, logs, resolved config; default outputs/NAME")
    ray_address: str | None = spec(
        None,
        help="None: join the cluster a plain ray.init() would (RAY_ADDRESS, else the "
        "ray_current_cluster file `ray start` writes), else start an embedded one; 'local': "
        "always embedded; 'auto' or host:port: connect",
    )
    ray_num_cpus: int | None = spec(None, ge=1, help="CPUs of the embedded cluster")
    ray_dashboard: bool = False
    ray_dashboard_host: str = "127.0.0.1"
    master_addr: str = spec("127.0.0.1", help="torch.distributed rendezvous for one node")
    log_level: str = spec(
        "info",
        choices=("debug", "info", "warning"),
        help="console: progress, warnings, errors (info); engine and Ray logs always go to "
        "OUTPUT_DIR/logs/, and with debug to the console too",
    )
    worker_timeout_s: float = spec(600.0, gt=0.0, help="a worker call longer than this fails")
    stop_grace_s: float = spec(
        30.0,
        ge=0.0,
        help="after SIGTERM / SIGINT the run stops at the next phase boundary, or after this "
        "many seconds wherever it is (0: only at a boundary)",
    )
    worker_threads: int | None = spec(
        None,
        ge=1,
        help="torch threads per worker; default: its bundle's CPUs, or on a one-node CPU "
        "run whose bundles leave CPUs idle the node's CPUs over the worker processes. On a "
        "CPU box roles that run one after another may each use every core",
    )
    release_memory_after_pass: bool = spec(
        True,
        help="give the memory a model pass freed back when the pass ends (log-probs, values, "
        "update): glibc's free heap on cpu (malloc_trim; the workers otherwise keep their "
        "high-water marks for the whole run), the caching allocator's blocks on npu / cuda "
        "(empty_cache)",
    )
    release_memory_min_mb: int = spec(
        256,
        ge=0,
        help="cpu: a pass that leaves less free heap than this keeps it for the next pass "
        "(faulting freed pages back in costs time in every pass, a visible share of a short "
        "step; holding it costs at most this much per process); 0: always give it back. "
        "npu / cuda: no effect (empty_cache is cheap there)",
    )
    device_memory_gb: float | None = spec(
        None,
        gt=0,
        help="memory of one device in GiB for the memory plan; default: 64 on npu (Ascend "
        "910B), 80 on cuda (H100), the host's RAM on cpu",
    )


@dataclass(frozen=True)
class RunConfig:
    # the YAML section of each part (mindrl.config.fates.walk names keys by it)
    KEY_SECTIONS: ClassVar[dict[str, str]] = {
        "actor": "actor_config",
        "ref": "ref_config",
        "reward": "reward_config",
        "critic": "critic_config",
        "teacher": "teacher_config",
        "rl": "rl_config",
        "generate": "generate_config",
        "runtime": "runtime",
        "profiler": "profiler_config.integrated",
    }

    config_name: str
    actor: RoleConfig
    ref: RoleConfig | None
    reward: RoleConfig | None
    rl: RLConfig
    generate: GenerateConfig
    runtime: RuntimeConfig
    notes: tuple[str, ...] = ()  # what the builder decided (model family), said at start
    critic: RoleConfig | None = None  # PPO's value model (stage ray_ppo)
    profiler: ProfilerConfig = ProfilerConfig()  # MindSpeed-RL's profiler_config.integrated
    teacher: RoleConfig | None = None  # on-policy distillation's teacher (teacher_config)

    @property
    def roles(self) -> list[RoleConfig]:
        """The roles that run processes of their own (a reference in the actor, LoRA base or
        weight snapshot, runs in the actor's)."""
        ref = None if self.reference_in_actor else self.ref
        roles = (self.actor, ref, self.reward, self.critic, self.teacher)
        return [r for r in roles if r is not None]

    @property
    def rollout_on_servers(self) -> bool:
        """Rollout on vLLM servers the user runs (`generate_config.server`)."""
        return self.generate.server is not None

    @property
    def hybrid_rollout(self) -> bool:
        """The actor's ranks hold the rollout engines: no rollout group, no servers."""
        return (
            self.rl.resources.rollout_resource is None
            and not self.rollout_on_servers
            and not self.offline
        )

    @property
    def offline(self) -> bool:
        """Offline DPO (stage dpo): trained on stored pairs, no rollout engine anywhere."""
        return self.actor.data.stage == DPO

    @property
    def shares_backbone(self) -> bool:
        """The reference is the actor's LoRA base (rl_config.share_backbone)."""
        return self.ref is not None and self.rl.resources.share_backbone and self.actor.lora.enabled

    @property
    def reference_snapshot(self) -> bool:
        """The reference is a snapshot of its weights in the actor's processes
        (rl_config.reference_in_actor with the integrated worker)."""
        res = self.rl.resources
        return (
            self.ref is not None
            and res.reference_in_actor
            and res.use_integrated_worker
            and not self.shares_backbone
        )

    @property
    def reference_in_actor(self) -> bool:
        """The reference's log-probs come from the actor's processes (a LoRA base or a
        weight snapshot): it has no worker group of its own."""
        return self.shares_backbone or self.reference_snapshot

    @property
    def output_dir(self) -> str:
        return self.runtime.output_dir or f"outputs/{self.config_name}"

    @property
    def filters_groups(self) -> bool:
        """DAPO's dynamic sampling is on (stage ray_dapo and filter_groups_enable)."""
        return self.actor.data.stage == "ray_dapo" and self.rl.dapo.filter_groups_enable

    @property
    def train_prompts(self) -> int:
        """Prompts one step trains on: global_batch_size, or with DAPO's dynamic sampling
        filter_groups_train_batch_size."""
        if self.filters_groups:
            return self.rl.dapo.filter_groups_train_batch_size
        return self.actor.batch.global_batch_size

    @property
    def optimizer_steps_per_rl_step(self) -> int:
        """Epochs x mini-batches of one RL step's samples (the LR schedule's unit)."""
        alg = self.rl.algorithm
        samples = self.train_prompts * alg.n_samples_per_prompt
        mini = alg.mini_batch_samples or samples
        return alg.epochs * (samples // mini)
