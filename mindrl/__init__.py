"""mindrl: GRPO post-training for LLMs on megatron-core, with Ray placement and vLLM rollout.

Importing the package is cheap: torch, megatron-core, Ray and vLLM are imported only by the
modules that need them.
"""

__version__ = "0.1.0"
