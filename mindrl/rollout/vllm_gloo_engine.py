"""The server side of mindrl's weight push: a vLLM weight-transfer backend over gloo.

vLLM 0.32's RL endpoints (`/init_weight_transfer_engine`, `/start_weight_update`,
`/update_weights`, `/finish_weight_update`; `VLLM_SERVER_DEV_MODE=1`) hand weights to a
pluggable backend, and every built-in one (NCCL, CUDA IPC, RDT) needs CUDA. This one joins a
gloo group with the trainer (`gloo_link`), admitted only with the trainer's token
(`weight_admission`), and receives each bucket as one byte broadcast,
then loads it through vLLM's layerwise reload, the same path `reload_weights` takes in the
in-process engine. `vllm_plugin.register` makes it `--weight-transfer-config
'{"backend": "mindrl_gloo"}'`. Imported only inside vLLM's processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from mindrl.rollout.gloo_link import broadcast_bytes, open_group, open_store
from mindrl.rollout.tied_head import refresh_tied_lm_head
from mindrl.rollout.vllm_plugin import BACKEND
from mindrl.rollout.weight_admission import WeightPeerRefused, announce, check_group
from mindrl.rollout.weight_wire import BucketLayout, unpack_bucket


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Where the trainer's store listens; the trainer is rank 0, this server's workers
    `rank_offset` + their global rank."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = 300.0
    token: str = field(default="", repr=False)  # the link's secret, sent only over HTTP


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: the layout of the bytes the trainer broadcasts next."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group: Any = None
        self._store: Any = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        rank = (
            init_info.rank_offset
            + parallel.data_parallel_index * parallel.world_size
            + parallel.rank
        )
        if not init_info.token:
            raise WeightPeerRefused(
                f"{BACKEND}: a join request without a token (an older mindrl, or not mindrl)"
            )
        self._store = open_store(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            master=False,
            timeout_s=init_info.timeout_s,
        )
        announce(self._store, init_info.token, rank, init_info.world_size, init_info.timeout_s)
        group = open_group(
            self._store, rank, init_info.world_size, init_info.master_address, init_info.timeout_s
        )
        check_group(group, init_info.token, rank, init_info.world_size)
        self._group = group

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_tied_lm_head(self.model)  # on CPU its packed copy would keep the old weights

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes the accelerator afterwards, which fails on a CPU build;
        # a gloo broadcast has finished when it returns
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError(
                f"{BACKEND}: no trainer connected (call /init_weight_transfer_engine first)"
            )
        layout = BucketLayout(update_info.names, update_info.dtype_names, update_info.shapes)
        flat = torch.empty(layout.nbytes(), dtype=torch.uint8)
        broadcast_bytes(self._group, flat)
        with torch.device(self.device):
            # vLLM types `model` as an nn.Module; its model classes define load_weights
            self.model.load_weights(unpack_bucket(layout, flat))  # type: ignore[operator]

    def shutdown(self) -> None:
        self._group = None
        self._store = None
