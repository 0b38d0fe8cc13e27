"""The whole run's typed config: roles, rl_config, generate_config and runtime."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fields import spec
from mindrl.config.generate import GenerateConfig
from mindrl.config.rl import RLConfig
from mindrl.config.role import RoleConfig


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the run executes (mindrl's own section; MindSpeed-RL has no equivalent)."""

    accelerator: str = spec("auto", choices=("auto", "npu", "cuda", "cpu"))
    output_dir: str | None = spec(None, help="metrics, logs, resolved config; default outputs/NAME")
    ray_address: str | None = spec(
        None, help="None: start an embedded Ray cluster; 'auto' or host:port: connect to one"
    )
    ray_num_cpus: int | None = spec(None, ge=1, help="CPUs of the embedded cluster")
    ray_dashboard: bool = False
    ray_dashboard_host: str = "127.0.0.1"
    master_addr: str = spec("127.0.0.1", help="torch.distributed rendezvous for one node")
    worker_timeout_s: float = spec(600.0, gt=0.0, help="a worker call longer than this fails")
    worker_threads: int | None = spec(
        None,
        ge=1,
        help="torch threads per worker; default: its bundle's CPUs. On a CPU box "
        "roles that run one after another may each use every core",
    )


@dataclass(frozen=True)
class RunConfig:
    config_name: str
    actor: RoleConfig
    ref: RoleConfig | None
    reward: RoleConfig | None
    rl: RLConfig
    generate: GenerateConfig
    runtime: RuntimeConfig

    @property
    def roles(self) -> list[RoleConfig]:
        return [r for r in (self.actor, self.ref, self.reward) if r is not None]

    @property
    def output_dir(self) -> str:
        return self.runtime.output_dir or f"outputs/{self.config_name}"
