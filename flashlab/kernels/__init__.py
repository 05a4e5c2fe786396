"""The Triton kernels, and nothing else: every ``@triton.jit`` function of the package.

- `tile`: the rules every kernel family shares, written once: scores and their scale, masks
  (causal, window, a mask tensor, ragged ends), soft-capping, dropout, the online-softmax update,
  the log-sum-exp, TF32 rounding.
- `dense`: the course's tiled forward and backward (notebooks 05 and 06).
- `small`: one-tile forward and one-launch backward for sequences whose keys fit one tile.
- `hopper`: the dense kernels specialised for sm_90 (tensor descriptors, folded scale).
- `varlen`: packed sequences of different lengths (``cu_seqlens``), sliding windows.
- `decode`: few queries against a long, possibly paged, KV cache (split-KV and its merge).

Imports nothing of flashlab outside this folder: a kernel's arguments are plain tensors,
numbers and compile-time flags, set by `flashlab.launch`.
"""
