"""Choosing the kernels' block sizes: candidate configurations per GPU generation, and an
autotuner that times them on the first call of each kind of shape and keeps the fastest.

A configuration is (BLOCK_M, BLOCK_N, num_warps, num_stages):
    BLOCK_M × BLOCK_N   the score tile one program computes per step (queries × keys);
    num_warps           threads per program / 32;
    num_stages          how many K/V (or Q/dO) tiles are in flight at once: Triton's
                        software pipeline prefetches stage s+1 while stage s computes.
Bigger tiles reuse each loaded byte more (fewer trips to HBM per FLOP) but need more
registers and shared memory; the best point depends on the GPU, D, causal and N, so it
is measured, not guessed. What the tuner picks for which shapes on an H200 is recorded in
``results/h200/attention.json`` under "autotune".

    forward   one program per query block (BLOCK_M queries), streaming key blocks of BLOCK_N
    dkdv      one program per key block (BLOCK_N keys), streaming query blocks of BLOCK_M
    dq        one program per query block (BLOCK_M queries), streaming key blocks of BLOCK_N

Under Triton's interpreter (CPU) there is one small configuration and no tuning: timing
the interpreter says nothing about a GPU. Set FLASHLAB_AUTOTUNE=0 to use each list's first
(default) configuration on a GPU too. Decisions are kept in ~/.cache/flashlab/autotune.json
(FLASHLAB_AUTOTUNE_CACHE sets another file, "" none), per GPU model, Triton version and
kernel source, so only the first process on a machine pays for tuning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # dK/dV only: whether unmasked tiles take the unchecked fast path. Compiling both paths
    # into one kernel costs registers, and at D = 128 the kernel already spills
    # (results/h200/kernel_resources.json), so the tuner tries it both ways.
    fast_path: bool = True

    def kwargs(self) -> dict:
        """As the kernels' launch takes them (FAST_PATH is added by the dK/dV launch)."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "num_warps": self.num_warps,
                "num_stages": self.num_stages}

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}" + ("" if self.fast_path else
                                                                                        " checked")


KERNELS = ("forward", "dkdv", "dq")
INTERPRETER = Config(32, 32, 4, 1)   # the interpreter's cost grows with programs × tile work: small tiles

# Hopper (H100/H200, sm_90): 228 KB shared memory per SM, so 3-4 pipeline stages of
# 128-wide tiles fit. Each list starts with the configuration measured best on an H200 before
# autotuning existed (the default when tuning is off). dK/dV keeps BLOCK_M ≥ BLOCK_N when
# pipelined: BLOCK_M < BLOCK_N with 2 stages gave dK errors of 1-9% on an H200 with Triton
# 3.6 (python -m measurements.probe_dk). tests/test_attention.py checks every candidate on a GPU.
_HOPPER = {
    "forward": {64: [Config(128, 64, 4, 3), Config(128, 128, 8, 3), Config(128, 64, 4, 4), Config(128, 128, 4, 3),
                     Config(64, 64, 4, 4)],
                128: [Config(128, 64, 8, 3), Config(128, 128, 8, 3), Config(128, 64, 4, 3), Config(128, 32, 4, 3),
                      Config(64, 64, 4, 3)],
                256: [Config(64, 32, 4, 2), Config(64, 64, 4, 2), Config(128, 32, 8, 2), Config(64, 64, 8, 2)]},
    "dkdv": {128: [Config(64, 64, 4, 2), Config(64, 64, 4, 2, fast_path=False), Config(64, 64, 8, 2),
                   Config(64, 64, 4, 3), Config(128, 128, 8, 2), Config(128, 128, 8, 1),
                   # no register spills at D = 128 when compiled for sm_90 (python -m measurements.kernel_resources_aot;
                   # 64x64 w4 spills 376-648 bytes a thread); not yet timed on a GPU
                   Config(32, 32, 4, 2), Config(128, 32, 8, 2), Config(64, 32, 4, 3, fast_path=False)],
             256: [Config(32, 32, 4, 1), Config(64, 64, 4, 1), Config(32, 32, 4, 2)]},
    "dq": {128: [Config(64, 64, 4, 2), Config(128, 64, 8, 2), Config(64, 64, 4, 3), Config(128, 128, 8, 2)],
           256: [Config(32, 32, 4, 1), Config(64, 32, 4, 1), Config(64, 64, 4, 1)]},
}
# Ampere and Ada (sm_80-89: A100 164 KB, RTX 30/40 99 KB of shared memory per SM): the
# FlashAttention-2 paper's shapes with fewer stages. Not measured here (no such GPU):
# sane defaults that the tuner narrows down on the reader's card.
_AMPERE = {
    "forward": {64: [Config(128, 64, 4, 2), Config(64, 64, 4, 2), Config(128, 32, 4, 2)],
                128: [Config(128, 32, 4, 2), Config(64, 64, 4, 2), Config(128, 64, 8, 2)],
                256: [Config(64, 32, 4, 1), Config(32, 32, 4, 1)]},
    "dkdv": {128: [Config(64, 64, 4, 1), Config(32, 32, 4, 1), Config(64, 64, 8, 2)],
             256: [Config(32, 32, 4, 1)]},
    "dq": {128: [Config(64, 64, 4, 1), Config(32, 32, 4, 1), Config(64, 64, 8, 2)],
           256: [Config(32, 32, 4, 1)]},
}


def generation(capability: tuple[int, int] | None) -> str:
    """'interpreter' (no GPU), 'hopper' or 'ampere' (the rest: Ampere, Ada, consumer Blackwell).
    Data-centre Blackwell (sm_100) gets the Hopper list: the same 228 KB of shared memory per SM
    (unmeasured: the course's GPU is an H200)."""
    if capability is None:
        return "interpreter"
    return "hopper" if capability[0] in (9, 10) else "ampere"


def candidates(kernel: str, head_dim: int, capability: tuple[int, int] | None) -> list[Config]:
    """The configurations the tuner tries for ``kernel`` at this head dimension, default first.
    ``capability`` is torch.cuda.get_device_capability(), or None under the interpreter."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if generation(capability) == "interpreter":
        return [INTERPRETER]
    table = (_HOPPER if generation(capability) == "hopper" else _AMPERE)[kernel]
    bound = next(d for d in sorted(table) if head_dim <= d or d == max(table))
    return list(table[bound])


_forced: dict[str, Config] = {}


@contextlib.contextmanager
def force(**configs: Config):
    """Run the kernels with these configurations, e.g. ``force(forward=Config(16, 32, 4, 1))``
    (tests of unusual tile shapes, and the GPU test of every candidate)."""
    unknown = set(configs) - set(KERNELS)
    if unknown:
        raise ValueError(f"force: unknown kernels {sorted(unknown)}; expected some of {KERNELS}")
    saved = dict(_forced)
    _forced.update(configs)
    try:
        yield
    finally:
        _forced.clear()
        _forced.update(saved)


def enabled() -> bool:
    return os.environ.get("FLASHLAB_AUTOTUNE", "1") != "0"


def _bucket(n: int) -> int:
    """Shapes share a tuning result within a power of two (as Triton's own autotuner keys do)."""
    return 1 << max(0, int(n) - 1).bit_length()


def shape_key(kernel, q, k, is_causal, has_mask, dropout) -> tuple:
    """What a tuning result is remembered under: everything that changes the compiled kernel or
    the amount of work per program (dtype, D, masks, GQA group) and N, Nk, B·H bucketed.
    Built on every call, so kept cheap (no string formatting: small shapes are launch-bound)."""
    B, H, n_q, head_dim = q.shape
    return (kernel, q.device, q.dtype, head_dim, bool(is_causal), bool(has_mask), bool(dropout),
            H // k.shape[1], _bucket(n_q), _bucket(k.shape[2]), _bucket(B * H))


class Autotuner:
    """Times every candidate once per shape key and remembers the fastest (the default unless
    another is at least 3% faster).

    ``launch(config)`` runs the kernel with that configuration and returns its outputs; each
    candidate's outputs must agree with the default (first) configuration's within
    ``tolerance`` (normwise relative error, by output dtype) or it is rejected, so a
    configuration the compiler gets wrong is never chosen. Two correct bf16 configurations
    differ by at most the sum of their errors (each ≤ 2.4e-3 vs float64 on an H200); the
    wrong dK tiles above were 1-9% off."""

    TOLERANCE = {"torch.bfloat16": 6e-3, "torch.float16": 3e-3, "torch.float32": 3e-3}   # fp32: TF32 products

    # A candidate must beat the default by this factor to replace it: candidates often differ
    # by 1-3%, about the run-to-run noise of a timing on a busy GPU (measured on an H200: a
    # choice made on a 1% lead was 12% slower than the default in the benchmark that followed).
    MARGIN = 0.97

    def __init__(self, bench=None, cache_path: str | None = None):
        """``cache_path``: a JSON file that keeps decisions across processes (a new process
        would otherwise re-time every shape on first use). None: FLASHLAB_AUTOTUNE_CACHE, else
        ~/.cache/flashlab/autotune.json; "" keeps decisions in memory only."""
        self.bench = bench or _do_bench
        self.best: dict[tuple, Config] = {}
        self.log: list[dict] = []
        if cache_path is None:
            cache_path = os.environ.get("FLASHLAB_AUTOTUNE_CACHE",
                                        os.path.join(os.path.expanduser("~"), ".cache", "flashlab", "autotune.json"))
        self.cache_path = cache_path
        self._disk: dict[str, str] | None = None      # read on first need

    def choose(self, key: tuple, configs: list[Config], launch) -> Config:
        kernel = key[0]
        if kernel in _forced:
            return _forced[kernel]
        if len(configs) == 1 or not enabled():
            return configs[0]
        if key in self.best:
            return self.best[key]
        stored = self._stored(key, configs)
        if stored is not None:
            self.best[key] = stored
            self.log.append({"key": _printable(key), "chosen": str(stored), "from_cache": self.cache_path})
            return stored
        reference, times, rejected = None, {}, {}
        for config in configs:
            try:
                outputs = [t.clone() for t in launch(config)]
            except Exception as exc:              # e.g. triton OutOfResources: too much shared memory
                rejected[str(config)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                continue
            if reference is None:
                reference = outputs
            else:
                error = max(_rel_error(a, b) for a, b in zip(outputs, reference))
                if not error <= self.TOLERANCE.get(str(outputs[0].dtype), 3e-3):
                    rejected[str(config)] = f"disagrees with {configs[0]}: relative error {error:.2e}"
                    continue
            times[config] = self.bench(lambda config=config: launch(config))
        if not times:
            raise RuntimeError(f"no configuration of the {kernel} kernel ran for {key}: {rejected}")
        best = min(times, key=times.get)
        if configs[0] in times and times[best] > self.MARGIN * times[configs[0]]:
            best = configs[0]
        self.best[key] = best
        self.log.append({"key": _printable(key), "chosen": str(best), "ms": {str(c): t for c, t in times.items()},
                         "rejected": rejected})
        self._store(key, best)
        return best

    # -- decisions kept on disk ----------------------------------------------------------------
    # An entry is valid only for the same GPU model, Triton version and kernel source: any of
    # them changes what is fast, and a kernel edit could make a stored choice wrong.

    def _disk_key(self, key: tuple) -> str:
        device = key[1]
        gpu = _gpu_name(device) if getattr(device, "type", "cpu") == "cuda" else str(device)
        parts = [gpu, f"triton {_triton_version()}", f"kernels {_kernel_source_hash()}", *map(str, key[:1]),
                 *map(str, key[2:])]
        return " | ".join(parts)

    def _stored(self, key: tuple, configs: list[Config]) -> Config | None:
        if not self.cache_path:
            return None
        if self._disk is None:
            try:
                with open(self.cache_path) as f:
                    self._disk = json.load(f)
            except (OSError, ValueError):             # no file yet, or unreadable: start afresh
                self._disk = {}
        name = self._disk.get(self._disk_key(key))
        return next((c for c in configs if str(c) == name), None)   # a dropped candidate is re-tuned

    def _store(self, key: tuple, config: Config) -> None:
        if not self.cache_path:
            return
        self._disk = self._disk or {}
        self._disk[self._disk_key(key)] = str(config)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.cache_path)), exist_ok=True)
            partial = f"{self.cache_path}.{os.getpid()}.tmp"
            with open(partial, "w") as f:
                json.dump(self._disk, f, indent=0, sort_keys=True)
            os.replace(partial, self.cache_path)      # atomic: concurrent processes never see half a file
        except OSError:
            pass                                      # a read-only home: keep the decision in memory

    def report(self) -> list[dict]:
        """Every tuning decision so far: the key, the chosen config, and each candidate's time
        (or, for a decision read from the cache file, that file)."""
        return list(self.log)


def _printable(key: tuple) -> list:
    return [part if isinstance(part, (int, bool)) else str(part) for part in key]


@functools.cache
def _gpu_name(device) -> str:
    import torch
    return torch.cuda.get_device_name(device)


@functools.cache
def _triton_version() -> str:
    import triton
    return triton.__version__


@functools.cache
def _kernel_source_hash() -> str:
    path = os.path.join(os.path.dirname(__file__), "flash_triton.py")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def _rel_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ over the finite entries, on the outputs' device. (flashlab.rel_error copies
    to the CPU in float64, too slow for the outputs of every candidate, and gives NaN for the
    +inf log-sum-exp of rows with no key, which two correct configurations share.)"""
    a, b = a.float(), b.float()
    finite = a.isfinite() & b.isfinite()
    if not bool(((a == b) | finite).all()):      # inf where the default has inf is fine (empty rows' L)
        return float("inf")
    a, b = a[finite], b[finite]
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _do_bench(fn) -> float:
    from .timing import time_ms  # the benchmarks' own timer: do_bench medians on a GPU
    return time_ms(fn, "cuda", warmup_ms=10, rep_ms=50)


tuner = Autotuner()
