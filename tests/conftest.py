"""Shared test fixtures: fresh random inputs every run, with the seed printed so a
failure can be replayed (``FLASHLAB_SEED=<seed> pytest ...``)."""

import os
import random

import pytest
import torch

# before any test module imports triton: flashlab turns on Triton's interpreter on a CPU-only
# machine, and triton.language's own jit functions must be created after that
import flashlab  # noqa: F401


@pytest.fixture(autouse=True)
def seed():
    """A fresh seed per test (or FLASHLAB_SEED), printed; pytest shows it on failure."""
    value = int(os.environ.get("FLASHLAB_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"seed={value}")
    return value
