"""The public entry points.

- `spec`: `AttentionSpec`, the options of one attention call (causal, window, scale, dropout,
  soft-cap, precision), built once here and handed down to the launchers.
- `attention`: `flashlab.attention`, a drop-in for ``scaled_dot_product_attention``, and
  `MultiHeadAttention`.
- `ops`: the kernels as ``torch.library`` custom ops, so ``torch.compile`` and ``torch.export``
  see one node.
- `varlen`, `decode`: packed variable-length batches; decoding against a KV cache.
- `flash_attn_interface`: FlashAttention 2's function signatures over `attention`, `varlen`, `decode`.
- `pretune`: tuning ahead of training.

May import the reference code, the kernels and their launchers.
"""
