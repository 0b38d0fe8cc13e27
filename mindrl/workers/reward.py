"""The reward-model role (reward_config + reward_resource): an HF sequence-classification model scores
each prompt + response; one full replica per device, sequences split across replicas.

The reward model is read with transformers (`AutoModelForSequenceClassification`), so any HF
reward model with the policy's tokenizer works as is; it runs at TP = PP = 1 (validated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindrl.cluster.worker import Worker
from mindrl.config.errors import ConfigError
from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig

if TYPE_CHECKING:
    import torch

    from mindrl.data.batch import SampleBatch


class RewardWorker(Worker):
    def __init__(self, run: RunConfig):
        # refused here, before Ray has started the worker's model, with the key to set
        if run.reward is None:
            raise ConfigError(
                "reward_config: required by the reward-model worker (the run has none)"
            )
        if run.reward.ckpt.load is None:
            raise ConfigError("reward_config.load: required (the reward model's HF folder)")
        super().__init__()
        self.run = run
        self.cfg: RoleConfig = run.reward
        self.load: str = run.reward.ckpt.load
        self.model: Any = None
        self.device: Any = None

    def init_model(self) -> int:
        from transformers import AutoModelForSequenceClassification

        from mindrl.accelerator import get_accelerator
        from mindrl.models.dtypes import torch_dtype

        acc = get_accelerator(self.run.runtime.accelerator)
        self.device = acc.device(0)  # Ray narrows the visible devices to this worker's one
        dtype = torch_dtype(self.cfg.precision.params_dtype)
        model = AutoModelForSequenceClassification.from_pretrained(self.load, dtype=dtype)
        self.model = model.to(self.device)
        self.model.eval()
        return self.rank

    def compute_rm_score(self, batch: SampleBatch) -> torch.Tensor:
        """One scalar per sequence: the model's first logit at the last real token."""
        import torch

        scores = []
        mbs = self.cfg.batch.micro_batch_size
        with torch.no_grad():
            for start in range(0, batch.size, mbs):
                ids = batch.input_ids[start : start + mbs].to(self.device)
                mask = batch.attention_mask[start : start + mbs].to(self.device)
                head = getattr(self.model, "score", None)  # Llama/Qwen2/Mistral-style heads
                if head is not None:
                    # pool at the last attended token ourselves: HF pools at the last token that
                    # is not pad_token_id, which is wrong when EOS == pad ends the response
                    hidden = self.model.base_model(input_ids=ids, attention_mask=mask)[0]
                    last = mask.sum(-1) - 1
                    logits = head(hidden[torch.arange(ids.shape[0]), last])
                else:
                    logits = self.model(input_ids=ids, attention_mask=mask).logits
                scores.append(logits[:, 0].float().cpu())
        return torch.cat(scores)
