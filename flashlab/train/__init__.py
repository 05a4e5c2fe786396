"""The trainer and what it trains.

- `trainer`: the training loop (precision modes, GradScaler, clipping, accumulation, activation
  checkpointing, DDP, resume), `RecallConfig` and `RunConfig`.
- `config`: option checking shared by the configs and the command line.
- `checkpoint`: atomic writes and ``weights_only`` loads.
- `mixed_precision`: the precision modes.
- `model`, `tasks`: the causal transformer and associative recall.
- `generate`: greedy generation with the causal transformer against a paged KV cache, through
  FlashAttention's ``flash_attn_with_kvcache`` (`flashlab.flash_attn_interface`).
- `packing`, `documents`: packed variable-length documents.
- `tsp`, `tsp_train`: the TSP Attention Model (Kool et al. 2019), its inference that spends
  compute for quality (multi-start, ×8 augmentation, sampling) and its REINFORCE training.

May import the reference code, the launchers and the API.
"""
