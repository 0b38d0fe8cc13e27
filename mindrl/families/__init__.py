"""One home per model family: each family mindrl builds is one module here (`llama`, `qwen2`,
`qwen3`, `qwen3_moe`, `qwen2_moe`, `deepseek_v3`) holding its names, features, mapping table and HF config hooks, and the
families it only refuses are listed in `unbuilt`; all of them sit in one registry
(`registry`) that the config layer, the model builder, the converter, the weight sync and the
assets read.

The package sits below `mindrl.config` (which validates `model_type_hf` against it) and imports
neither torch nor any other mindrl package. A family defined outside mindrl joins with
`register_family(FamilySpec(...))`.
"""

from __future__ import annotations

from mindrl.families.deepseek_v3 import DEEPSEEK_V3
from mindrl.families.llama import LLAMA
from mindrl.families.qwen2 import QWEN2
from mindrl.families.qwen2_moe import QWEN2_MOE
from mindrl.families.qwen3 import QWEN3
from mindrl.families.qwen3_moe import QWEN3_MOE
from mindrl.families.registry import register_family, register_unbuilt, unregister_family
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilyConfigError, FamilySpec, Features, UnbuiltFamily
from mindrl.families.unbuilt import UNBUILT

__all__ = [
    "FamilyConfigError",
    "FamilySpec",
    "Features",
    "ParamRule",
    "Split",
    "UnbuiltFamily",
    "register_family",
    "register_unbuilt",
    "unregister_family",
]

for _spec in (LLAMA, QWEN2, QWEN3, QWEN3_MOE, QWEN2_MOE, DEEPSEEK_V3):
    register_family(_spec)
for _unbuilt in UNBUILT:
    register_unbuilt(_unbuilt)
