"""Shared test fixtures: fresh random inputs every run, with the seed printed so a
failure can be replayed (``FLASHLAB_SEED=<seed> pytest ...``)."""

import os
import random

import pytest
import torch

# flashlab sets nothing process-wide (no TRITON_INTERPRET): a kernel launched on CPU tensors
# through flashlab.launch.runtime.kernel_for runs as an interpreted twin, chosen per call, and the root
# conftest.py's `exercise` fixture hands the exercise tests a module whose @triton.jit kernels
# are already those twins. Any import order works: this import is left from when flashlab
# switched the interpreter on at import.
import flashlab  # noqa: F401


@pytest.fixture(autouse=True)
def seed():
    """A fresh seed per test (or FLASHLAB_SEED), printed; pytest shows it on failure."""
    value = int(os.environ.get("FLASHLAB_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"seed={value}")
    return value


@pytest.fixture(autouse=True)
def float32_matmul_precision():
    """Each test starts from, and leaves, the process's float32 matmul precision as it found it. A library
    that sets it leaks into every later test: RL4COTrainer sets "medium" by default, and on a CPU with
    bf16 matrix units (an Intel Xeon with AMX) fp32 matmuls then run in bf16 (relative errors near 3e-3
    where the tests expect float32's 1e-5), while on CPUs without them nothing changes."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)
