"""megatron-core model side of mindrl (heavy imports stay inside the modules).

- `hf_arch`: HF config.json <-> `ModelArchConfig` (`arch_from_hf_config`, `hf_config_from_arch`).
- `parallel`: torch.distributed + megatron parallel_state set-up / tear-down
  (`init_parallel`, `parallel_info`, `tp_rank_size`, `destroy_parallel`).
- `gpt`: GPTModel from a `ModelArchConfig` at the current TP/PP (`build_gpt_model`,
  `transformer_config_from_arch`, `validate_parallel_layout`).
- `logprobs`: vocab-parallel per-token log-probs and entropy, masks and positions
  (`vocab_parallel_log_probs`, `vocab_parallel_entropy`, `scored_log_probs`,
  `causal_attention_mask`); `forward_pass` the no-gradient pass through megatron's pipeline
  schedule (`forward_only`).
- `dtypes`: the one table of dtype names (`torch_dtype`, `dtype_short_name`, `dtype_long_name`).
"""
