"""mindrl.rewards: rule rewards for GRPO.

verifier_table  the name -> verifier table and `register_verifier`
registry    lookups by name (`rl_config.verifier_function`), built-ins, custom verifier files
types       SampleMeta / RewardParams and the verifier contract
extraction  final-answer extraction and equivalence (also used to check dataset labels)
builtin     lenient_acc (alias accuracy), cosine, repetition, soft_overlong; loads:
mindspeed_verifiers  MindSpeed-RL's names and values: acc, base_acc, format, strict_format, step,
            math_17k_acc, acc_for_ppo, acc_for_dapo, math_verify_reward; their graders:
            math_eval_answer / math_eval_equal (+ math_eval_units, number_words) for acc,
            boxed_grader (+ latex_text) for the boxed ones, minerva_answer for acc_for_dapo,
            sympy_safe (sympy parsing that never runs model output)
pool        worker processes with per-call timeouts that survive hangs and crashes
scorer      RewardScorer: weighted sum of verifiers over a batch, with metrics

Nothing heavy is imported here: config validation imports `registry` alone.
"""
