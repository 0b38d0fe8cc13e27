"""mindrl.data: prompt templates, preprocessing into a tokenized store, the prompt dataset.

- ``templates``: ``configs/model/templates.json`` loading and rendering;
- ``config``: the typed ``configs/datasets/NAME.yaml`` (``PreprocessConfig``); ``compose``
  loads it with overrides and checks it against the handlers (``load_preprocess_config``);
- ``readers`` / ``handlers`` / ``answers``: raw rows -> validated (question, label);
- ``preprocess``: the run (``run_preprocess``) and its report; ``store``: the on-disk format;
- ``dataset`` / ``sampler``: ``PromptDataset`` and ``ResumableSampler`` for the trainer.
"""

from mindrl.data.dataset import PromptDataset, PromptRecord
from mindrl.data.sampler import ResumableSampler

__all__ = ["PromptDataset", "PromptRecord", "ResumableSampler"]
