"""Imported once by the multiprocessing forkserver: verifier workers then fork with the
built-ins registered and math_verify warm, so replacing a killed worker costs milliseconds
instead of a fresh sympy import (about a second)."""

from mindrl.rewards import builtin  # noqa: F401  (registers the built-in verifiers)
from mindrl.rewards.extraction import warmup

warmup()
