"""HF <-> megatron-core checkpoints (heavy imports stay inside the modules).

- `mapping`: one declarative table per family (llama, qwen2), read in both directions.
- `transforms`: the split rules (column, row, vocab, fused QKV, fused gate/up, replicated).
- `online`: `load_hf_into_mcore` (each rank reads its slices) and `export_mcore_to_hf`.
- `mcore_io`: `save_mcore_checkpoint` / `load_mcore_checkpoint` (dist_checkpointing, tracker,
  metadata JSON).
- `offline`: the converter's single-process conversions; `cli`: `cli/convert_ckpt.py`.
- `hf_io`, `atomic`, `errors` (`ConversionError`).
"""
