"""What the notebooks teach with, beside the package's working parts: the teaching kernels and
the models of memory, traffic and number formats.

- `vector_add`, `triton_basics`: a first Triton kernel; Triton's programming model on S = QKᵀ by
  tiles (notebooks 00 and 05).
- `fused_softmax`: a fused row-softmax kernel (notebook 02).
- `flash_minimal`: the smallest complete flash-attention forward and backward kernels, shown
  whole in notebooks 05 and 06.
- `tiled_kernels`: `tiled_kernel_attention`, the tiled kernels of notebooks 05 and 06 called
  directly (forward and, for gradients, backward), for the notebooks' checks.
- `memory`, `traffic`: the memory model of naive attention and the HBM traffic of each step
  (notebooks 01-03, 10); `roofline`: those steps placed on a roofline (notebook 02).
- `number_formats`: fp32, tf32, fp16 and bf16 rounding and range (notebook 08).
- `instrument`, `widgets`: tile counters and the notebooks' interactive figures.
- `kernel_source`: the lines a feature adds to a kernel, for the notebooks to print.
- `mbarrier_ring`: a model of a Hopper kernel's K/V ring and its mbarrier phases (notebook 11, exercise 11).

May import the reference code, the kernels, their launchers and the API; never the trainer,
the benchmarks or the command line.
"""
