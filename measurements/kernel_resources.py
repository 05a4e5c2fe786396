"""GPU report (issue 5, "what limits each miss"): registers per thread, register spills and
shared memory of every compiled flashlab kernel, for every autotuning candidate at
D = 64 and 128, causal and full, bf16, forward and backward (B·N = 16384, H = 16, N = 4096),
and which candidate the autotuner chose. Spills or a shared-memory
footprint that caps occupancy at one block per SM are the first suspects when a kernel
trails cuDNN.

    python -m measurements.kernel_resources OUT.json
"""

import json
import sys

import torch

import flashlab.kernels.dense as kernels
from flashlab import attention
from flashlab.bench.records import environment
from flashlab.launch import autotune

NAMES = ["flash_forward_kernel", "flash_backward_preprocess_kernel", "flash_backward_dkdv_kernel",
         "flash_backward_dq_kernel"]


def capture():
    """Wrap each kernel's launcher so the compiled kernel it returns is recorded."""
    seen = []
    for name in NAMES:
        jit = getattr(kernels, name)
        launch = jit.run

        def run(*args, _launch=launch, _name=name, **kwargs):
            compiled = _launch(*args, **kwargs)
            seen.append((_name, kwargs, compiled))
            return compiled
        jit.run = run
    return seen


def main(path):
    autotune.tuner.cache_path = ""     # tune (compile every candidate) even where choices were stored
    seen = capture()
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            seen.clear()
            attention(q, k, v, is_causal=causal).sum().backward()
            done = set()
            for name, kwargs, compiled in seen:
                meta = {key: kwargs[key] for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages") if key in kwargs}
                if (name, tuple(meta.items())) in done:
                    continue
                done.add((name, tuple(meta.items())))
                rows.append({"kernel": name, "D": d, "causal": causal, **meta,
                             "registers": getattr(compiled, "n_regs", None),
                             "spills": getattr(compiled, "n_spills", None),
                             "shared_bytes": getattr(getattr(compiled, "metadata", None), "shared", None)})
                print(rows[-1], flush=True)
    json.dump({"environment": environment(), "rows": rows, "autotune": autotune.tuner.report()},
              open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
