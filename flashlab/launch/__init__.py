"""How the kernels are run: where (compiled or interpreted), with which tiles, and with which
arguments.

- `runtime`: compiled kernels for CUDA tensors, Triton's interpreter for CPU ones, per call.
- `switches`: every ``FLASHLAB_*`` environment switch, read in one place.
- `dispatch`: which kernel family a call takes (small, Hopper, dense).
- `dense`, `small`, `hopper`: each family's grids, strides and launch; `direct` skips Triton's
  per-call Python for a signature seen before.
- `autotune`, `autotune_cache`, `tuned/`: candidate tiles per GPU, the tuner, its on-disk cache
  and the decisions shipped for the course's GPUs.
- `layouts`: output layouts and packed q/k/v views; `interpreter_notice`: the one-time notice
  when the interpreter runs many tiles; `timing`: the package's timer and FLOP counts.

May import the reference code and the kernels.
"""
