"""mindrl.rewards: rule rewards for GRPO.

verifier_table  the name -> verifier table and `register_verifier`
registry    lookups by name (`rl_config.verifier_function`), built-ins, custom verifier files
types       SampleMeta / RewardParams and the verifier contract
extraction  final-answer extraction and equivalence (also used to check dataset labels)
builtin     acc, accuracy, base_acc, format, strict_format, cosine, repetition, soft_overlong
pool        worker processes with per-call timeouts that survive hangs and crashes
scorer      RewardScorer: weighted sum of verifiers over a batch, with metrics

Nothing heavy is imported here: config validation imports `registry` alone.
"""
