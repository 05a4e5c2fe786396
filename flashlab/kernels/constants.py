"""Numbers the kernels and their launchers share, importable without Triton."""

LOG2E = 1.4426950408889634  # log2(e): exp(x) = 2^(x·log2 e); the kernels keep scores in base 2
